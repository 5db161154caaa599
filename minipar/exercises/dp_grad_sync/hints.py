"""Hints for dp_grad_sync, one level at a time (``minipar exercise hint dp_grad_sync``)."""

HINTS = (
    """Two steps: weight, then sum.  Your x is the mean over YOUR rows; the global
mean over all rows weighs each rank by its share of the batch.  Then every rank
needs the same sum of the weighted gradients: a ring all-reduce, written by
you (the exercise ring_allreduce, with its own hints).""",
    """The weight is rows / batch, not 1/N: with 10 rows on 3 ranks the shares are
4/10, 3/10, 3/10.  Make a new array, y = x * (rows / batch): x stays as it
was.  Then split y with np.array_split(y, N) and sum it over the ranks with
N-1 reduce-scatter steps and N-1 all-gather steps of comm.Sendrecv.""",
    """The ring, step by step (right = (r + 1) % N, left = (r - 1) % N):
    reduce-scatter, s = 0 .. N-2: send chunks[(r - s) % N] to the right,
        receive into buf = np.empty_like(chunks[(r - s - 1) % N]) from the left,
        chunks[(r - s - 1) % N] += buf
    all-gather, s = 0 .. N-2: send chunks[(r + 1 - s) % N] to the right,
        receive from the left straight into chunks[(r - s) % N]
Return y.""",
)
