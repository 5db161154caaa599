"""Communication counters: bytes and messages by operation, by communicator, by peer.

EN communication statistics · RU статистика обменов · ZH 通信统计

One :class:`Stats` object per process holds everything the rank sent and
received.  Every :class:`~minipar.comm.traced.TracedComm` of the process made
from one parent (``Split``, ``Dup``) writes into the same object, so
"a rank's bytes are a rank's bytes", and each count is kept three ways:

* by **operation**: the outermost ``comm.operation(name)`` scope, ``"p2p"``
  outside any (``bytes_sent("ring_allreduce")``);
* by **communicator name**: ``"world"``, or the names a process grid gives
  its axes (``"dp"``, ``"pp"``, ``"tp"``, ``"cp"``, ``"ep"``), so a run can say
  "tp sent X bytes, dp sent Y" (``bytes_sent_by_comm()``,
  ``bytes_sent(comm="tp")``);
* by **peer**, as a rank of COMM_WORLD, so sub-communicators add up
  (``peers_sent("ring_allreduce")`` -> ``{world rank: bytes}``), and by peer on each
  communicator (``peers_sent_on("dp")``: with the ranks' hosts, what crossed hosts).

Bytes are payload bytes (``buffer.nbytes`` sent, ``Get_count(MPI.BYTE)``
received); a received message is counted once, when its request first
completes.
"""

from __future__ import annotations

import contextlib
from collections import defaultdict
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any


@dataclass
class OpStats:
    """Counters of one operation name on one rank (bytes, messages, seconds)."""

    bytes_sent: int = 0
    bytes_recv: int = 0
    msgs_sent: int = 0
    msgs_recv: int = 0
    calls: int = 0
    seconds: float = 0.0
    #: device bytes copied to host memory before a send, and from it after a receive
    #: (the device boundary: a GPU backend with an MPI library that is not CUDA-aware)
    staged_d2h: int = 0
    staged_h2d: int = 0


def _ops() -> dict[str, OpStats]:
    return defaultdict(OpStats)


def _table() -> dict[tuple[str, int], int]:
    return defaultdict(int)


@dataclass
class Stats:
    """Everything one rank has sent and received, by operation, communicator and peer."""

    #: operation -> counters, over all communicators
    ops: dict[str, OpStats] = field(default_factory=_ops)
    #: (operation, world rank of peer) -> bytes
    sent_to: dict[tuple[str, int], int] = field(default_factory=_table)
    recv_from: dict[tuple[str, int], int] = field(default_factory=_table)
    #: (communicator name, world rank of peer) -> bytes sent (what crossed hosts)
    sent_on: dict[tuple[str, int], int] = field(default_factory=_table)
    #: communicator name -> operation -> counters
    comms: dict[str, dict[str, OpStats]] = field(default_factory=lambda: defaultdict(_ops))
    #: while set (:meth:`set_aside`), every record goes there instead
    aside: Stats | None = None

    @contextlib.contextmanager
    def set_aside(self) -> Iterator[Stats]:
        """Count what runs inside in a separate :class:`Stats` (yielded), not in this one:
        a run's validation passes and checkpoints, so that its per-step figures are the
        steps' own."""
        other, before = Stats(), self.aside
        self.aside = other
        try:
            yield other
        finally:
            self.aside = before

    # -- recording (called by TracedComm) ----------------------------------------
    def record_send(self, op: str, comm: str, peer: int, nbytes: int) -> None:
        """One message of ``nbytes`` sent to world rank ``peer``."""
        if self.aside is not None:
            return self.aside.record_send(op, comm, peer, nbytes)
        a, b = self.ops[op], self.comms[comm][op]
        a.bytes_sent += nbytes
        b.bytes_sent += nbytes
        a.msgs_sent += 1
        b.msgs_sent += 1
        self.sent_to[(op, peer)] += nbytes
        self.sent_on[(comm, peer)] += nbytes

    def record_recv(self, op: str, comm: str, peer: int | None, nbytes: int) -> None:
        """One message of ``nbytes`` received (from world rank ``peer``, when known)."""
        if self.aside is not None:
            return self.aside.record_recv(op, comm, peer, nbytes)
        a, b = self.ops[op], self.comms[comm][op]
        a.bytes_recv += nbytes
        b.bytes_recv += nbytes
        a.msgs_recv += 1
        b.msgs_recv += 1
        if peer is not None:
            self.recv_from[(op, peer)] += nbytes

    def record_call(self, op: str, comm: str, seconds: float) -> None:
        """One call of operation ``op`` that took ``seconds``."""
        if self.aside is not None:
            return self.aside.record_call(op, comm, seconds)
        for s in (self.ops[op], self.comms[comm][op]):
            s.calls += 1
            s.seconds += seconds

    def record_staged(self, op: str, comm: str, direction: str, nbytes: int) -> None:
        """``nbytes`` of a device buffer staged through host memory, ``direction`` "d2h"
        (before a send) or "h2d" (after a receive)."""
        if self.aside is not None:
            return self.aside.record_staged(op, comm, direction, nbytes)
        attr = "staged_" + direction
        for s in (self.ops[op], self.comms[comm][op]):
            setattr(s, attr, getattr(s, attr) + nbytes)

    def reset(self) -> None:
        self.ops.clear()
        self.sent_to.clear()
        self.sent_on.clear()
        self.recv_from.clear()
        self.comms.clear()

    # -- reading --------------------------------------------------------------------
    def _sum(self, attr: str, op: str | None, comm: str | None) -> Any:
        if comm is None:
            table = self.ops
        elif comm in self.comms:
            table = self.comms[comm]
        else:
            return 0
        if op is not None:
            return getattr(table[op], attr) if op in table else 0
        return sum(getattr(s, attr) for s in table.values())

    def bytes_sent(self, op: str | None = None, comm: str | None = None) -> int:
        """Bytes this rank sent, in operation ``op`` (or all), on communicator ``comm`` (or all)."""
        return self._sum("bytes_sent", op, comm)

    def bytes_recv(self, op: str | None = None, comm: str | None = None) -> int:
        """Bytes this rank received, in operation ``op`` (or all), on ``comm`` (or all)."""
        return self._sum("bytes_recv", op, comm)

    def bytes_staged(self, direction: str, op: str | None = None,
                     comm: str | None = None) -> int:
        """Device bytes staged through host memory, ``direction`` "d2h" (sends) or "h2d"
        (receives); 0 under NumPy or with a CUDA-aware MPI."""
        return self._sum("staged_" + direction, op, comm)

    def msgs_sent(self, op: str | None = None, comm: str | None = None) -> int:
        return self._sum("msgs_sent", op, comm)

    def msgs_recv(self, op: str | None = None, comm: str | None = None) -> int:
        return self._sum("msgs_recv", op, comm)

    def seconds(self, op: str | None = None, comm: str | None = None) -> float:
        return float(self._sum("seconds", op, comm))

    def bytes_sent_by_comm(self) -> dict[str, int]:
        """{communicator name: bytes this rank sent on it}."""
        return {name: sum(s.bytes_sent for s in t.values()) for name, t in self.comms.items()}

    def bytes_recv_by_comm(self) -> dict[str, int]:
        """{communicator name: bytes this rank received on it}."""
        return {name: sum(s.bytes_recv for s in t.values()) for name, t in self.comms.items()}

    def peers_sent(self, op: str | None = None) -> dict[int, int]:
        """{world rank: bytes sent to it}, in operation ``op`` or in all."""
        return _by_peer(self.sent_to, op)

    def peers_sent_on(self, comm: str) -> dict[int, int]:
        """{world rank: bytes sent to it} on communicator ``comm`` (a grid's axis)."""
        return {p: b for (c, p), b in self.sent_on.items() if c == comm}

    def peers_recv(self, op: str | None = None) -> dict[int, int]:
        """{world rank: bytes received from it}, in operation ``op`` or in all."""
        return _by_peer(self.recv_from, op)

    def as_dict(self) -> dict[str, Any]:
        """A JSON-friendly snapshot (peers as string keys)."""
        return {
            "ops": {k: vars(v).copy() for k, v in self.ops.items()},
            "sent_to": {f"{o}->{p}": b for (o, p), b in self.sent_to.items()},
            "recv_from": {f"{o}<-{p}": b for (o, p), b in self.recv_from.items()},
            "comms": {c: {k: vars(v).copy() for k, v in t.items()} for c, t in self.comms.items()},
            "bytes_sent_by_comm": self.bytes_sent_by_comm(),
            "bytes_recv_by_comm": self.bytes_recv_by_comm(),
        }


def _by_peer(table: dict[tuple[str, int], int], op: str | None) -> dict[int, int]:
    out: dict[int, int] = defaultdict(int)
    for (o, peer), b in table.items():
        if op is None or o == op:
            out[peer] += b
    return dict(out)
