"""Non-blocking ring all-reduce — неблокирующий кольцевой all-reduce — 非阻塞环形全归约.

The ring all-reduce of :mod:`minipar.collectives.ring` (Patarasuk & Yuan
2009; Horovod, Sergeev & Del Balso 2018, arXiv 1802.05799) as a *state
machine*, so that a single-threaded program can keep computing while a
reduction is under way — what PyTorch DDP (Li et al. 2020, arXiv
2006.15704) needs to overlap gradient buckets with the backward pass:

    req = RingAllreduceRequest(comm, bucket, tag)   # posts step 0 (Isend/Irecv)
    ... compute ...
    req.progress()      # finishes every step whose messages arrived, posts the next
    ... compute ...
    req.wait()          # polls (politely, watched) until all 2(N-1) steps are done

Step s < N-1 (reduce-scatter): send chunk (r-s-1) mod N to the right, receive
chunk (r-s-2) mod N from the left into a scratch buffer, then add it into the
buffer.  Step N-1+k (all-gather): send chunk (r-k) mod N, receive chunk
(r-k-1) mod N straight into the buffer.  Chunks follow the ``numpy.array_split``
rule.  The buffer (1-D, C-contiguous) is reduced **in place** — DDP reduces its
gradient buckets where they lie — and every rank ends bit-identical.

Several requests may be in flight between the same ranks at once (one per
bucket): each uses its own tag, ``nonblocking_tag(i)`` = ``TAG_BASE + i`` from
the non-blocking range of the tag table (:mod:`minipar.comm.tags`), and MPI
matches receives by tag, so neither a blocking collective (whose signatures
lie in another range) nor a pipeline message can take a bucket's message.

Formula the tests check: rank r sends 2S - bytes(chunk r) - bytes(chunk r+1)
(= 2(N-1)/N x S when N divides the length), as
:func:`minipar.collectives.cost.ring_allreduce_bytes` says, counted under the
operation name given (default ``"ring_iallreduce"``).
:class:`MPIIallreduceRequest` is the same interface over MPI's own
``Iallreduce``, for comparison (bytes not counted: MPI does not tell), and
:class:`BlockingAllreduceRequest` over a blocking all-reduce that is done
when it is built (recursive doubling for DDP's small buckets).
"""

from __future__ import annotations

import time
from typing import Any

import numpy as np
from mpi4py import MPI

from minipar import backend
from minipar.collectives import _base as B
from minipar.comm import tags as T
from minipar.comm.traced import TracedComm, TracedRequest

#: the tag of bucket i is TAG_BASE + i (the non-blocking range of minipar.comm.tags)
TAG_BASE = T.NONBLOCKING.first
nonblocking_tag = T.nonblocking_tag


def _check_buffer(buf: Any) -> np.ndarray:
    if (not isinstance(buf, np.ndarray) and not backend.on_device(buf)) or buf.ndim != 1 \
            or not buf.flags.c_contiguous:
        raise ValueError("a non-blocking all-reduce reduces a 1-D C-contiguous array (NumPy, "
                         "or the device's) in place; pass a contiguous slice of a flat buffer")
    if not getattr(buf.flags, "writeable", True):  # (a device array is: CuPy has no flag)
        raise ValueError("the buffer of a non-blocking all-reduce must be writeable")
    B.dtype_code(buf.dtype)
    return buf


def _check_tag(tag: int) -> int:
    if tag not in T.NONBLOCKING:
        raise ValueError(f"a non-blocking all-reduce's tag must lie in {T.NONBLOCKING.first}.."
                         f"{T.NONBLOCKING.last} (minipar.comm.tags: nonblocking_tag(i) = "
                         f"TAG_BASE + i), got {tag!r}")
    return int(tag)


class RingAllreduceRequest:
    """A ring all-reduce (sum) of ``buf`` in flight; ``progress()`` / ``wait()`` finish it.

    ``tag`` must differ between requests in flight at once (and be the same on
    every rank for the same buffer).  ``t_start`` / ``t_end`` (``time.perf_counter``
    seconds) record when it was posted and when its last step was seen complete.
    """

    def __init__(self, comm: Any, buf: np.ndarray, tag: int = TAG_BASE, op: str = "sum",
                 name: str = "ring_iallreduce") -> None:
        B.check_op(op)
        self.buf = _check_buffer(buf)
        self.ufunc = B.check_op(op, self.buf)
        self.name, self.tag = name, _check_tag(tag)
        self.comm: TracedComm = B.traced(comm)
        n, world = self.buf.size, self.comm.size
        self.counts = B.chunk_counts(n, world)
        self.offs = B.offsets_of(self.counts)
        self.total_steps = 2 * (world - 1)
        self.step = 0
        self.scratch = backend.array_module(buf).empty(max(self.counts), self.buf.dtype)
        self.reqs: list[TracedRequest] = []
        self.t_start = time.perf_counter()
        self.t_end: float | None = None
        if self.total_steps == 0:
            self.t_end = self.t_start
        else:
            self._post()

    @property
    def done(self) -> bool:
        return self.t_end is not None

    def _chunk(self, i: int) -> np.ndarray:
        return self.buf[self.offs[i]: self.offs[i] + self.counts[i]]

    def _post(self) -> None:
        c, s, world, r = self.comm, self.step, self.comm.size, self.comm.rank
        right, left = (r + 1) % world, (r - 1) % world
        if s < world - 1:  # reduce-scatter: receive into scratch, add afterwards
            send = self._chunk((r - s - 1) % world)
            self._recv_index = (r - s - 2) % world
            recv = self.scratch[: self.counts[self._recv_index]]
        else:  # all-gather: receive the finished chunk where it belongs
            k = s - (world - 1)
            send = self._chunk((r - k) % world)
            self._recv_index = (r - k - 1) % world
            recv = self._chunk(self._recv_index)
        with c.operation(self.name):
            self.reqs = [c.Irecv(recv, left, self.tag), c.Isend(send, right, self.tag)]

    def _complete(self) -> None:
        """Complete the current step's requests (counted once), as a clear error on a mismatch."""
        try:
            self.comm.waitall(self.reqs)
        except MPI.Exception as e:
            raise self._truncated(e) from None

    def _truncated(self, e: MPI.Exception) -> Exception:
        """MPI's truncation error (a longer message than our chunk) in words; others as they are."""
        if e.Get_error_class() != MPI.ERR_TRUNCATE:
            return e
        return B.CollectiveMismatchError(
            f"rank {self.comm.rank}: {self.name} (tag {self.tag}): rank "
            f"{(self.comm.rank - 1) % self.comm.size} sent more bytes than expected. "
            "Every rank must reduce buffers of the same length.")

    def _finish_step(self) -> None:
        """The step's messages are complete (and counted): reduce, then post the next step."""
        world = self.comm.size
        i = self._recv_index
        got = self.reqs[0].status.Get_count(MPI.BYTE)
        if got != self.counts[i] * self.buf.itemsize:
            raise B.CollectiveMismatchError(
                f"rank {self.comm.rank}: {self.name} (tag {self.tag}): expected "
                f"{self.counts[i] * self.buf.itemsize} bytes from rank {(self.comm.rank - 1) % world}, "
                f"received {got}. Every rank must reduce buffers of the same length.")
        if self.step < world - 1:
            mine = self._chunk(i)
            self.ufunc(mine, self.scratch[: self.counts[i]], out=mine)
        self.step += 1
        if self.step == self.total_steps:
            self.reqs = []
            self.t_end = time.perf_counter()
        else:
            self._post()

    def progress(self) -> bool:
        """Advance every step whose messages have arrived, without blocking; True when done."""
        while not self.done:
            try:  # Test completes a request (a receive is counted once, then)
                ready = all(r.Test() for r in self.reqs)
            except MPI.Exception as e:
                raise self._truncated(e) from None
            if not ready:
                return False
            self._finish_step()
        return True

    def wait(self) -> np.ndarray:
        """Finish all steps (polling politely, under the deadlock watchdog); the reduced buffer."""
        while not self.done:
            self._complete()
            self._finish_step()
        return self.buf


class MPIIallreduceRequest:
    """The same interface over MPI's own ``Iallreduce`` (in place), for comparison.

    A device buffer (MPI not CUDA-aware) is reduced in a host copy, staged each way
    and counted as the traced communicator stages its messages
    (:mod:`minipar.comm.staging`), and copied back when the request completes."""

    def __init__(self, comm: Any, buf: np.ndarray, tag: int = TAG_BASE, op: str = "sum",
                 name: str = "mpi_iallreduce") -> None:
        B.check_op(op)
        self.buf = _check_buffer(buf)
        self.name, self.tag = name, _check_tag(tag)
        self.comm: TracedComm = B.traced(comm)
        staged = backend.on_device(self.buf) and not backend.cuda_aware()
        host = backend.to_host(self.buf) if staged else self.buf
        a, dt, mop = B.mpi_spec(host, op)
        self.t_start = time.perf_counter()
        self.t_end: float | None = None
        with self.comm.operation(name):
            if staged:
                self.comm.stats.record_staged(name, self.comm.name, "d2h", host.nbytes)
            elif backend.on_device(self.buf):
                backend.synchronize()
            req = self.comm.comm.Iallreduce(MPI.IN_PLACE, B.mpi_buf(a, dt), mop)
        self.req = TracedRequest(self.comm, req, "Iallreduce", -1, self.tag,
                                 finish=self._copy_back(host) if staged else None)

    def _copy_back(self, host: np.ndarray) -> Any:
        def finish(status: Any) -> None:
            self.buf[...] = backend.to_device(host)
            self.comm.stats.record_staged(self.name, self.comm.name, "h2d", host.nbytes)
        return finish

    @property
    def done(self) -> bool:
        return self.t_end is not None

    def progress(self) -> bool:
        if not self.done and self.req.Test():
            self.t_end = time.perf_counter()
        return self.done

    def wait(self) -> np.ndarray:
        if not self.done:
            self.comm.waitall([self.req])
            self.t_end = time.perf_counter()
        return self.buf


class BlockingAllreduceRequest:
    """A blocking all-reduce (sum) of ``buf`` behind the same interface, done when built.

    For the algorithms with no non-blocking version here (``"recursive_doubling"``,
    ``"tree"``, ...: :func:`minipar.collectives.allreduce`): the whole reduction runs in
    the constructor, counted under ``name``, and its result is written back into
    ``buf`` (in place, as the other requests reduce); ``progress()`` and ``wait()``
    return at once.  DDP runs a small, latency-bound bucket this way
    (:mod:`minipar.parallel.data_parallel.ddp`).  Its messages carry the blocking
    collective's own tags, so they cannot meet a ring request's in flight."""

    def __init__(self, comm: Any, buf: np.ndarray, algorithm: str = "recursive_doubling",
                 name: str | None = None) -> None:
        from minipar.collectives import allreduce

        self.buf = _check_buffer(buf)
        self.comm: TracedComm = B.traced(comm)
        self.t_start = time.perf_counter()
        with self.comm.operation(name or f"{algorithm}_allreduce"):
            buf[...] = allreduce(self.comm, buf, algorithm=algorithm)
        self.t_end: float | None = time.perf_counter()

    @property
    def done(self) -> bool:
        return True

    def progress(self) -> bool:
        return True

    def wait(self) -> np.ndarray:
        return self.buf


def iallreduce(comm: Any, buf: np.ndarray, tag: int = TAG_BASE, algorithm: str = "ring",
               name: str | None = None) -> RingAllreduceRequest | MPIIallreduceRequest:
    """Start a non-blocking in-place sum of ``buf`` over all ranks: ``"ring"`` or ``"mpi"``."""
    B.check_algorithm(algorithm, ("ring", "mpi"), "non-blocking allreduce")
    if algorithm == "ring":
        return RingAllreduceRequest(comm, buf, tag, name=name or "ring_iallreduce")
    return MPIIallreduceRequest(comm, buf, tag, name=name or "mpi_iallreduce")
