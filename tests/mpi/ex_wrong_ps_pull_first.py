"""Wrong on purpose: the server sends the parameters before it has received the gradients."""

import numpy as np


def ps_sync_step(comm, x, params, state, lr=0.1, momentum=0.9):
    n, r = comm.Get_size(), comm.Get_rank()
    if r != 0:
        new = np.empty_like(params)
        comm.Recv(new, source=0)  # pull first: the old parameters
        comm.Send(x, dest=0)
        return new
    for w in range(1, n):
        comm.Send(params, dest=w)  # before the update
    total = np.zeros_like(params)
    buf = np.empty_like(params)
    for w in range(1, n):
        comm.Recv(buf, source=w)
        total += buf
    state["v"] *= momentum
    state["v"] += total / (n - 1)
    return params - lr * state["v"]
