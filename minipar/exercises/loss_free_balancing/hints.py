"""Hints for loss_free_balancing, one level at a time (``minipar exercise hint loss_free_balancing``)."""

HINTS = (
    """Three things, in this order: which experts (the bias counts), how much of each (the
bias does not count), and the bias of the next step (every rank's tokens count).
Only the last needs the other ranks.""",
    """The choice: the k largest of s + b per token, ties to the lower index
(np.argsort of the negated key, kind="stable").  The gates: the chosen s, divided by
their sum.  The loads: how many of the step's top-k choices each expert got, summed
over the ranks; then b_i + u·sign(mean load − load_i), np.sign(0) = 0.""",
    """Step by step:
    order = np.argsort(-(x + bias), axis=1, kind="stable")[:, :top_k]
    chosen = np.take_along_axis(x, order, axis=1)
    gates = chosen / chosen.sum(axis=1, keepdims=True)
    local = np.bincount(order.reshape(-1), minlength=E).astype(np.float64)
    loads = allreduce(comm, local)
    return pack(order, gates, bias + rate * np.sign(loads.mean() - loads))""",
)
