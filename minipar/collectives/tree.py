"""Latency-optimal collectives: binomial-tree broadcast and reduce, recursive doubling.

EN binomial tree, recursive doubling · RU биномиальное дерево, рекурсивное удвоение ·
ZH 二项树, 递归倍增

For small messages the cost is the number of sequential steps (latency), not
bytes, and the ring's 2(N-1) steps lose to these ceil(log2 N) ones
(Thakur, Rabenseifner & Gropp, "Optimization of collective communication
operations in MPICH", IJHPCA 19(1), 2005).

* **Binomial-tree broadcast.**  Ranks are renumbered ``v = (r - root) % N``.
  In round k (mask = 2^k) every rank v < mask that already holds the data
  sends it to v + mask.  A non-root receives S bytes once from its parent
  ``v - lowbit(v)`` and sends S to each child ``v + m`` (m a power of two
  below lowbit(v), or any power of two for the root, v + m < N).
* **Binomial-tree reduce** is the same tree walked backwards: each rank
  reduces what its children send, then sends S bytes to its parent.
* **Tree all-reduce** = reduce to rank 0 + broadcast from rank 0:
  2 ceil(log2 N) steps, the root sends and receives ceil(log2 N) x S.
* **Recursive doubling** (all-reduce): in round k rank v exchanges its whole
  buffer with ``v XOR 2^k`` and both reduce: log2 N rounds of S bytes each
  way.  For N not a power of two, with p the largest power of two <= N and
  rem = N - p, the standard fold: each even rank r < 2 rem first sends its
  buffer to r + 1 and sits out; the p survivors run recursive doubling; then
  each odd r < 2 rem sends the result back to r - 1.

Byte formulas per rank: :mod:`minipar.collectives.cost`.  Reduction is in the
input dtype.  Recursive doubling gives every rank bit-identical floats: both
partners compute ``a + b`` of the same two values (IEEE addition commutes).
"""

from __future__ import annotations

from typing import Any

import numpy as np
from mpi4py import MPI

from minipar import backend
from minipar.collectives import _base as B

_ALGOS = ("binomial", "mpi")


def _lowbit(v: int) -> int:
    return v & -v


def _bcast_steps(c: Any, buf: np.ndarray, root: int, tag: int) -> None:
    """Binomial broadcast of ``buf`` (filled on the root) in place."""
    n, v = c.size, (c.rank - root) % c.size
    if v:
        B.recv(c, buf, (v - _lowbit(v) + root) % n, tag)
    m = _lowbit(v) >> 1 if v else 1 << max(n - 1, 0).bit_length()
    while m:
        if v + m < n:
            c.Send(buf, (v + m + root) % n, tag)
        m >>= 1


def _reduce_steps(c: Any, acc: np.ndarray, root: int, ufunc: np.ufunc, tag: int) -> None:
    """Binomial reduce into ``acc`` (this rank's contribution, overwritten)."""
    n, v = c.size, (c.rank - root) % c.size
    scratch = backend.array_module(acc).empty_like(acc)
    m = 1
    while m < n and not (v & m):  # children v + 1, v + 2, v + 4, ... below lowbit(v)
        if v + m < n:
            B.recv(c, scratch, (v + m + root) % n, tag)
            ufunc(acc, scratch, out=acc)
        m <<= 1
    if v:
        c.Send(acc, (v - _lowbit(v) + root) % n, tag)


def broadcast(comm: Any, x: Any, root: int = 0, algorithm: str = "binomial") -> np.ndarray:
    """Every rank gets the root's ``x``.

    Non-roots pass an array of the same shape and dtype (its values are
    ignored; it is not written), or ``None``: then the length and dtype are
    learned from the message itself and the result is 1-D (on the backend's side of
    the device boundary, ``xp``).
    """
    B.check_algorithm(algorithm, _ALGOS, "broadcast")
    c = B.traced(comm)
    B.check_root(root, c.size)
    if x is None:
        if c.rank == root:
            raise ValueError(f"broadcast: the root (rank {root}) must pass an array, not None")
        return _broadcast_unknown(c, root, algorithm)
    c, a = B.prepare(c, x)
    out = a.copy() if c.rank == root else backend.array_module(a).empty_like(a)
    if algorithm == "mpi":
        head = (a.size, B.dtype_code(a.dtype))
        n, code = c.comm.bcast(head, root=root)  # header, for None-callers
        if (n, code) != head:
            raise B.CollectiveMismatchError(
                f"rank {c.rank}: broadcast of {a.size} x {a.dtype}, the root has {n} x "
                f"{B.DTYPES[code - 1]}")
        _, dt, _ = B.mpi_spec(out)
        with c.operation("mpi_broadcast"):
            B.mpi_comm(c, out).Bcast(B.mpi_buf(out, dt), root=root)
        return out
    with c.operation("broadcast"):
        _bcast_steps(c, out.reshape(-1), root, B.tag_for("broadcast", a.dtype))
    return out


def _broadcast_unknown(c: Any, root: int, algorithm: str) -> np.ndarray:
    """A non-root's side of a broadcast whose length and dtype it does not know."""
    if algorithm == "mpi":
        n, code = c.comm.bcast(None, root=root)  # pickled header: the oracle's extra message
        out = backend.xp.empty(n, B.dtype_named(B.DTYPES[code - 1]))
        _, dt, _ = B.mpi_spec(out)
        with c.operation("mpi_broadcast"):
            B.mpi_comm(c, out).Bcast(B.mpi_buf(out, dt), root=root)
        return out
    n, v = c.size, (c.rank - root) % c.size
    parent = (v - _lowbit(v) + root) % n
    # the dtype is learned from the tag: accept the broadcast signature of every dtype
    st = c.probe_tags(parent, [B.tag_for("broadcast", d) for d in B.DTYPES])
    dtype = B.dtype_of_tag(st.Get_tag())
    assert dtype is not None  # one of the tags probed for
    out = backend.xp.empty(st.Get_count(MPI.BYTE) // dtype.itemsize, dtype)
    with c.operation("broadcast"):
        _bcast_steps(c, out, root, st.Get_tag())
    return out


def reduce(comm: Any, x: Any, root: int = 0, op: str = "sum",
           algorithm: str = "binomial") -> np.ndarray | None:
    """The root gets the element-wise ``op`` of every rank's ``x``; others get None."""
    B.check_op(op)
    B.check_algorithm(algorithm, _ALGOS, "reduce")
    c, a = B.prepare(comm, x)
    ufunc = B.check_op(op, a)
    B.check_root(root, c.size)
    acc = a.copy()
    if algorithm == "mpi":
        _, dt, mop = B.mpi_spec(acc, op)
        out = backend.array_module(acc).empty_like(acc)
        with c.operation("mpi_reduce"):
            B.mpi_comm(c, acc).Reduce(B.mpi_buf(acc, dt), B.mpi_buf(out, dt), mop, root=root)
        return out if c.rank == root else None
    with c.operation("reduce"):
        _reduce_steps(c, acc.reshape(-1), root, ufunc, B.tag_for("reduce", a.dtype, op))
    return acc if c.rank == root else None


def tree_allreduce(comm: Any, x: Any, op: str = "sum") -> np.ndarray:
    """All-reduce as binomial reduce to rank 0, then binomial broadcast from it."""
    B.check_op(op)
    c, a = B.prepare(comm, x)
    ufunc = B.check_op(op, a)
    acc = a.copy()
    tag = B.tag_for("tree_allreduce", a.dtype, op)
    with c.operation("tree_allreduce"):
        _reduce_steps(c, acc.reshape(-1), 0, ufunc, tag)
        _bcast_steps(c, acc.reshape(-1), 0, tag)
    return acc


def _fold(n: int) -> tuple[int, int]:
    p = 1 << (n.bit_length() - 1)
    return p, n - p


def recursive_doubling_allreduce(comm: Any, x: Any, op: str = "sum") -> np.ndarray:
    """All-reduce in ceil(log2 N) rounds of whole-buffer exchanges (any N)."""
    B.check_op(op)
    c, a = B.prepare(comm, x)
    ufunc = B.check_op(op, a)
    acc = a.copy()
    flat, scratch = acc.reshape(-1), backend.array_module(a).empty(a.size, a.dtype)
    r, (p, rem) = c.rank, _fold(c.size)
    tag = B.tag_for("recursive_doubling_allreduce", a.dtype, op)
    with c.operation("recursive_doubling_allreduce"):
        if r < 2 * rem and r % 2 == 0:  # folded away: hand over, wait for the result
            c.Send(flat, r + 1, tag)
            B.recv(c, flat, r + 1, tag)
            return acc
        if r < 2 * rem:  # odd: absorb the even neighbour's contribution
            B.recv(c, scratch, r - 1, tag)
            ufunc(flat, scratch, out=flat)
        v = r // 2 if r < 2 * rem else r - rem
        m = 1
        while m < p:
            pv = v ^ m
            partner = 2 * pv + 1 if pv < rem else pv + rem
            B.sendrecv(c, flat, partner, scratch, partner, tag)
            ufunc(flat, scratch, out=flat)
            m <<= 1
        if r < 2 * rem:
            c.Send(flat, r - 1, tag)
    return acc
