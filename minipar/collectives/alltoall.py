"""All-to-all by pairwise exchange: every rank sends a different chunk to every rank.

EN all-to-all (personalised exchange) · RU всё-ко-всем (персонализированный обмен) ·
ZH 全交换 (全对全)

The collective of expert parallelism (GShard, Lepikhin et al. 2020, arXiv
2006.16668: dispatch tokens to the rank holding their expert, then combine)
and of DeepSpeed-Ulysses (arXiv 2309.14509: sequence shards <-> head shards).
Rank r holds ``chunks[0..N-1]``; chunk i goes to rank i.  Pairwise exchange
(Thakur, Rabenseifner & Gropp 2005): in step s = 1..N-1 rank r sends
``chunks[(r+s) % N]`` to rank (r+s) % N and receives from rank (r-s) % N, so
each step is a perfect matching of senders and receivers and no link is
asked to carry two messages at once.

Formula the tests check: rank r sends exactly the bytes of its chunks i != r
(its own chunk is copied locally) and receives, from each rank j != r, that
rank's chunk r.  Chunks may differ in length (the receiver learns each length
by probing the message); on one rank they must share dtype and trailing shape.

:class:`AllToAllRequest` is the same exchange *non-blocking*, for a caller that knows
how many rows each rank sends it (the experts' dispatch and combine, whose counts
travelled first): every receive posted with its length, every send started, then
``progress()`` (``Test``, never blocks) and ``wait()``, so that a single thread can
compute while it travels (DualPipe's overlapped pairs: :mod:`minipar.overlap`).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import time

import numpy as np
from mpi4py import MPI

from minipar import backend, overlap
from minipar.spans import offsets
from minipar.collectives import _base as B
from minipar.comm import tags as T

_ALGOS = ("pairwise", "mpi")


def all_to_all(comm: Any, chunks: Sequence[Any], algorithm: str = "pairwise") -> list[np.ndarray]:
    """Send ``chunks[i]`` to rank i; return the list whose item j came from rank j.

    Each received chunk has shape ``(-1, *trailing)`` where ``trailing`` is the
    trailing shape of this rank's chunks (1-D chunks give 1-D results).
    """
    B.check_algorithm(algorithm, _ALGOS, "all_to_all")
    c = B.traced(comm)
    if len(chunks) != c.size:
        raise ValueError(f"all_to_all needs one chunk per rank: {c.size} chunks, "
                         f"got {len(chunks)}")
    am = backend.array_module(chunks[0]) if len(chunks) else np  # the chunks' side
    arrs = [am.ascontiguousarray(x) for x in chunks]
    arrs = [x.reshape(1) if x.ndim == 0 else x for x in arrs]
    dtype, trailing = arrs[0].dtype, arrs[0].shape[1:]
    for i, x in enumerate(arrs):
        if x.dtype != dtype or x.shape[1:] != trailing:
            raise ValueError(f"all_to_all chunk {i} has dtype {x.dtype} and shape {x.shape}; "
                             f"chunk 0 has {dtype} and trailing shape {trailing}: they must agree")
    row = int(np.prod(trailing, dtype=np.int64))
    if row == 0:
        raise ValueError(f"all_to_all chunks of trailing shape {trailing} hold no elements")
    B.dtype_code(dtype)
    n, r = c.size, c.rank
    if algorithm == "mpi":
        send = am.concatenate([x.reshape(-1) for x in arrs])
        scounts = [x.size for x in arrs]
        rcounts = c.comm.alltoall(scounts)  # pickled: the oracle may use extra messages
        recv = am.empty(sum(rcounts), dtype)
        _, dt, _ = B.mpi_spec(send)
        with c.operation("mpi_all_to_all"):
            B.mpi_comm(c, send).Alltoallv([send, scounts, B.offsets_of(scounts), dt],
                             [recv, rcounts, B.offsets_of(rcounts), dt])
        offs = B.offsets_of(rcounts)
        return [recv[o: o + k].reshape(-1, *trailing) for o, k in zip(offs, rcounts)]
    got: list[np.ndarray | None] = [None] * n
    got[r] = arrs[r].copy()
    tag = B.tag_for("all_to_all", dtype, row=row)
    with c.operation("all_to_all"):
        for s in range(1, n):
            dst, src = (r + s) % n, (r - s) % n
            req = c.Isend(arrs[dst].reshape(-1), dst, tag)
            got[src] = B.recv_any_size(c, src, tag, dtype, row, am).reshape(-1, *trailing)
            c.waitall([req])
    return [g for g in got if g is not None]


#: the non-blocking all-to-all's tag, the last of the non-blocking range (which buckets fill
#: from its start); two in flight at once on one communicator are matched in the order
#: posted, the same on every rank (MPI's messages do not overtake)
IALLTOALL_TAG = T.NONBLOCKING.last


class AllToAllRequest:
    """``chunks[i]`` to rank i, non-blocking; ``recv_rows[j]`` rows (of this rank's trailing
    shape) arrive from rank j.  ``wait()`` returns the list whose item j came from rank j,
    as :func:`all_to_all`.  ``t_start``, ``t_end``: when it was posted and seen complete
    (``perf_counter``); ``blocked``: (start, end) of the time ``wait()`` waited, if any."""

    def __init__(self, comm: Any, chunks: Sequence[Any], recv_rows: Sequence[int]) -> None:
        c = self.comm = B.traced(comm)
        n, r = c.size, c.rank
        if len(chunks) != n or len(recv_rows) != n:
            raise ValueError(f"a non-blocking all_to_all needs one chunk and one row count "
                             f"per rank ({n}): got {len(chunks)} and {len(recv_rows)}")
        am = backend.array_module(chunks[0])
        arrs = [am.ascontiguousarray(x) for x in chunks]
        dtype, self.trailing = arrs[0].dtype, arrs[0].shape[1:]
        for i, x in enumerate(arrs):
            if x.ndim == 0 or x.dtype != dtype or x.shape[1:] != self.trailing:
                raise ValueError(f"all_to_all chunk {i} has dtype {x.dtype} and shape "
                                 f"{x.shape}; chunk 0 has {dtype} and trailing shape "
                                 f"{self.trailing}: they must agree")
        B.dtype_code(dtype)
        row = int(np.prod(self.trailing, dtype=np.int64))
        self.got: list[Any] = [am.empty((int(k) * row,), dtype) for k in recv_rows]
        self.got[r] = arrs[r].reshape(-1).copy()
        if self.got[r].size != int(recv_rows[r]) * row:
            raise ValueError(f"rank {r} keeps {len(arrs[r])} rows of its own but expects "
                             f"{recv_rows[r]} from itself")
        self.t_start, self.t_end = time.perf_counter(), None
        self.blocked: tuple[float, float] | None = None
        peers = [(r - s) % n for s in range(1, n)]
        self.reqs = [c.Irecv(self.got[j], j, IALLTOALL_TAG) for j in peers]
        self.peers = peers
        self.sends = [c.Isend(arrs[(r + s) % n].reshape(-1), (r + s) % n, IALLTOALL_TAG)
                      for s in range(1, n)]
        self.arrs = arrs  # the send buffers live until the sends complete
        if n == 1:
            self.t_end = self.t_start

    @property
    def done(self) -> bool:
        return self.t_end is not None

    def progress(self) -> bool:
        """Test every message (never blocks); True when all arrived and left."""
        if not self.done and all([q.Test() for q in self.reqs + self.sends]):
            self.t_end = time.perf_counter()
        return self.done

    def wait(self) -> list[Any]:
        """Wait for the rest (polling politely, under the deadlock watchdog); the chunks."""
        if not self.done:
            t = time.perf_counter()
            self.comm.waitall(self.reqs + self.sends)
            self.t_end = time.perf_counter()
            self.blocked = (t, self.t_end)
        for j, q in zip(self.peers, self.reqs):
            got = q.status.Get_count(MPI.BYTE)
            if got != self.got[j].nbytes:
                raise B.CollectiveMismatchError(
                    f"rank {self.comm.rank}: a non-blocking all_to_all expected "
                    f"{self.got[j].nbytes} bytes from rank {j}, received {got}: the ranks "
                    "disagree on the row counts")
        self.arrs = []
        return [g.reshape(-1, *self.trailing) for g in self.got]


def all_to_all_rows(comm: Any, x: Any, op: str, split_sizes: Sequence[int],
                    output_sizes: Sequence[int]) -> Any:
    """The experts' all-to-all of rows (axis 0 cut by ``split_sizes``, part i to rank i;
    ``output_sizes[j]`` rows arrive from rank j, concatenated in rank order), counted under
    ``op``: what :func:`all_to_all` gives, but **non-blocking** — posted
    (:class:`AllToAllRequest`), then :func:`minipar.overlap.in_flight`: inside DualPipe's
    overlapped pair the other micro-batch computes while it travels — then waited for."""
    c, am = B.traced(comm), backend.array_module(x)
    sizes, expect = [int(k) for k in split_sizes], [int(k) for k in output_sizes]
    if len(sizes) != c.size or min(sizes) < 0 or sum(sizes) != len(x):
        raise ValueError(f"{op}: split sizes {sizes} must be {c.size} counts adding up to "
                         f"the {len(x)} rows")
    with c.operation(op):
        req = AllToAllRequest(c, [x[o: o + k] for o, k in zip(offsets(sizes), sizes)],
                              expect)
    overlap.in_flight(req)
    return am.concatenate(req.wait())
