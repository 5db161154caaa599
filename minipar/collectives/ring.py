"""Ring reduce-scatter, ring all-gather and the ring all-reduce built from them.

EN ring all-reduce · RU кольцевой all-reduce (кольцевая редукция) · ZH 环形全归约

Patarasuk & Yuan, "Bandwidth optimal all-reduce algorithms for clusters of
workstations", J. Parallel Distrib. Comput. 69(2), 2009; brought to deep
learning by Baidu (A. Gibiansky, "Bringing HPC techniques to deep learning",
2017) and Horovod (Sergeev & Del Balso 2018, arXiv 1802.05799).

The ranks form a ring: rank r sends only to ``right = (r+1) % N`` and
receives only from ``left = (r-1) % N``.  The buffer of n elements is cut into
N chunks in ``numpy.array_split`` order (chunk i has n//N + 1 elements if
i < n % N, else n//N; chunks may be empty).

* **Reduce-scatter** (N-1 steps): at step s rank r sends chunk (r-s-1) % N
  and receives chunk (r-s-2) % N, which it reduces with its own copy.  After
  N-1 steps rank r holds chunk r reduced over all ranks.
* **All-gather** (N-1 steps): at step s rank r sends chunk (r-s) % N and
  receives chunk (r-s-1) % N.  Afterwards every rank holds every chunk.

Each step is one ``Sendrecv`` (right / left), so no rank ever waits on a rank
that waits on it.  Formula the tests check (S = n x itemsize bytes): rank r
sends  2S - bytes(chunk r) - bytes(chunk r+1)  and receives
2S - bytes(chunk r-1) - bytes(chunk r) in a ring all-reduce, which is exactly
**2(N-1)/N x S** when N divides n; reduce-scatter alone sends S - bytes(chunk r),
all-gather alone S - bytes(chunk r+1) (see :mod:`minipar.collectives.cost`).
The number of bytes per rank does not grow with N: the ring is
bandwidth-optimal.

Reduction happens in the input dtype (float16 sums in float16, as MPI does);
the value of each chunk is computed on one rank and then copied, so every rank
ends with bit-identical results.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from minipar import backend
from minipar.collectives import _base as B

_RS_ALGOS = ("ring", "mpi")
_AG_ALGOS = ("ring", "mpi")


def _reduce_scatter_steps(c: Any, x: np.ndarray, out: np.ndarray | None, counts: list[int],
                          offs: list[int], ufunc: np.ufunc, tag: int) -> np.ndarray:
    """The N-1 reduce-scatter steps over the flat array ``x`` (never written).

    With ``out`` (full size) each incoming chunk is received straight into
    its place in ``out`` and reduced there (ring all-reduce: no scratch
    buffer, one pass of the ufunc per chunk); without, one chunk-sized buffer
    is reused and the returned array is rank r's reduced chunk.
    """
    n_ranks, r = c.size, c.rank
    right, left = (r + 1) % n_ranks, (r - 1) % n_ranks
    am = backend.array_module(x)  # NumPy, or xp for a device array
    scratch = am.empty(max(counts), x.dtype) if out is None else None
    acc = am.empty(max(counts), x.dtype) if out is None else None
    sent = x[offs[(r - 1) % n_ranks]: offs[(r - 1) % n_ranks] + counts[(r - 1) % n_ranks]]
    for s in range(n_ranks - 1):
        ri = (r - s - 2) % n_ranks
        got = (scratch if out is None else out[offs[ri]:])[: counts[ri]]
        B.sendrecv(c, sent, right, got, left, tag)
        mine = x[offs[ri]: offs[ri] + counts[ri]]
        if out is not None:
            dst = got  # mine op got, in place where the chunk belongs
        elif s == n_ranks - 2:
            dst = am.empty(counts[ri], x.dtype)  # the result: a fresh array
        else:
            dst = acc[: counts[ri]]  # type: ignore[index]
        ufunc(mine, got, out=dst)
        sent = dst  # the chunk reduced now is sent on at the next step
    return sent


def _all_gather_steps(c: Any, out: np.ndarray, counts: list[int], offs: list[int],
                      tag: int) -> None:
    """The N-1 all-gather steps, in place in ``out`` (rank r's chunk r is filled)."""
    n_ranks, r = c.size, c.rank
    right, left = (r + 1) % n_ranks, (r - 1) % n_ranks
    for s in range(n_ranks - 1):
        si, ri = (r - s) % n_ranks, (r - s - 1) % n_ranks
        B.sendrecv(c, out[offs[si]: offs[si] + counts[si]], right,
                   out[offs[ri]: offs[ri] + counts[ri]], left, tag)


def ring_allreduce(comm: Any, x: Any, op: str = "sum") -> np.ndarray:
    """Every rank gets the element-wise ``op`` of all ranks' ``x`` (same shape, dtype).

    Counted under the operation name ``"ring_allreduce"``; sends only to the
    right neighbour, receives only from the left one.
    """
    B.check_op(op)
    c, a = B.prepare(comm, x)
    ufunc = B.check_op(op, a)
    flat = a.reshape(-1)
    if c.size == 1:
        return flat.copy().reshape(a.shape)
    counts = B.chunk_counts(flat.size, c.size)
    offs = B.offsets_of(counts)
    tag = B.tag_for("ring_allreduce", a.dtype, op)
    out = backend.array_module(a).empty_like(flat)
    with c.operation("ring_allreduce"):
        _reduce_scatter_steps(c, flat, out, counts, offs, ufunc, tag)
        _all_gather_steps(c, out, counts, offs, tag)
    return out.reshape(a.shape)


def _rows(a: np.ndarray, what: str) -> tuple[int, int]:
    if a.ndim == 0:
        raise ValueError(f"{what} needs an array with at least one axis, got a 0-d array")
    return a.shape[0], int(np.prod(a.shape[1:], dtype=np.int64))


def reduce_scatter(comm: Any, x: Any, op: str = "sum", algorithm: str = "ring",
                   counts: Sequence[int] | None = None) -> np.ndarray:
    """Reduce ``x`` over all ranks and return this rank's chunk of the result.

    ``x`` is split along axis 0 in ``numpy.array_split`` order: rank r gets
    rows ``array_split(range(len(x)), N)[r]`` of the reduced array, shape
    ``(k_r, *x.shape[1:])`` (k_r may be 0).  Every rank passes the same shape.
    ``counts`` (rows per rank, summing to ``len(x)``) replaces the
    array_split rule, e.g. to cut a buffer at the boundaries of ZeRO shards;
    every rank passes the same counts.
    """
    B.check_op(op)
    B.check_algorithm(algorithm, _RS_ALGOS, "reduce_scatter")
    c, a = B.prepare(comm, x)
    ufunc, am = B.check_op(op, a), backend.array_module(a)
    rows, row = _rows(a, "reduce_scatter")
    if counts is None:
        row_counts = B.chunk_counts(rows, c.size)
    else:
        row_counts = [int(k) for k in counts]
        if len(row_counts) != c.size or min(row_counts) < 0 or sum(row_counts) != rows:
            raise ValueError(f"reduce_scatter counts {list(counts)} must be {c.size} "
                             f"non-negative row counts summing to the {rows} rows of x")
    counts = [k * row for k in row_counts]
    offs = B.offsets_of(counts)
    shape = (row_counts[c.rank], *a.shape[1:])
    flat = a.reshape(-1)
    if algorithm == "mpi":
        buf, dt, mop = B.mpi_spec(flat, op)
        res = am.empty(counts[c.rank], a.dtype)
        with c.operation("mpi_reduce_scatter"):
            B.mpi_comm(c, flat).Reduce_scatter(B.mpi_buf(buf, dt), B.mpi_buf(res, dt), counts, mop)
        return res.reshape(shape)
    if c.size == 1:
        return flat.copy().reshape(shape)
    tag = B.tag_for("reduce_scatter", a.dtype, op)
    with c.operation("reduce_scatter"):
        res = _reduce_scatter_steps(c, flat, None, counts, offs, ufunc, tag)
    return res.reshape(shape)


def all_gather(comm: Any, chunk: Any, algorithm: str = "ring") -> np.ndarray:
    """Concatenate every rank's ``chunk`` along axis 0, in rank order, on every rank.

    Chunks may have different lengths (the receiver learns each length from
    the message itself, by probing); dtype and trailing shape must agree.  A
    0-d chunk counts as one element.  The inverse of :func:`reduce_scatter`'s
    split: ``all_gather(c, reduce_scatter(c, x))`` equals the all-reduce of x.
    """
    B.check_algorithm(algorithm, _AG_ALGOS, "all_gather")
    c, a = B.prepare(comm, chunk)
    a = a.reshape(1) if a.ndim == 0 else a
    trailing, row = a.shape[1:], int(np.prod(a.shape[1:], dtype=np.int64))
    if row == 0:
        raise ValueError(f"all_gather of chunks of shape {a.shape}: rows of zero elements "
                         "cannot be counted; give the chunk a non-empty trailing shape")
    flat, am = a.reshape(-1), backend.array_module(a)
    if algorithm == "mpi":
        counts = c.comm.allgather(flat.size)  # pickled: the oracle may use extra messages
        out = am.empty(sum(counts), a.dtype)
        buf, dt, _ = B.mpi_spec(flat)
        with c.operation("mpi_all_gather"):
            B.mpi_comm(c, flat).Allgatherv(B.mpi_buf(buf, dt), [out, counts, B.offsets_of(counts), dt])
        return out.reshape(-1, *trailing)
    n_ranks, r = c.size, c.rank
    pieces: list[np.ndarray] = [flat] * n_ranks
    tag = B.tag_for("all_gather", a.dtype, row=row)
    right, left = (r + 1) % n_ranks, (r - 1) % n_ranks
    with c.operation("all_gather"):
        for s in range(n_ranks - 1):
            si, ri = (r - s) % n_ranks, (r - s - 1) % n_ranks
            req = c.Isend(pieces[si], right, tag)
            pieces[ri] = B.recv_any_size(c, left, tag, a.dtype, row, am)
            c.waitall([req])
    return am.concatenate(pieces).reshape(-1, *trailing)
