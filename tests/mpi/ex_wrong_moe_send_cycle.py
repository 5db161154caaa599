"""Wrong on purpose: every rank first Sends its blocks to everyone, then Receives (deadlock)."""

import numpy as np


def moe_dispatch_combine(comm, x, expert):
    n, r = comm.Get_size(), comm.Get_rank()
    E, C, d = x.shape
    k = E // n
    got = [np.empty((k, C, d)) for _ in range(n)]
    got[r][:] = x[r * k:(r + 1) * k]
    for s in range(n):
        if s != r:
            comm.Send(x[s * k:(s + 1) * k], dest=s)  # large blocks: waits for the Recv
    for s in range(n):
        if s != r:
            comm.Recv(got[s], source=s)
    done = [np.empty_like(g) for g in got]
    for i in range(k):
        y = expert(r * k + i, np.concatenate([g[i] for g in got]))
        for s in range(n):
            done[s][i] = y[s * C:(s + 1) * C]
    out = np.empty_like(x)
    out[r * k:(r + 1) * k] = done[r]
    for s in range(n):
        if s != r:
            comm.Send(done[s], dest=s)
    for s in range(n):
        if s != r:
            comm.Recv(out[s * k:(s + 1) * k], source=s)
    return out
