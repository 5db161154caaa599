"""Hints for ring_allreduce, one level at a time (``minipar exercise hint ring_allreduce``)."""

HINTS = (
    """Two phases on the same ring, each N-1 steps of one comm.Sendrecv (send right,
receive left in one call: no deadlock).  Work on y = x.copy() split into
chunks = np.array_split(y, N); the chunks are views, so writing into a chunk
writes into y, and y is what you return.""",
    """Reduce-scatter: at every step each rank sends ONE chunk to the right and adds
the chunk that arrives from the left into its own copy of that chunk.  Shift
the chunk index by one each step, so that a partial sum travels around the
ring collecting one more rank's contribution per hop.  After N-1 steps every
rank holds one complete chunk.  The receive buffer must be the size of the
chunk that arrives (np.empty_like(that chunk)), not of the one you send.""",
    """The indices.  Reduce-scatter, step s = 0 .. N-2:
    send chunks[(r - s) % N] to (r + 1) % N,
    receive from (r - 1) % N into buf = np.empty_like(chunks[(r - s - 1) % N]),
    chunks[(r - s - 1) % N] += buf.
Rank r now holds the complete sum of chunk (r + 1) % N.
All-gather, step s = 0 .. N-2:
    send chunks[(r + 1 - s) % N] to the right,
    receive from the left straight into chunks[(r - s) % N].
Example, N = 3, the chunk each rank sends in the reduce-scatter:
           step 0   step 1
    rank 0:  0        2
    rank 1:  1        0
    rank 2:  2        1""",
)
