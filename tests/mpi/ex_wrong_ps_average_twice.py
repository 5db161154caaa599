"""Wrong on purpose: the server averages each gradient on arrival, then averages the sum again."""

import numpy as np


def ps_sync_step(comm, x, params, state, lr=0.1, momentum=0.9):
    n, r = comm.Get_size(), comm.Get_rank()
    if r != 0:
        comm.Send(x, dest=0)
        new = np.empty_like(params)
        comm.Recv(new, source=0)
        return new
    w = n - 1
    total = np.zeros_like(params)
    buf = np.empty_like(params)
    for src in range(1, n):
        comm.Recv(buf, source=src)
        total += buf / w  # averaged here ...
    state["v"] *= momentum
    state["v"] += total / w  # ... and again here
    new = params - lr * state["v"]
    for dst in range(1, n):
        comm.Send(new, dest=dst)
    return new
