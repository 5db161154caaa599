"""Wrong on purpose: the server sends back the averaged gradient; workers step without momentum."""

import numpy as np


def ps_sync_step(comm, x, params, state, lr=0.1, momentum=0.9):
    n, r = comm.Get_size(), comm.Get_rank()
    if r != 0:
        comm.Send(x, dest=0)
        g = np.empty_like(params)
        comm.Recv(g, source=0)  # the mean gradient, not the parameters
        return params - lr * g
    total = np.zeros_like(params)
    buf = np.empty_like(params)
    for src in range(1, n):
        comm.Recv(buf, source=src)
        total += buf
    g = total / (n - 1)
    state["v"] *= momentum
    state["v"] += g
    for dst in range(1, n):
        comm.Send(g, dest=dst)
    return params - lr * state["v"]
