"""Reference solution: DDP's gradient synchronisation = weight, then ring all-reduce.

EN gradient synchronisation · RU синхронизация градиентов · ZH 梯度同步

Li et al. 2020 (PyTorch DDP, arXiv 2006.15704); the ring: Patarasuk & Yuan
2009, Horovod (Sergeev & Del Balso 2018, arXiv 1802.05799).  Rank r holds
g_r, the gradient of the mean loss over its ``rows`` rows of a global batch
of ``batch`` rows.  The gradient of the mean over the whole batch is

    g = Σ_r (rows_r / batch) · g_r

so each rank scales its gradient by rows_r / batch and the ranks sum with a
ring all-reduce: 2(N-1)/N x S bytes per rank, only to the right neighbour.

Self-contained on purpose: this is what the learner writes, so it does not
use :mod:`minipar.collectives`.  DDP itself does the same in
``minipar/parallel/data_parallel/ddp.py``: the weight b_r / B of
:func:`~minipar.parallel.data_parallel.ddp.local_batch` scales the loss (so the
gradients come out weighted), and :class:`~minipar.parallel.data_parallel.ddp.DDPHooks`
sums them bucket by bucket with the ring, overlapped with backward.
"""

from __future__ import annotations

from typing import Any

import numpy as np


def sync_gradients(comm: Any, x: np.ndarray, rows: int, batch: int) -> np.ndarray:
    """The global-batch gradient on every rank, from this rank's gradient ``x``
    (mean over its ``rows`` rows of ``batch``); a new array, ``x`` untouched."""
    n, r = comm.Get_size(), comm.Get_rank()
    y = x * (rows / batch)  # a new array: this rank's share of the global mean
    chunks = np.array_split(y, n)
    right, left = (r + 1) % n, (r - 1) % n
    for s in range(n - 1):  # reduce-scatter
        send, recv = chunks[(r - s) % n], chunks[(r - s - 1) % n]
        buf = np.empty_like(recv)
        comm.Sendrecv(send, dest=right, recvbuf=buf, source=left)
        recv += buf
    for s in range(n - 1):  # all-gather
        send, recv = chunks[(r + 1 - s) % n], chunks[(r - s) % n]
        comm.Sendrecv(send, dest=right, recvbuf=recv, source=left)
    return y
