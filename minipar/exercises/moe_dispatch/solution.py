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
block never leaves it.  Which experts a rank holds is the package's own rule
(:func:`minipar.parallel.expert_parallel.layout.expert_ids`, the placement minipar's
expert parallelism uses); the exchange is written out here with Sendrecv, as the
learner writes it (the grader refuses :mod:`minipar.collectives`, which
minipar's own all-to-all, :func:`~minipar.parallel.expert_parallel.layer.to_experts`,
runs on).
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from minipar.parallel.expert_parallel.layout import expert_ids


def moe_dispatch_combine(comm, x: np.ndarray,
                         expert: Callable[[int, np.ndarray], np.ndarray]) -> np.ndarray:
    """out (E, C, d) with out[e] = Expert_e(x[e]), each expert run on the rank that holds it."""
    n, r = comm.Get_size(), comm.Get_rank()
    E, C, d = x.shape
    mine = expert_ids(E, n, r)  # rank s holds experts s*E/N .. (s+1)*E/N - 1
    k = len(mine)  # experts per rank
    # 1. dispatch: got[s] = rank s's rows for my experts, (k, C, d)
    got = [np.empty((k, C, d)) for _ in range(n)]
    got[r][:] = x[mine]  # my own block stays here
    for t in range(1, n):
        dest, src = (r + t) % n, (r - t) % n
        comm.Sendrecv(x[expert_ids(E, n, dest)], dest=dest, recvbuf=got[src], source=src)
    # 2. experts: my expert mine[i] on the rows every rank sent it, in one call
    done = [np.empty_like(g) for g in got]
    for i, e in enumerate(mine):
        y = expert(e, np.concatenate([g[i] for g in got]))  # (n*C, d)
        for s in range(n):
            done[s][i] = y[s * C:(s + 1) * C]
    # 3. combine: the reverse all-to-all, rank s's outputs back to rank s
    out = np.empty_like(x)
    out[mine] = done[r]
    for t in range(1, n):
        dest, src = (r + t) % n, (r - t) % n
        back = np.empty_like(done[dest])  # rank src's experts' outputs for my tokens
        comm.Sendrecv(done[dest], dest=dest, recvbuf=back, source=src)
        out[expert_ids(E, n, src)] = back
    return out
