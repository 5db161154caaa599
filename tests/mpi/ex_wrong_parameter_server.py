"""Wrong on purpose: gather everything to rank 0, add there, send the sum back."""

import numpy as np


def ring_allreduce(comm, x):
    n, r = comm.Get_size(), comm.Get_rank()
    if r != 0:
        comm.Send(x, dest=0)
        out = np.empty_like(x)
        comm.Recv(out, source=0)
        return out
    out = x.copy()
    buf = np.empty_like(x)
    for src in range(1, n):
        comm.Recv(buf, source=src)
        out += buf
    for dst in range(1, n):
        comm.Send(out, dest=dst)
    return out
