"""How much communication was hidden behind computation: one figure, one name.

EN communication overlap · RU перекрытие обменов с вычислениями · ZH 通信与计算重叠

Every run that overlaps communication with computation (DDP's buckets, ZeRO-3's
prefetch, tensor parallelism's decomposed GEMMs, DualPipe's overlapped pairs)
records, per rank, when it computed and when a message was in flight, as
``(start, end)`` intervals in seconds.  The share of the communication time
that fell inside some computation is

    hidden_fraction = |comm ∩ compute| / |comm|

with each side first merged into disjoint intervals, so two messages in flight
at once count once.  1.0: every byte moved while the rank computed; 0.0: the
rank computed nothing while it waited.  Every run summary and benchmark that
reports overlap uses this function and this key, ``hidden_fraction``.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterable, Sequence
from typing import Any

Interval = tuple[float, float]


def merge(intervals: Iterable[Sequence[float]]) -> list[Interval]:
    """The union of ``intervals`` as disjoint ``(start, end)`` pairs, sorted; empty ones dropped."""
    out: list[list[float]] = []
    for a, b in sorted((float(a), float(b)) for a, b in intervals):
        if b < a:
            raise ValueError(f"an interval ends before it starts: ({a}, {b})")
        if b == a:
            continue
        if out and a <= out[-1][1]:
            out[-1][1] = max(out[-1][1], b)
        else:
            out.append([a, b])
    return [(a, b) for a, b in out]


def total(intervals: Iterable[Sequence[float]]) -> float:
    """Seconds covered by ``intervals`` (overlaps counted once)."""
    return sum(b - a for a, b in merge(intervals))


def overlap(xs: Iterable[Sequence[float]], ys: Iterable[Sequence[float]]) -> float:
    """Seconds covered by both ``xs`` and ``ys``."""
    x, y = merge(xs), merge(ys)
    i = j = 0
    both = 0.0
    while i < len(x) and j < len(y):
        lo, hi = max(x[i][0], y[j][0]), min(x[i][1], y[j][1])
        both += max(0.0, hi - lo)
        if x[i][1] < y[j][1]:
            i += 1
        else:
            j += 1
    return both


def hidden_fraction(compute: Iterable[Sequence[float]],
                    comm: Iterable[Sequence[float]]) -> float | None:
    """Share of ``comm``'s time covered by ``compute`` (None when nothing was communicated)."""
    comm = merge(comm)
    spent = sum(b - a for a, b in comm)
    if spent == 0.0:
        return None
    return overlap(compute, comm) / spent


def minus(xs: Iterable[Sequence[float]], holes: Iterable[Sequence[float]]) -> list[Interval]:
    """``xs`` without ``holes`` (both merged first): e.g. computing time less the waits
    for a message that ran inside it."""
    out, hs = [], merge(holes)
    for a, b in merge(xs):
        for h0, h1 in hs:
            if h1 <= a or h0 >= b:
                continue
            if h0 > a:
                out.append((a, h0))
            a = max(a, h1)
        if b > a:
            out.append((a, b))
    return out


# -- DualPipe's overlapped pair on one core: two computations that hand over to each other

class Pair:
    """Two computations, ``first`` and ``second``, run as coroutines: one at a time, the
    running one handing over (:func:`handoff`) when it has started a message and has
    nothing to do until it arrives — DeepSeek-V3's F&B (arXiv 2412.19437, §3.2.1: one
    micro-batch's all-to-all travels while the other computes).  ``second`` starts at
    ``first``'s first handoff (on a thread of its own: a coroutine the code deep inside a
    layer can yield from; never two running at once); without a handoff it runs after
    ``first``, as a plain call.  ``seconds[i]``, ``cpu[i]``: the wall and CPU seconds
    computation i held the core (its own computing, whatever it waited for in between)."""

    def __init__(self, first: Callable[[], Any], second: Callable[[], Any]) -> None:
        self.fns, self.turn, self.done = (first, second), 0, [False, False]
        self.cv = threading.Condition()
        self.thread: threading.Thread | None = None
        self.error: BaseException | None = None
        self.seconds, self.cpu = [0.0, 0.0], [0.0, 0.0]
        self._since = (0.0, 0.0)

    @property
    def interleaved(self) -> bool:
        """Did the two computations take turns (a handoff happened)?"""
        return self.thread is not None

    def run(self) -> None:
        """Both computations, to their ends; the first error raised here."""
        self._go(0)
        if self.error is None and self.thread is None:
            self._go(1)
        elif self.error is None:
            self._hand(0, 1)
            self.thread.join()
        if self.error is not None:  # (a second half left waiting: the job ends with it)
            raise self.error

    def _go(self, i: int) -> None:
        """Run computation i on this thread, in the pair, its time counted."""
        _here.pair, _here.i = self, i
        self._since = (time.perf_counter(), time.process_time())
        try:
            self.fns[i]()
        except BaseException as e:  # noqa: BLE001 - re-raised by run() on the calling thread
            self.error = self.error or e
        finally:
            self._count(i)
            _here.pair = None
            self.done[i] = True

    def _count(self, i: int) -> None:
        self.seconds[i] += time.perf_counter() - self._since[0]
        self.cpu[i] += time.process_time() - self._since[1]

    def _thread(self) -> None:
        with self.cv:
            self.cv.wait_for(lambda: self.turn == 1)
        self._go(1)
        self._hand(1, 0)

    def _hand(self, i: int, j: int, wait: bool = False) -> None:
        """Computation i gives the core to j (and, ``wait``, takes it back when j hands over
        or ends)."""
        with self.cv:
            self.turn = j
            self.cv.notify_all()
            if wait:
                self.cv.wait_for(lambda: self.turn == i)

    def handoff(self, i: int) -> None:
        other = 1 - i
        if self.done[other] or self.error is not None:
            return
        self._count(i)
        if other == 1 and self.thread is None:
            self.thread = threading.Thread(target=self._thread, daemon=True,
                                           name="overlapped pair, second half")
            self.thread.start()
        self._hand(i, other, wait=True)
        self._since = (time.perf_counter(), time.process_time())
        if self.error is not None:
            raise RuntimeError("the other computation of the overlapped pair failed")


_here = threading.local()
_flights: list[Any] | None = None


def handoff() -> None:
    """Inside a :class:`Pair`: let the other computation run until it hands back (or ends);
    anywhere else nothing (the caller then simply waits for its message)."""
    pair = getattr(_here, "pair", None)
    if pair is not None:
        pair.handoff(_here.i)


def in_flight(request: Any) -> None:
    """A message was started (``request``: ``progress()``, ``t_start``, ``t_end``,
    ``blocked``): noted for whoever records this step (:func:`record`), then
    :func:`handoff`."""
    if _flights is not None:
        _flights.append(request)
    handoff()


def record() -> None:
    """From now on note every request :func:`in_flight` sees (a step's start)."""
    global _flights
    _flights = []


def recorded() -> list[Any]:
    """The requests noted since :func:`record`; noting stops."""
    global _flights
    out, _flights = _flights or [], None
    return out


def progress() -> None:
    """Test the noted requests still in flight (called between units, as DDP's buckets are
    progressed): the ones that arrived get their end time there."""
    for r in _flights or ():
        if r.t_end is None:
            r.progress()
