"""Reference solution: ring all-reduce = ring reduce-scatter + ring all-gather.

EN ring all-reduce · RU кольцевой all-reduce · ZH 环形全归约

Patarasuk & Yuan 2009 (J. Parallel Distrib. Comput. 69(2)), brought to deep
learning by Gibiansky 2017 (Baidu) and Sergeev & Del Balso 2018 (Horovod,
arXiv 1802.05799).  Each rank sends, and receives, 2(N-1) chunks of about
S/N bytes: 2(N-1)/N x S bytes for a buffer of S bytes, only to its right
neighbour (r+1)%N and only from its left neighbour (r-1)%N.

Self-contained on purpose: this is what the learner writes, so it does not
use :mod:`minipar.collectives`.
"""

from __future__ import annotations

from typing import Any

import numpy as np


def ring_allreduce(comm: Any, x: np.ndarray) -> np.ndarray:
    """Elementwise sum of ``x`` over all ranks, returned on every rank as a new array.

    ``comm`` is an mpi4py communicator or minipar's TracedComm; ``x`` is this
    rank's 1-D array (same length and dtype on every rank), left untouched.
    """
    n, r = comm.Get_size(), comm.Get_rank()
    y = x.copy()
    chunks = np.array_split(y, n)  # views into y: chunk c is y's c-th array_split piece
    right, left = (r + 1) % n, (r - 1) % n

    # reduce-scatter: after step s, chunk (r-s-1)%N holds the sum over s+2 ranks
    for s in range(n - 1):
        send, recv = chunks[(r - s) % n], chunks[(r - s - 1) % n]
        buf = np.empty_like(recv)
        comm.Sendrecv(send, dest=right, recvbuf=buf, source=left)
        recv += buf
    # rank r now holds the full sum of chunk (r+1)%N

    # all-gather: pass the finished chunks around the same ring
    for s in range(n - 1):
        send, recv = chunks[(r + 1 - s) % n], chunks[(r - s) % n]
        comm.Sendrecv(send, dest=right, recvbuf=recv, source=left)
    return y
