"""Reference solution: the dispatch and combine all-to-alls of expert parallelism.

EN expert-parallel dispatch and combine · RU рассылка токенов к экспертам и сбор ·
ZH 专家并行的分发与合并

GShard (Lepikhin et al. 2020, arXiv 2006.16668, §2.2) and Switch Transformer
(Fedus et al. 2021, arXiv 2101.03961, §2.2): E experts spread over N ranks,
rank r holding experts r·E/N … (r+1)·E/N − 1.  Each rank routed its own tokens
into fixed-capacity buffers x (E, C, d).  Then

1. dispatch (all-to-all): block s = x[s·E/N:(s+1)·E/N] goes to rank s, so each
   rank receives, from every rank, the rows for its own experts;
2. experts: each local expert runs on the rows of all N ranks at once;
3. combine (the reverse all-to-all): the outputs computed for rank s's rows
   go back to rank s, into out[q·E/N:(q+1)·E/N] for the experts of rank q.

Pairwise exchange (step t = 1 … N−1: send to (r+t) % N, receive from
(r−t) % N): each rank sends (N−1)/N of its buffer per direction and its own
block never leaves it.  Self-contained on purpose (no :mod:`minipar.collectives`):
this is what the learner writes.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np


def moe_dispatch_combine(comm, x: np.ndarray,
                         expert: Callable[[int, np.ndarray], np.ndarray]) -> np.ndarray:
    """out (E, C, d) with out[e] = Expert_e(x[e]), each expert run on the rank that holds it."""
    n, r = comm.Get_size(), comm.Get_rank()
    E, C, d = x.shape
    k = E // n  # experts per rank
    # 1. dispatch: got[s] = rank s's rows for my experts, (k, C, d)
    got = [np.empty((k, C, d)) for _ in range(n)]
    got[r][:] = x[r * k:(r + 1) * k]  # my own block stays here
    for t in range(1, n):
        dest, src = (r + t) % n, (r - t) % n
        comm.Sendrecv(x[dest * k:(dest + 1) * k], dest=dest, recvbuf=got[src], source=src)
    # 2. experts: my expert r*k + i on the rows every rank sent it, in one call
    done = [np.empty_like(g) for g in got]
    for i in range(k):
        y = expert(r * k + i, np.concatenate([g[i] for g in got]))  # (n*C, d)
        for s in range(n):
            done[s][i] = y[s * C:(s + 1) * C]
    # 3. combine: the reverse all-to-all, rank s's outputs back to rank s
    out = np.empty_like(x)
    out[r * k:(r + 1) * k] = done[r]
    for t in range(1, n):
        dest, src = (r + t) % n, (r - t) % n
        comm.Sendrecv(done[dest], dest=dest, recvbuf=out[src * k:(src + 1) * k], source=src)
    return out
