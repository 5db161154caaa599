"""Reference solution: broadcast along a binomial tree.

EN binomial-tree broadcast · RU широковещательная рассылка по биномиальному дереву ·
ZH 二项树广播

Thakur, Rabenseifner & Gropp 2005, "Optimization of Collective Communication
Operations in MPICH" (IJHPCA 19(1)): the short-message broadcast of MPICH.
In round k the ranks that already hold the data send it to a rank 2^k away
(counted from the root), so the number of holders doubles every round:
ceil(log2 N) rounds, every non-root rank receives S bytes exactly once,
N-1 messages in all, and no rank sends more than ceil(log2 N) of them.

Self-contained on purpose: this is what the learner writes, so it does not
use :mod:`minipar.collectives`.
"""

from __future__ import annotations

from typing import Any

import numpy as np


def tree_broadcast(comm: Any, x: np.ndarray, root: int = 0) -> np.ndarray:
    """Root's ``x`` on every rank, as a new array.

    Every rank passes an ``x`` of the same shape and dtype; only the root's
    contents matter (the others' are overwritten in the returned copy, never
    in ``x``).  ``comm`` is an mpi4py communicator or minipar's TracedComm.
    """
    n, r = comm.Get_size(), comm.Get_rank()
    vr = (r - root) % n  # rank relative to the root: the root is 0
    y = x.copy() if r == root else np.empty_like(x)

    # receive once, from the parent: vr with its lowest set bit cleared
    mask = 1
    while mask < n:
        if vr & mask:
            comm.Recv(y, source=(vr - mask + root) % n)
            break
        mask <<= 1
    # forward to the children vr + mask/2, vr + mask/4, ..., vr + 1 (those that exist)
    mask >>= 1
    while mask > 0:
        if vr + mask < n:
            comm.Send(y, dest=(vr + mask + root) % n)
        mask >>= 1
    return y
