"""Collectives built from point-to-point messages: ring, tree, naive, all-to-all.

EN collective communication · RU коллективные операции · ZH 集合通信

=======================  ==================================  ==================
EN                       RU                                  ZH
=======================  ==================================  ==================
ring all-reduce          кольцевой all-reduce                环形全归约
reduce-scatter           редукция с рассылкой частей         归约散射
all-gather               сбор со всех на все                 全收集
broadcast                широковещательная рассылка          广播
reduce                   редукция (сведение)                 归约
all-to-all               всё-ко-всем                         全交换
parameter server         сервер параметров                   参数服务器
recursive doubling       рекурсивное удвоение                递归倍增
=======================  ==================================  ==================

Every algorithm here is written on ``Send / Recv / Sendrecv / Isend`` over
NumPy buffers; MPI's own collectives are only the oracle
(``algorithm="mpi"``).  Sources: Patarasuk & Yuan, J. Parallel Distrib.
Comput. 69(2), 2009 (the bandwidth-optimal ring); A. Gibiansky, Baidu
Research, 2017 (the ring for deep learning); Sergeev & Del Balso, Horovod,
2018, arXiv 1802.05799; Thakur, Rabenseifner & Gropp, IJHPCA 19(1), 2005
(MPICH's trees, recursive doubling, pairwise all-to-all).

**The formula the tests check.**  A ring all-reduce of S bytes makes every
rank send, and receive, 2(N-1)/N x S bytes, exactly when the element count n
is divisible by N, only to its right neighbour and from its left one.  For any
n the exact figure is 2S - bytes(chunk r) - bytes(chunk r+1) sent by rank r
(:func:`ring_allreduce_bytes`); the parameter server's root receives and sends
(N-1) x S (:func:`naive_allreduce_bytes`).  :func:`allreduce_bytes` gives the
exact bytes of any all-reduce algorithm, ``"auto"`` included.

**Which all-reduce.**  :func:`allreduce` takes ``algorithm="auto"`` by default:
recursive doubling for small messages (few sequential messages: latency),
the ring for large ones (2(N-1)/N x S: bandwidth), as MPICH does; the switch
is where the α–β–γ cost model (Thakur, Rabenseifner & Gropp 2005) with this
machine's committed constants says the ring becomes faster
(:mod:`minipar.collectives.auto`, :func:`choose_allreduce`,
:mod:`minipar.collectives.cost_model`).

**Contract.**

* ``comm`` is a plain mpi4py communicator or a :class:`minipar.comm.TracedComm`
  (a plain one is wrapped, so waits poll politely; pass a TracedComm to read
  the counters).  Bytes are counted under the function's name
  (``comm.stats.bytes_sent("ring_allreduce")``); MPI's own collectives under
  ``"mpi_<name>"``, time only (MPI does not tell us its bytes).
* Arrays in, new arrays out; inputs are never written (non-contiguous inputs
  are copied first).  Any length works: 0, shorter than N, not divisible by N.
* **Chunking rule**: the ``numpy.array_split`` order.  With n units and N
  ranks, chunk i has n // N + 1 units if i < n % N, else n // N; chunk i
  belongs to rank i.  Units are elements for the all-reduces, rows (axis 0)
  for :func:`reduce_scatter` and :func:`all_gather`.
* dtypes: bool, (u)int8..64, float16/32/64, complex, bfloat16 (ml_dtypes);
  ops ``"sum"``, ``"max"``, ``"min"``, ``"prod"``.  Reduction is in the input
  dtype, as MPI's own does: float16 sums in float16 (round after each add).
* Errors, local and before any message: unknown op or algorithm, root out of
  range, unsupported dtype -> ``ValueError``.  Across ranks: each message's
  tag encodes (collective, op, dtype) and the receiver checks the tag and the
  byte count, so a rank with another length, dtype, op or collective raises
  :class:`CollectiveMismatchError` (a ``ValueError``) naming both sides;
  under ``python -m mpi4py`` that ends the whole job instead of hanging.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from minipar import backend
from minipar.collectives._base import OPS, CollectiveMismatchError, chunk_counts
from minipar.collectives.alltoall import all_to_all
from minipar.collectives.auto import auto_allreduce, choose_allreduce
from minipar.collectives.cost import (
    all_gather_bytes,
    allreduce_bytes,
    allreduce_bytes_sent,
    broadcast_bytes,
    naive_allreduce_bytes,
    recursive_doubling_bytes,
    reduce_bytes,
    reduce_scatter_bytes,
    ring_allreduce_bytes,
    ring_allreduce_bytes_sent,
    tree_allreduce_bytes,
)
from minipar.collectives.naive import naive_allreduce
from minipar.collectives.ring import all_gather, reduce_scatter, ring_allreduce
from minipar.collectives.tree import (
    broadcast,
    recursive_doubling_allreduce,
    reduce,
    tree_allreduce,
)

ALLREDUCE_ALGORITHMS = ("auto", "ring", "naive", "recursive_doubling", "tree", "mpi")


def allreduce(comm: Any, x: Any, op: str = "sum", algorithm: str = "auto") -> np.ndarray:
    """All-reduce by the named algorithm: auto | ring | naive | recursive_doubling | tree | mpi.

    ``"auto"`` (the default) is recursive doubling or the ring, whichever the
    α–β–γ model says is faster for this size on this many ranks
    (:func:`choose_allreduce`); counted under the name of the algorithm it ran.
    """
    from minipar.collectives import _base as B

    B.check_op(op)
    B.check_algorithm(algorithm, ALLREDUCE_ALGORITHMS, "allreduce")
    if algorithm == "auto":
        return auto_allreduce(comm, x, op)
    if algorithm == "ring":
        return ring_allreduce(comm, x, op)
    if algorithm == "naive":
        return naive_allreduce(comm, x, op)
    if algorithm == "recursive_doubling":
        return recursive_doubling_allreduce(comm, x, op)
    if algorithm == "tree":
        return tree_allreduce(comm, x, op)
    c, a = B.prepare(comm, x)
    buf, dt, mop = B.mpi_spec(a, op)
    out = backend.array_module(a).empty_like(a)
    with c.operation("mpi_allreduce"):
        B.mpi_comm(c, a).Allreduce(B.mpi_buf(buf, dt), B.mpi_buf(out, dt), mop)
    return out


__all__ = [
    "ALLREDUCE_ALGORITHMS", "OPS", "CollectiveMismatchError", "all_gather", "all_gather_bytes",
    "all_to_all", "allreduce", "allreduce_bytes", "allreduce_bytes_sent", "auto_allreduce",
    "broadcast", "broadcast_bytes", "choose_allreduce", "chunk_counts",
    "naive_allreduce", "naive_allreduce_bytes", "recursive_doubling_allreduce",
    "recursive_doubling_bytes", "reduce", "reduce_bytes", "reduce_scatter",
    "reduce_scatter_bytes", "ring_allreduce", "ring_allreduce_bytes",
    "ring_allreduce_bytes_sent", "tree_allreduce", "tree_allreduce_bytes",
]
