"""Waiting for messages: politely (the core goes to ranks that compute), watched, guarded.

EN polling wait, deadlock watchdog · RU ожидание опросом, сторож взаимоблокировок ·
ZH 轮询等待, 死锁看门狗

Three things happen while a rank waits in a :class:`~minipar.comm.traced.TracedComm`:

1. **Polite waiting.**  A blocked MPICH rank spins on its core.  With more
   ranks than cores (8 ranks on a 2-core laptop) the waiting ranks starve the
   computing ones.  Every wait here polls ``Test()`` (``Iprobe()`` for a
   probe): for the first ``SPIN_S`` (500 us, ``MINIPAR_SPIN_S``) it calls
   ``os.sched_yield()`` between polls, so a short wait costs little latency
   yet hands the core to any rank that can run; after that it sleeps with a
   doubling back-off from 20 us up to ``MINIPAR_POLL_MAX_S`` (default 1 ms),
   so a long wait costs almost no CPU.  ``minipar bench wait`` measures it
   (``MINIPAR_SPIN_YIELD=0`` spins without yielding, for comparison).
2. **A deadlock watchdog.**  A wait longer than ``timeout`` seconds
   (``MINIPAR_WATCHDOG_S``, default 60) raises :class:`DeadlockError` naming
   the rank, the operation, the call, the peer and the tag.
3. **The mismatch guard.**  Receives match the tag they expect (never
   ``ANY_TAG``), so a collective never takes a pipeline message, a
   non-blocking all-reduce's or another collective's.  Yet when ranks call
   *different* blocking collectives, the expected message never comes; the
   guard turns that into a :class:`CollectiveMismatchError` within
   milliseconds instead of a watchdog timeout a minute later.

**The guard's rule, and why it is sound.**  While a receive for a blocking
collective's signature A (:mod:`minipar.comm.tags`) from peer p is pending
past the spinning phase, probe p for *any* tag.  MPI's probe reports the
*earliest* message from p not yet matched by any receive (MPI 4.1 §3.5,
non-overtaking: a probe matches as a receive would).  Suppose it reports a
blocking-collective signature B != A.  Then either (a) p's A message was
already matched by our receive, whose data is still arriving, or (b) p sent
B before any A we are waiting for.  In a correct program (b) is impossible:
blocking collectives are called in the same order on every rank of a
communicator, each sends all its messages of one signature, and every
message a collective sends is received within that call; so p cannot have
sent a message of a later collective B before the A messages of the current
one, and every message of an earlier collective has been received.  Hence
(b) means the ranks called different collectives.  (a) and (b) are told
apart by cancelling our receive (``MPI_Cancel``): a cancel succeeds only on
a receive no message has matched, and a match is final, so "cancelled" means
A was unmatched then and at the probe, i.e. (b).  A cancel that fails leaves
the receive to complete as usual.  Messages with any other tag (a pipeline
send, a non-blocking all-reduce's bucket) are left alone: they are ordered
with nothing, so they prove nothing; if one of them is the earliest from p,
a mismatch behind it is found by the watchdog instead.  Probes for a
signature (a receive of unknown length) are guarded the same way, and need
no cancel.
"""

from __future__ import annotations

import os
import time
from collections.abc import Sequence
from typing import Any, Protocol

from mpi4py import MPI

from minipar.comm import tags as T
from minipar.comm.errors import CollectiveMismatchError, DeadlockError

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


def env_float(name: str, default: float) -> float:
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


def wait_settings(timeout: float | None) -> tuple[float, float, float, bool]:
    """(watchdog timeout, longest nap, spinning time, yield while spinning), from the environment.

    ``timeout`` (seconds) overrides ``MINIPAR_WATCHDOG_S``; it must be positive.
    """
    t = env_float(WATCHDOG_ENV, DEFAULT_WATCHDOG_S) if timeout is None else timeout
    if t <= 0:
        raise ValueError(f"watchdog timeout must be positive, got {t}")
    return (t, env_float(POLL_MAX_ENV, DEFAULT_POLL_MAX_S), env_float(SPIN_ENV, SPIN_S),
            os.environ.get(YIELD_ENV, "1") != "0")


class Waiter(Protocol):
    """What the poll loop needs of a communicator (a TracedComm)."""

    comm: Any
    rank: int
    size: int
    world_rank: int
    timeout: float
    poll_max: float
    spin_s: float
    spin_yield: bool
    current_op: str


def mismatch(c: Waiter, expected: int, got: int, source: int) -> CollectiveMismatchError:
    return CollectiveMismatchError(
        f"rank {c.rank}: expected {T.describe_tag(expected)} from rank {source} but received "
        f"{T.describe_tag(got)}. Every rank must call the same collective with the same "
        "op and the same dtype (and, for all_gather and all_to_all, the same trailing shape)."
    )


def _rival(c: Waiter, peer: int, accept: Sequence[int]) -> int | None:
    """The tag of the earliest message pending from ``peer`` if it proves a mismatch."""
    st = MPI.Status()
    if c.comm.Iprobe(peer, ANY_TAG, st):  # diagnostic only: nothing is received here
        tag = st.Get_tag()
        if tag not in accept and T.is_collective_tag(tag):
            return tag
    return None


class TracedRequest:
    """A non-blocking request whose ``Wait`` polls and is watched.

    A receive is counted (bytes, message, peer) once, when it first completes,
    however many times it is tested or waited for.
    """

    def __init__(self, comm: Any, req: MPI.Request, kind: str, peer: int, tag: int,
                 op: str | None = None, finish: Any = None):
        self.comm, self.req, self.kind, self.peer, self.tag = comm, req, kind, peer, tag
        self.op = comm.current_op if op is None else op  # the operation a receive counts in
        self.status = MPI.Status()
        self.done = False
        self._rival: int | None = None  # set when the guard cancelled this receive
        #: run once on completion, given the status (host staging: minipar.comm.staging)
        self.finish = finish

    def Test(self) -> bool:
        if self.done:
            return True
        if not self.req.Test(self.status):
            return False
        self.done = True
        if self._rival is not None and self.status.Is_cancelled():
            raise mismatch(self.comm, self.tag, self._rival, self.peer)
        if self.kind == "Recv":
            self.comm._count_recv(self)
        if self.finish is not None:
            finish, self.finish = self.finish, None
            finish(self.status)
        return True

    def Wait(self) -> MPI.Status:
        self.comm.waitall([self])
        return self.status

    def guard(self) -> None:
        """The mismatch guard (see the module docstring): cancel if a rival is pending."""
        if (self.kind == "Recv" and self._rival is None and self.peer >= 0
                and T.is_collective_tag(self.tag)):
            rival = _rival(self.comm, self.peer, (self.tag,))
            if rival is not None:
                self._rival = rival
                self.req.Cancel()  # fails (harmlessly) if a message already matched


class PendingProbe:
    """A ``Probe`` for any of ``tags`` from ``peer`` that the poll loop can Test.

    With one tag it is ``Iprobe(peer, tag)``.  With several (a broadcast of
    unknown dtype accepts its signature for every dtype) the earliest
    message from ``peer`` decides when it carries one of them; when it is
    another operation's message, each tag is probed and exactly one may be
    pending: two would leave the order between them unknown.
    """

    kind = "Probe"

    def __init__(self, comm: Any, peer: int, tags: Sequence[int], status: MPI.Status):
        self.comm, self.peer, self.tags, self.status = comm, peer, tuple(tags), status
        self.tag = self.tags[0] if len(self.tags) == 1 else -2  # -2: "one of several"
        self.guarded = peer >= 0 and all(T.is_collective_tag(t) for t in self.tags)

    def Test(self) -> bool:
        c = self.comm.comm
        if len(self.tags) == 1:
            return bool(c.Iprobe(self.peer, self.tags[0], self.status))
        st = MPI.Status()
        if c.Iprobe(self.peer, ANY_TAG, st) and st.Get_tag() in self.tags:
            return bool(c.Iprobe(self.peer, st.Get_tag(), self.status))
        hits = [t for t in self.tags if c.Iprobe(self.peer, t)]
        if len(hits) > 1:
            raise CollectiveMismatchError(
                f"rank {self.comm.rank}: messages {', '.join(T.describe_tag(t) for t in hits)} "
                f"from rank {self.peer} are all pending behind another operation's message, in "
                "an order MPI cannot tell; pass arrays (not None) to say which is expected.")
        return bool(hits) and bool(c.Iprobe(self.peer, hits[0], self.status))

    def guard(self) -> None:
        if self.guarded:
            rival = _rival(self.comm, self.peer, self.tags)
            if rival is not None:
                raise mismatch(self.comm, self.tags[0], rival, self.peer)


def poll(c: Waiter, requests: Sequence[Any]) -> None:
    """Test until all complete: spin ``spin_s``, then sleep with a doubling back-off.

    In the sleeping phase every guarded pending receive or probe runs the
    mismatch guard; past ``timeout`` seconds, :class:`DeadlockError`.
    """
    pending = [r for r in requests if not r.Test()]
    if not pending:
        return
    t0 = time.perf_counter()
    deadline = t0 + c.timeout
    nap = 0.0
    while pending:
        now = time.perf_counter()
        if now > deadline:
            raise deadlock(c, pending)
        if now - t0 > c.spin_s:  # spin briefly, then back off to poll_max
            for r in pending:
                r.guard()
            nap = min(c.poll_max, max(2 * nap, NAP_MIN_S))
            time.sleep(nap)
        elif c.spin_yield:
            os.sched_yield()
        pending = [r for r in pending if not r.Test()]


def deadlock(c: Waiter, pending: Sequence[Any]) -> DeadlockError:
    parts = []
    for r in pending:
        if r.kind == "Barrier":
            parts.append("Barrier (some rank never reached it)")
            continue
        peer = "any rank" if r.peer == ANY_SOURCE else f"rank {r.peer}"
        if r.tag == ANY_TAG:
            tag = "any tag"
        elif r.tag == -2:
            tag = f"any of {len(r.tags)} tags, e.g. {r.tags[0]}: {T.describe_tag(r.tags[0])}"
        elif r.tag in T.USER:
            tag = f"tag {r.tag}"
        else:
            tag = f"tag {r.tag}: {T.describe_tag(r.tag)}"
        where = "to" if r.kind == "Send" else "from"
        parts.append(f"{r.kind} {where} {peer} ({tag})")
    return DeadlockError(
        f"rank {c.rank} (world rank {c.world_rank}): operation "
        f"{c.current_op!r} waited more than {c.timeout:g} s for "
        + "; ".join(parts)
        + ". Likely a deadlock: the peer never posted the matching call "
        "(both ranks receiving first, a mismatched tag, or a rank that "
        f"skipped the operation). Watchdog: {WATCHDOG_ENV}."
    )
