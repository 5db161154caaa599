"""Wrong on purpose: sends the whole buffer to every rank (right result, N x the bytes)."""

import numpy as np


def moe_dispatch_combine(comm, x, expert):
    n, r = comm.Get_size(), comm.Get_rank()
    E, C, _d = x.shape
    k = E // n
    whole = [x.copy() if s == r else np.empty_like(x) for s in range(n)]
    for t in range(1, n):
        dest, src = (r + t) % n, (r - t) % n
        comm.Sendrecv(x, dest=dest, recvbuf=whole[src], source=src)
    got = [w[r * k:(r + 1) * k] for w in whole]
    done = [np.empty_like(g) for g in got]
    for i in range(k):
        y = expert(r * k + i, np.concatenate([g[i] for g in got]))
        for s in range(n):
            done[s][i] = y[s * C:(s + 1) * C]
    out = np.empty_like(x)
    out[r * k:(r + 1) * k] = done[r]
    for t in range(1, n):
        dest, src = (r + t) % n, (r - t) % n
        comm.Sendrecv(done[dest], dest=dest, recvbuf=out[src * k:(src + 1) * k], source=src)
    return out
