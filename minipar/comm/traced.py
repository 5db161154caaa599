"""A traced communicator: counts every byte, waits politely, diagnoses deadlocks.

EN traced communicator · RU трассируемый коммуникатор · ZH 可追踪通信器

Every claim minipar makes about communication ("a ring all-reduce sends
2(N-1)/N x S bytes per rank, only to its neighbours") is checked by reading
the counters of this wrapper.  It wraps an mpi4py communicator and offers the
point-to-point calls collectives are built from, with mpi4py's upper-case
buffer signatures::

    comm = TracedComm(MPI.COMM_WORLD)                  # named "world"
    with comm.operation("ring_allreduce"):
        comm.Sendrecv(chunk, dest=right, recvbuf=tmp, source=left)
    comm.stats.bytes_sent("ring_allreduce")            # bytes this rank sent
    comm.stats.peers_sent("ring_allreduce")            # {world rank: bytes}
    tp = comm.Split(color, key, name="tp")             # shares comm.stats
    comm.stats.bytes_sent_by_comm()                    # {"world": ..., "tp": ...}

What it adds to MPI, one file each: **counters** (:mod:`minipar.comm.stats`)
by operation name (the outermost ``operation(...)`` scope, ``"p2p"`` outside
any), by communicator name and by peer (a rank of COMM_WORLD), shared by
``Split``/``Dup`` children; **polite, watched, guarded waits**
(:mod:`minipar.comm.waiting`): idle ranks yield the CPU, a
:class:`DeadlockError` names rank, operation, peer and tag past a timeout,
receives take only their own tag (:mod:`minipar.comm.tags`) and a rank that
called another collective is named in a :class:`CollectiveMismatchError` at
once; **clear failures** (:mod:`minipar.comm.errors`): ``[minipar] rank R of
N failed`` before ``python -m mpi4py`` aborts the job.

:func:`traced` wraps a plain mpi4py communicator **once**: the wrapper is
cached on the communicator (an MPI attribute, MPI 4.1 §7.7), so counters
accumulate across calls, and the cache goes when the communicator is freed.

All messages travel as raw bytes (``MPI.BYTE``), so any NumPy dtype works,
float16 and bfloat16 included; buffers must be C-contiguous.  Device arrays (a GPU
backend) cross to MPI through :mod:`minipar.comm.staging`, the device boundary.
"""

from __future__ import annotations

import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any

from mpi4py import MPI

from minipar.comm import staging
from minipar.comm.errors import CommUsageError, install_excepthook
from minipar.comm.stats import Stats
from minipar.comm.waiting import (
    ANY_SOURCE,
    ANY_TAG,
    PendingProbe,
    TracedRequest,
    poll,
    wait_settings,
)


def _world_ranks(comm: Any, world_comm: Any = None) -> list[int]:
    """COMM_WORLD's rank of each rank of ``comm`` (the groups made for it are freed)."""
    mine = comm.Get_group()
    world = (MPI.COMM_WORLD if world_comm is None else world_comm).Get_group()
    try:
        return list(MPI.Group.Translate_ranks(mine, list(range(comm.Get_size())), world))
    finally:
        mine.Free()
        world.Free()


class TracedComm:
    """An mpi4py communicator wrapper with counters, polite waits and a watchdog.

    ``name`` labels this communicator's traffic in the shared :class:`Stats`
    ("world" for COMM_WORLD unless given).  MPI's own methods that minipar uses
    (its collectives as the oracle of tests and benchmarks, ``Get_group``, ...)
    are passed through by name (:data:`PASSED_THROUGH`), each call counted under
    ``"mpi." + name`` with its time; anything else is an ``AttributeError``, so
    no MPI traffic goes past the counters unseen.
    """

    def __init__(self, comm: Any = None, *, timeout: float | None = None,
                 stats: Stats | None = None, name: str | None = None) -> None:
        if isinstance(comm, TracedComm):
            comm = comm.comm
        self.comm = MPI.COMM_WORLD if comm is None else comm
        self.rank: int = self.comm.Get_rank()
        self.size: int = self.comm.Get_size()
        # the watchdog's timeout and the poll loop's timings (minipar.comm.waiting)
        self.timeout, self.poll_max, self.spin_s, self.spin_yield = wait_settings(timeout)
        self.stats = Stats() if stats is None else stats
        self.name: str = name if name is not None else _default_name(self.comm)
        self._op_stack: list[str] = []
        self._children = 0  # Split/Dup made from this one: names "<name>/split<k>"
        # translate ranks of this communicator to COMM_WORLD ranks, for per-peer counts
        self.world_ranks: list[int] = _world_ranks(self.comm)
        self.world_rank: int = self.world_ranks[self.rank]
        if MPI.COMM_WORLD.Get_size() > 1:
            install_excepthook()

    # -- mpi4py look-alikes ------------------------------------------------
    def Get_rank(self) -> int:
        return self.rank

    def Get_size(self) -> int:
        return self.size

    def _child_name(self, kind: str, name: str | None) -> str:
        k, self._children = self._children, self._children + 1
        return name if name is not None else f"{self.name}/{kind}{k}"

    def Split(self, color: int = 0, key: int = 0, name: str | None = None) -> TracedComm:
        """Sub-communicator sharing this one's counters and watchdog (collective).
        Unnamed children are called ``"<parent>/split<k>"``, k counting this
        parent's children (the same on every rank: Split is collective)."""
        label = self._child_name("split", name)
        return TracedComm(_named(self.comm.Split(color, key), label), timeout=self.timeout,
                          stats=self.stats, name=label)

    def Dup(self, name: str | None = None) -> TracedComm:
        """A copy of this communicator (its own message space) sharing the counters."""
        label = self._child_name("dup", name)
        return TracedComm(_named(self.comm.Dup(), label), timeout=self.timeout,
                          stats=self.stats, name=label)

    def Free(self) -> None:
        """Free the wrapped communicator (collective); COMM_WORLD and COMM_SELF stay.
        The wrapper is unusable afterwards; a second Free does nothing."""
        if self.comm in (MPI.COMM_WORLD, MPI.COMM_SELF, MPI.COMM_NULL):
            return
        self.comm.Free()

    # -- operation scopes ----------------------------------------------------
    @property
    def current_op(self) -> str:
        return self._op_stack[0] if self._op_stack else "p2p"

    @contextmanager
    def operation(self, name: str) -> Iterator[TracedComm]:
        """Count everything inside under ``name`` (the outermost scope wins)."""
        outermost = not self._op_stack
        self._op_stack.append(name)
        t0 = time.perf_counter()
        try:
            yield self
        finally:
            self._op_stack.pop()
            if outermost:
                self.stats.record_call(name, self.name, time.perf_counter() - t0)

    # -- point-to-point ------------------------------------------------------
    def _check_peer(self, peer: int, call: str) -> None:
        if peer != ANY_SOURCE and not (0 <= peer < self.size):
            raise CommUsageError(f"rank {self.rank}: {call} with peer {peer} outside "
                                 f"0..{self.size - 1}")

    def _count_recv(self, r: TracedRequest) -> None:
        """Count a completed receive (called once per request, by its first completion)."""
        src = r.status.Get_source()
        peer = self.world_ranks[src] if 0 <= src < self.size else None
        self.stats.record_recv(r.op, self.name, peer, r.status.Get_count(MPI.BYTE))

    def Isend(self, buf: Any, dest: int, tag: int = 0) -> TracedRequest:
        self._check_peer(dest, "Isend")
        op = self.current_op
        b, finish = staging.outgoing(buf, self.stats, op, self.name)
        req = self.comm.Isend([b, MPI.BYTE], dest=dest, tag=tag)
        self.stats.record_send(op, self.name, self.world_ranks[dest], b.nbytes)
        return TracedRequest(self, req, "Send", dest, tag, op, finish)

    def Irecv(self, buf: Any, source: int = ANY_SOURCE, tag: int = ANY_TAG) -> TracedRequest:
        """Post a receive; bytes are counted when it completes (the real size)."""
        self._check_peer(source, "Irecv")
        op = self.current_op
        b, finish = staging.incoming(buf, self.stats, op, self.name)
        req = self.comm.Irecv([b, MPI.BYTE], source=source, tag=tag)
        return TracedRequest(self, req, "Recv", source, tag, op, finish)

    def Send(self, buf: Any, dest: int, tag: int = 0) -> None:
        self.Isend(buf, dest, tag).Wait()

    def Recv(self, buf: Any, source: int = ANY_SOURCE, tag: int = ANY_TAG) -> MPI.Status:
        return self.Irecv(buf, source, tag).Wait()

    def Sendrecv(self, sendbuf: Any, dest: int, sendtag: int = 0, recvbuf: Any = None,
                 source: int = ANY_SOURCE, recvtag: int = ANY_TAG) -> MPI.Status:
        """Send to ``dest`` and receive from ``source`` at once (no deadlock in a ring).

        Both are posted (``Irecv`` first) and tested once; only what is still in flight
        is wrapped as :class:`TracedRequest` and waited for by the polite, watched poll:
        every ring step calls this, so a message already there costs no request object
        and no poll loop.  (Probing politely, then MPI's blocking ``Recv``, was tried: no
        consistent gain in ``minipar bench collectives``, 4 ranks on 2 shared cores.)
        """
        if recvbuf is None:
            raise CommUsageError("Sendrecv needs a recvbuf")
        self._check_peer(source, "Irecv"), self._check_peer(dest, "Isend")
        op, st = self.current_op, MPI.Status()
        rb, rfinish = staging.incoming(recvbuf, self.stats, op, self.name)
        sb, sfinish = staging.outgoing(sendbuf, self.stats, op, self.name)
        rreq = self.comm.Irecv([rb, MPI.BYTE], source=source, tag=recvtag)
        sreq = self.comm.Isend([sb, MPI.BYTE], dest=dest, tag=sendtag)
        self.stats.record_send(op, self.name, self.world_ranks[dest], sb.nbytes)
        if rreq.Test(st):
            self.stats.record_recv(op, self.name, self.world_ranks[st.Get_source()],
                                   st.Get_count(MPI.BYTE))
            if rfinish is not None:
                rfinish(st)
            done = sreq.Test()
            todo = [] if done else [TracedRequest(self, sreq, "Send", dest, sendtag, op, sfinish)]
            if done and sfinish is not None:
                sfinish(None)
        else:
            r = TracedRequest(self, rreq, "Recv", source, recvtag, op, rfinish)
            r.status = st
            todo = [r, TracedRequest(self, sreq, "Send", dest, sendtag, op, sfinish)]
        if todo:
            self.waitall(todo)
        return st

    def Barrier(self) -> None:
        """A barrier that waits politely (MPI's Ibarrier, polled)."""
        req = TracedRequest(self, self.comm.Ibarrier(), "Barrier", -1, -1, self.current_op)
        self.waitall([req])

    def Probe(self, source: int = ANY_SOURCE, tag: int = ANY_TAG) -> MPI.Status:
        """Wait (politely, watched) until a message from ``source`` can be received; its
        status's ``Get_count(MPI.BYTE)`` sizes a buffer for a message of unknown length."""
        return self.probe_tags(source, (tag,))

    def probe_tags(self, source: int, tags: Sequence[int]) -> MPI.Status:
        """:meth:`Probe` for a message with any of ``tags`` (e.g. one signature per dtype)."""
        self._check_peer(source, "Probe")
        status = MPI.Status()
        self.waitall([PendingProbe(self, source, tags, status)])  # type: ignore[list-item]
        return status

    # -- waiting -------------------------------------------------------------
    def waitall(self, requests: Sequence[TracedRequest]) -> None:
        """Poll until every request completes; past ``timeout`` raise DeadlockError.
        Receives are counted as they complete, once each (a request waited twice: once)."""
        poll(self, requests)


def _default_name(comm: Any) -> str:
    """"world", "self", or the name MPI has for ``comm`` ("comm" if none)."""
    if comm == MPI.COMM_WORLD or comm == MPI.COMM_SELF:
        return "world" if comm == MPI.COMM_WORLD else "self"
    return comm.Get_name() or "comm"


def _named(comm: Any, name: str) -> Any:
    comm.Set_name(name)  # MPI's own name too: MPI's error messages then say it
    return comm


_KEYVAL: list[int] = []


def traced(comm: Any = None, **kwargs: Any) -> TracedComm:
    """``comm`` as a TracedComm: the same wrapper for the same communicator every time.

    A TracedComm is returned unchanged.  A plain mpi4py communicator (or None:
    COMM_WORLD) is wrapped on first use and the wrapper cached on it (an MPI
    attribute), so counters accumulate across calls.  With keyword arguments
    (``timeout=``, ``stats=``, ``name=``) a new, uncached wrapper is made.
    """
    if isinstance(comm, TracedComm) and not kwargs:
        return comm
    if kwargs:
        return TracedComm(comm, **kwargs)
    plain = MPI.COMM_WORLD if comm is None else comm
    if not _KEYVAL:
        _KEYVAL.append(MPI.Comm.Create_keyval())  # no copy_fn: Dup does not inherit it
    cached = plain.Get_attr(_KEYVAL[0])
    if cached is None:
        cached = TracedComm(plain)
        plain.Set_attr(_KEYVAL[0], cached)
    return cached


#: MPI's own methods a TracedComm passes through, each call counted (``record_call``
#: under ``"mpi." + name``): the collectives are the oracle of tests and benchmarks
PASSED_THROUGH = (
    "Allgather", "Allgatherv", "Allreduce", "Alltoall", "Alltoallv", "Bcast", "Gather",
    "Reduce", "Reduce_scatter", "Scatter", "Iallreduce", "Ibarrier", "Iprobe",
    "allgather", "allreduce", "alltoall", "bcast", "gather", "reduce", "scatter",
    "Abort", "Get_group", "Get_name", "Set_name", "Get_attr", "Set_attr",
)


def _passed_through(name: str) -> Any:
    def call(self: TracedComm, *args: Any, **kwargs: Any) -> Any:
        t0 = time.perf_counter()
        try:
            if staging.any_device(args, kwargs):
                return staging.mpi_collective(self, name, args, kwargs)
            return getattr(self.comm, name)(*args, **kwargs)
        finally:
            self.stats.record_call("mpi." + name, self.name, time.perf_counter() - t0)

    call.__name__ = call.__qualname__ = name
    call.__doc__ = f"MPI's ``{name}`` on the wrapped communicator; the call is counted."
    return call


for _name in PASSED_THROUGH:
    setattr(TracedComm, _name, _passed_through(_name))
