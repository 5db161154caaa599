"""Hints for zero1_step, one level at a time (``minipar exercise hint zero1_step``)."""

HINTS = (
    """Three phases: reduce-scatter the gradient (rank r ends with the SUM of its own
slice r only; divide by N for the mean), step AdamW on slice r with the m, v
you hold, then all-gather the updated slices.  No all-reduce: that would send
the gradient's other slices to ranks that have no moments to use them with.""",
    """Slice r = np.array_split(...)[r].  The reduce-scatter is a ring of N-1
Sendrecv steps whose chunk index is chosen so that after the last step the
complete sum lands in chunk r (one index earlier than in ring_allreduce,
where it lands in chunk r + 1).  AdamW: state["t"] += 1, decay p_r, update
m and v IN PLACE (m *= b1; m += (1 - b1) * g), bias-correct, step.""",
    """The indices.  Reduce-scatter, s = 0 .. N-2: send g[(r - s - 1) % N] to the
right, receive into buf = np.empty_like(g[(r - s - 2) % N]) from the left,
g[(r - s - 2) % N] += buf.  Then mean = g[r] / N.
AdamW on p[r]:  p[r] *= 1 - lr * weight_decay
                m *= b1; m += (1 - b1) * mean;  v *= b2; v += (1 - b2) * mean**2
                p[r] -= (lr / (1 - b1**t)) * m / (np.sqrt(v / (1 - b2**t)) + eps)
All-gather, s = 0 .. N-2: send p[(r - s) % N] to the right, receive from the
left into p[(r - s - 1) % N].  Return np.concatenate(p).""",
)
