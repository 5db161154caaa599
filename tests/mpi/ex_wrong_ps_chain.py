"""Wrong on purpose: the gradients travel along a chain of workers (N-1 -> ... -> 1 -> 0)."""

import numpy as np


def ps_sync_step(comm, x, params, state, lr=0.1, momentum=0.9):
    n, r = comm.Get_size(), comm.Get_rank()
    total = x.copy()
    if r < n - 1:
        buf = np.empty_like(x)
        comm.Recv(buf, source=r + 1)
        total += buf
    if r > 0:
        comm.Send(total, dest=r - 1)
        new = np.empty_like(params)
        comm.Recv(new, source=0)
        return new
    state["v"] *= momentum
    state["v"] += total / (n - 1)
    new = params - lr * state["v"]
    for dst in range(1, n):
        comm.Send(new, dest=dst)
    return new
