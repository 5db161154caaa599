"""A traced communicator: counts every byte, waits politely, diagnoses deadlocks.

EN traced communicator · RU трассируемый коммуникатор · ZH 可追踪通信器

Every claim minipar makes about communication ("a ring all-reduce sends
2(N-1)/N x S bytes per rank, only to its neighbours") is checked by reading
the counters of this wrapper.  It wraps an mpi4py communicator and offers the
point-to-point calls collectives are built from, with mpi4py's upper-case
buffer signatures::

    comm = TracedComm(MPI.COMM_WORLD)
    with comm.operation("ring_allreduce"):
        comm.Sendrecv(chunk, dest=right, recvbuf=tmp, source=left)
    comm.stats.bytes_sent("ring_allreduce")       # bytes this rank sent
    comm.stats.peers_sent("ring_allreduce")       # {world rank: bytes}

Three things it adds to MPI:

1. **Counters.**  Bytes and messages sent and received, per operation name
   (the outermost ``operation(...)`` scope, ``"p2p"`` outside any) and per
   peer (as a rank of COMM_WORLD, so sub-communicators add up), plus the wall
   time spent inside each operation.  Sub-communicators made by ``Split``
   share their parent's :class:`Stats`: a rank's bytes are a rank's bytes.
2. **Polite waiting.**  A blocked MPICH rank spins on its core.  With more
   ranks than cores (8 ranks on a 2-core laptop) the waiting ranks starve the
   computing ones.  Every wait here polls ``Test()`` (``Iprobe()`` for
   :meth:`TracedComm.Probe`): for the first ``SPIN_S`` (500 us,
   ``MINIPAR_SPIN_S``) it calls ``os.sched_yield()`` between polls, so a
   short wait costs little latency yet hands the core to any rank that can
   run; after that it sleeps with a doubling back-off from 20 us up to
   ``MINIPAR_POLL_MAX_S`` (default 1 ms), so a long wait costs almost no CPU.
   ``minipar bench wait`` measures the CPU a waiting rank steals with MPI's
   blocking wait and with this one (``MINIPAR_SPIN_YIELD=0`` spins without
   yielding, for comparison).
3. **A deadlock watchdog.**  A wait longer than ``timeout`` seconds
   (``MINIPAR_WATCHDOG_S``, default 60) raises :class:`DeadlockError` naming
   the rank, the operation, the call, the peer and the tag.  Under
   ``python -m mpi4py`` (how :mod:`minipar.launch` starts ranks) the error
   aborts the whole job instead of leaving it hanging.

An unhandled exception on any rank prints ``[minipar] rank R of N failed``
(:func:`install_excepthook`, installed by the first TracedComm of a
multi-rank job) before ``python -m mpi4py`` aborts the job.

All messages travel as raw bytes (``MPI.BYTE``), so any NumPy dtype works,
float16 and bfloat16 included; buffers must be C-contiguous.
"""

from __future__ import annotations

import os
import time
from collections import defaultdict
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from mpi4py import MPI

WATCHDOG_ENV = "MINIPAR_WATCHDOG_S"
POLL_MAX_ENV = "MINIPAR_POLL_MAX_S"
DEFAULT_WATCHDOG_S = 60.0
DEFAULT_POLL_MAX_S = 1e-3
SPIN_ENV = "MINIPAR_SPIN_S"
YIELD_ENV = "MINIPAR_SPIN_YIELD"
SPIN_S = 500e-6  # poll (yielding the core) this long before the first sleep
NAP_MIN_S = 20e-6  # first sleep; each further sleep doubles, up to poll_max

ANY_SOURCE = MPI.ANY_SOURCE
ANY_TAG = MPI.ANY_TAG


class DeadlockError(RuntimeError):
    """A wait exceeded the watchdog timeout: no matching message arrived."""


class CommUsageError(ValueError):
    """A buffer or argument that cannot be communicated (e.g. non-contiguous)."""


@dataclass
class OpStats:
    """Counters of one operation name on one rank (bytes, messages, seconds)."""

    bytes_sent: int = 0
    bytes_recv: int = 0
    msgs_sent: int = 0
    msgs_recv: int = 0
    calls: int = 0
    seconds: float = 0.0


@dataclass
class Stats:
    """Everything one rank has sent and received, by operation and by peer."""

    ops: dict[str, OpStats] = field(default_factory=lambda: defaultdict(OpStats))
    #: (operation, world rank of peer) -> bytes
    sent_to: dict[tuple[str, int], int] = field(default_factory=lambda: defaultdict(int))
    recv_from: dict[tuple[str, int], int] = field(default_factory=lambda: defaultdict(int))

    def reset(self) -> None:
        self.ops.clear()
        self.sent_to.clear()
        self.recv_from.clear()

    def _sum(self, attr: str, op: str | None) -> int:
        if op is not None:
            return getattr(self.ops[op], attr) if op in self.ops else 0
        return sum(getattr(s, attr) for s in self.ops.values())

    def bytes_sent(self, op: str | None = None) -> int:
        """Bytes this rank sent, in operation ``op`` or in all."""
        return self._sum("bytes_sent", op)

    def bytes_recv(self, op: str | None = None) -> int:
        """Bytes this rank received, in operation ``op`` or in all."""
        return self._sum("bytes_recv", op)

    def msgs_sent(self, op: str | None = None) -> int:
        return self._sum("msgs_sent", op)

    def msgs_recv(self, op: str | None = None) -> int:
        return self._sum("msgs_recv", op)

    def seconds(self, op: str | None = None) -> float:
        if op is not None:
            return self.ops[op].seconds if op in self.ops else 0.0
        return sum(s.seconds for s in self.ops.values())

    def peers_sent(self, op: str | None = None) -> dict[int, int]:
        """{world rank: bytes sent to it}, in operation ``op`` or in all."""
        return _by_peer(self.sent_to, op)

    def peers_recv(self, op: str | None = None) -> dict[int, int]:
        """{world rank: bytes received from it}, in operation ``op`` or in all."""
        return _by_peer(self.recv_from, op)

    def as_dict(self) -> dict[str, Any]:
        """A JSON-friendly snapshot (peers as string keys)."""
        return {
            "ops": {k: vars(v).copy() for k, v in self.ops.items()},
            "sent_to": {f"{o}->{p}": b for (o, p), b in self.sent_to.items()},
            "recv_from": {f"{o}<-{p}": b for (o, p), b in self.recv_from.items()},
        }


def _by_peer(table: dict[tuple[str, int], int], op: str | None) -> dict[int, int]:
    out: dict[int, int] = defaultdict(int)
    for (o, peer), b in table.items():
        if op is None or o == op:
            out[peer] += b
    return dict(out)


def _env_float(name: str, default: float) -> float:
    raw = os.environ.get(name, "").strip()
    if not raw:
        return default
    try:
        value = float(raw)
    except ValueError:
        raise ValueError(f"{name}={raw!r} is not a number of seconds") from None
    if value <= 0:
        raise ValueError(f"{name}={raw!r} must be positive")
    return value


def as_bytes(buf: Any, *, what: str = "buffer") -> np.ndarray:
    """A uint8 view of a C-contiguous NumPy array (no copy); clear error otherwise."""
    a = np.asarray(buf) if not isinstance(buf, np.ndarray) else buf
    if not a.flags.c_contiguous:
        raise CommUsageError(
            f"{what} of shape {a.shape} is not C-contiguous; pass np.ascontiguousarray(x)"
        )
    return a.reshape(-1).view(np.uint8)


class TracedRequest:
    """A non-blocking request whose ``Wait`` polls and is watched."""

    def __init__(self, comm: TracedComm, req: MPI.Request, kind: str, peer: int, tag: int):
        self.comm, self.req, self.kind, self.peer, self.tag = comm, req, kind, peer, tag
        self.status = MPI.Status()

    def Test(self) -> bool:
        return bool(self.req.Test(self.status))

    def Wait(self) -> MPI.Status:
        self.comm.waitall([self])
        return self.status


class _Probe:
    """A pending ``Probe`` that the poll loop can Test like a request."""

    kind = "Probe"

    def __init__(self, comm: Any, peer: int, tag: int, status: MPI.Status):
        self.comm, self.peer, self.tag, self.status = comm, peer, tag, status

    def Test(self) -> bool:
        return bool(self.comm.Iprobe(self.peer, self.tag, self.status))


class TracedComm:
    """An mpi4py communicator wrapper with counters, polite waits and a watchdog.

    Anything not defined here (``Allreduce``, ``Bcast``, ... MPI's own
    collectives, used as oracles) is passed through to the wrapped
    communicator uncounted; use ``operation()`` around it to time it.
    """

    def __init__(
        self,
        comm: Any = None,
        *,
        timeout: float | None = None,
        stats: Stats | None = None,
    ) -> None:
        if isinstance(comm, TracedComm):
            comm = comm.comm
        self.comm = MPI.COMM_WORLD if comm is None else comm
        self.rank: int = self.comm.Get_rank()
        self.size: int = self.comm.Get_size()
        self.timeout = _env_float(WATCHDOG_ENV, DEFAULT_WATCHDOG_S) if timeout is None else timeout
        if self.timeout <= 0:
            raise ValueError(f"watchdog timeout must be positive, got {self.timeout}")
        self.poll_max = _env_float(POLL_MAX_ENV, DEFAULT_POLL_MAX_S)
        self.spin_s = _env_float(SPIN_ENV, SPIN_S)
        self.spin_yield = os.environ.get(YIELD_ENV, "1") != "0"
        self.stats = Stats() if stats is None else stats
        self._op_stack: list[str] = []
        # translate ranks of this communicator to COMM_WORLD ranks, for per-peer counts
        world = MPI.COMM_WORLD.Get_group()
        self.world_ranks: list[int] = list(
            MPI.Group.Translate_ranks(self.comm.Get_group(), list(range(self.size)), world)
        )
        self.world_rank: int = self.world_ranks[self.rank]
        if MPI.COMM_WORLD.Get_size() > 1:
            install_excepthook()

    # -- mpi4py look-alikes ------------------------------------------------
    def Get_rank(self) -> int:
        return self.rank

    def Get_size(self) -> int:
        return self.size

    def __getattr__(self, name: str) -> Any:  # MPI's own collectives, Get_group, ...
        if name == "comm":  # not yet set (during unpickling): avoid recursion
            raise AttributeError(name)
        return getattr(self.comm, name)

    def Split(self, color: int = 0, key: int = 0) -> TracedComm:
        """Sub-communicator sharing this one's counters and watchdog."""
        return TracedComm(self.comm.Split(color, key), timeout=self.timeout, stats=self.stats)

    def Dup(self) -> TracedComm:
        return TracedComm(self.comm.Dup(), timeout=self.timeout, stats=self.stats)

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
                s = self.stats.ops[name]
                s.calls += 1
                s.seconds += time.perf_counter() - t0

    # -- point-to-point ------------------------------------------------------
    def _check_peer(self, peer: int, call: str) -> None:
        if peer == ANY_SOURCE:
            return
        if not (0 <= peer < self.size):
            raise CommUsageError(
                f"rank {self.rank}: {call} with peer {peer} outside 0..{self.size - 1}"
            )

    def Isend(self, buf: Any, dest: int, tag: int = 0) -> TracedRequest:
        self._check_peer(dest, "Isend")
        b = as_bytes(buf, what="send buffer")
        req = self.comm.Isend([b, MPI.BYTE], dest=dest, tag=tag)
        op = self.current_op
        s = self.stats.ops[op]
        s.bytes_sent += b.nbytes
        s.msgs_sent += 1
        self.stats.sent_to[(op, self.world_ranks[dest])] += b.nbytes
        return TracedRequest(self, req, "Send", dest, tag)

    def Irecv(self, buf: Any, source: int = ANY_SOURCE, tag: int = ANY_TAG) -> TracedRequest:
        """Post a receive; bytes are counted when it completes (the real size)."""
        self._check_peer(source, "Irecv")
        b = as_bytes(buf, what="receive buffer")
        req = self.comm.Irecv([b, MPI.BYTE], source=source, tag=tag)
        r = TracedRequest(self, req, "Recv", source, tag)
        r.op = self.current_op  # type: ignore[attr-defined]
        return r

    def Send(self, buf: Any, dest: int, tag: int = 0) -> None:
        self.Isend(buf, dest, tag).Wait()

    def Recv(self, buf: Any, source: int = ANY_SOURCE, tag: int = ANY_TAG) -> MPI.Status:
        return self.Irecv(buf, source, tag).Wait()

    def Sendrecv(
        self,
        sendbuf: Any,
        dest: int,
        sendtag: int = 0,
        recvbuf: Any = None,
        source: int = ANY_SOURCE,
        recvtag: int = ANY_TAG,
    ) -> MPI.Status:
        """Send to ``dest`` and receive from ``source`` at once (no deadlock in a ring).

        Both are posted (``Irecv`` first, then ``Isend``) and waited for
        together by the polite, watched poll.  (Probing politely for the
        incoming message, then receiving it with MPI's blocking ``Recv``, was
        tried: no consistent gain in ``minipar bench collectives``, 4 ranks on
        2 shared cores.)
        """
        if recvbuf is None:
            raise CommUsageError("Sendrecv needs a recvbuf")
        r = self.Irecv(recvbuf, source, recvtag)
        s = self.Isend(sendbuf, dest, sendtag)
        self.waitall([r, s])
        return r.status

    def Barrier(self) -> None:
        """A barrier that waits politely (MPI's Ibarrier, polled)."""
        req = TracedRequest(self, self.comm.Ibarrier(), "Barrier", -1, -1)
        self.waitall([req])

    def Probe(self, source: int = ANY_SOURCE, tag: int = ANY_TAG) -> MPI.Status:
        """Wait (politely, watched) until a message from ``source`` can be received.

        Returns its status: ``Get_count(MPI.BYTE)`` is its size, so a receiver
        can allocate a buffer for a message whose length it does not know.
        """
        self._check_peer(source, "Probe")
        status = MPI.Status()
        if not self.comm.Iprobe(source, tag, status):
            probe = _Probe(self.comm, source, tag, status)
            self._poll([probe])  # type: ignore[list-item]
        return status

    # -- waiting -------------------------------------------------------------
    def _poll(self, requests: list[TracedRequest]) -> None:
        """Test until all complete: spin SPIN_S, then sleep with a doubling back-off."""
        pending = [r for r in requests if not r.Test()]
        if not pending:
            return
        t0 = time.perf_counter()
        deadline = t0 + self.timeout
        nap = 0.0
        while pending:
            now = time.perf_counter()
            if now > deadline:
                raise self._deadlock(pending)
            if now - t0 > self.spin_s:  # spin briefly, then back off to poll_max
                nap = min(self.poll_max, max(2 * nap, NAP_MIN_S))
                time.sleep(nap)
            elif self.spin_yield:
                os.sched_yield()
            pending = [r for r in pending if not r.Test()]

    def waitall(self, requests: list[TracedRequest]) -> None:
        """Poll until every request completes; past ``timeout`` raise DeadlockError."""
        self._poll(requests)
        for r in requests:
            if r.kind == "Recv":
                n = r.status.Get_count(MPI.BYTE)
                op = getattr(r, "op", self.current_op)
                st = self.stats.ops[op]
                st.bytes_recv += n
                st.msgs_recv += 1
                src = r.status.Get_source()
                if 0 <= src < self.size:
                    self.stats.recv_from[(op, self.world_ranks[src])] += n

    def _deadlock(self, pending: list[TracedRequest]) -> DeadlockError:
        parts = []
        for r in pending:
            if r.kind == "Barrier":
                parts.append("Barrier (some rank never reached it)")
                continue
            peer = "any rank" if r.peer == ANY_SOURCE else f"rank {r.peer}"
            tag = "any tag" if r.tag == ANY_TAG else f"tag {r.tag}"
            where = "to" if r.kind == "Send" else "from"
            parts.append(f"{r.kind} {where} {peer} ({tag})")
        return DeadlockError(
            f"rank {self.rank} (world rank {self.world_rank}): operation "
            f"{self.current_op!r} waited more than {self.timeout:g} s for "
            + "; ".join(parts)
            + ". Likely a deadlock: the peer never posted the matching call "
            "(both ranks receiving first, a mismatched tag, or a rank that "
            f"skipped the operation). Watchdog: {WATCHDOG_ENV}."
        )


def install_excepthook() -> None:
    """Make an unhandled exception on a rank say which rank failed, then abort.

    Under ``python -m mpi4py`` an unhandled exception aborts the whole job
    (MPICH then prints ``rank R in comm 0``); this hook first prints
    ``[minipar] rank R of N failed: Type: message`` on stderr, above the
    traceback, so a learner sees at once which rank broke and why the others
    stopped.  Idempotent; TracedComm installs it when the world has > 1 rank.
    """
    import sys

    previous = sys.excepthook
    if getattr(previous, "_minipar", False):
        return

    def hook(kind: type[BaseException], value: BaseException, tb: Any) -> None:
        world = MPI.COMM_WORLD
        sys.stderr.write(
            f"[minipar] rank {world.Get_rank()} of {world.Get_size()} failed: "
            f"{kind.__name__}: {value}\n[minipar] the whole job is aborted "
            "(python -m mpi4py calls MPI_Abort); the traceback of that rank follows.\n"
        )
        previous(kind, value, tb)

    hook._minipar = True  # type: ignore[attr-defined]
    sys.excepthook = hook


def traced(comm: Any = None, **kwargs: Any) -> TracedComm:
    """``comm`` as a TracedComm (returned unchanged if it already is one)."""
    if isinstance(comm, TracedComm) and not kwargs:
        return comm
    return TracedComm(comm, **kwargs)
