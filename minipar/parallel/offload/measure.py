"""What the memory techniques hold and move — что держат и перемещают — 内存技术的占用与搬运.

EN activation bytes held, by place; bytes and seconds offloaded · RU байты активаций по
месту; выгруженные байты и секунды · ZH 按位置统计的激活字节；卸载的字节与耗时

The measurements behind the formulas :mod:`minipar.parallel.remat` and
:mod:`minipar.parallel.offload` state, taken around their cores (which count
nothing themselves):

* :func:`kept_by_place` — a walk's activation bytes on device, host and disk,
  read off the executor's ``kept`` list: with ``device₀`` the bytes a plain walk
  holds after forward and ``M`` the bytes an offload moved out,
  ``device = device₀ − M``, ``host (or disk) = M`` (tests/test_offload.py);
* :class:`ActivationLedger` — hooks around a
  :class:`~minipar.parallel.remat.Checkpointing` (or any hooks) that count the bytes of
  activations they hold, from ``on_saved`` until the unit's ``on_grads``, each buffer
  once: ``bytes_now``, ``bytes_peak``, and on the device ``device_now``,
  ``device_peak`` (a pipeline stage's ``StageMemory``, ``MemoryWrap``'s summary, the
  remat benchmark and exercise);
* :class:`MeteredStore` — a :class:`~minipar.parallel.offload.store.Store` that counts
  the bytes it moved out and back, what lies out now and at most, and the seconds;
* :class:`MeteredOptimizerOffload` — an
  :class:`~minipar.parallel.offload.optimizer.OptimizerOffload` that counts the bytes
  over the link per step (b·Ψ/N down, b·Ψ/N up) and the seconds of its host step.
"""

from __future__ import annotations

import itertools
import time
import weakref
from typing import Any

from minipar.memory import Ledger, bytes_by_place, place_of
from minipar.nn.executor import Hooks
from minipar.parallel.offload.optimizer import OptimizerOffload
from minipar.parallel.offload.store import Offloaded, Store
from minipar.parallel.remat import Segment, Whole
from minipar.trees import arrays, owner

__all__ = ["ActivationLedger", "MeteredOptimizerOffload", "MeteredStore", "kept_by_place"]


def kept_by_place(kept: list[Any]) -> dict[str, int]:
    """Activation bytes of an executor's ``kept`` list by place (device, host, disk),
    each buffer once; Checkpointing's segments (their checkpoint) and kept-whole units
    are looked into."""
    trees, seen = [], set()
    for k in kept:
        if isinstance(k, Segment):
            if id(k) not in seen:
                seen.add(id(k))
                trees.append(k.x)
        elif isinstance(k, Whole):
            trees.append(k.kept)
        else:
            trees.append(k)
    return bytes_by_place(trees)


def _holds(kept: Any) -> list[Any]:
    """The trees a kept object holds now: a segment's checkpoint and recomputed ``saved``,
    a kept-whole unit's, or the tree itself."""
    if isinstance(kept, Segment):
        return [kept.x, *kept.saved]
    if isinstance(kept, Whole):
        return [kept.kept]
    return [kept]


class ActivationLedger(Hooks):
    """The activation bytes ``hooks`` hold (a :class:`~minipar.parallel.remat.Checkpointing`,
    or any hooks), each buffer once, from ``on_saved`` until the unit's ``on_grads`` (or,
    zero bubble, its B's end): what ``on_saved`` kept, a segment's recomputed ``saved``
    while backward walks it, and the ``saved`` handed to backward.  ``bytes_now``,
    ``bytes_peak``; ``device_now``, ``device_peak``: those still on the device.

    Put it right around the Checkpointing (whose kept objects, segments and kept-whole
    units, keep their identity until their backward), or outermost around other hooks.
    It knows a buffer by its ``id`` *and* a weak reference to it: an offload wrapped
    around it (``Offload(ActivationLedger(Checkpointing(...)), store)``) frees the buffers
    it moves out, and a new buffer may get a dead one's id, which an id alone would take
    for the old one.  A held buffer that died was moved out (host or disk), one still
    alive is on the device (an offload handle is where its ``place`` says)."""

    def __init__(self, hooks: Hooks) -> None:
        self.inner = hooks
        self.held: dict[Any, list[Any]] = {}  # buffer key -> [bytes, references, weakref]
        self._kept: dict[int, dict[Any, int]] = {}  # id(kept object) -> its buffers held
        self._lent: dict[int, dict[Any, int]] = {}  # id(unit) -> what restore handed out
        self._alive: dict[int, tuple[Any, Any]] = {}  # id -> (weak reference, key)
        self._serial = itertools.count()
        self.bytes_now = self.bytes_peak = self.device_peak = 0

    @property
    def grads(self) -> dict[str, Any]:  # type: ignore[override]
        return self.inner.grads

    def _on_device(self, key: Any) -> bool:
        """A held buffer still alive on the device (not moved out, not an offload handle)."""
        ref = self.held[key][2]
        return ref is None or (ref() is not None and place_of(ref()) == "device")

    @property
    def device_now(self) -> int:
        """Bytes of the held buffers still alive on the device (not moved out)."""
        return sum(entry[0] for key, entry in self.held.items() if self._on_device(key))

    def reset_peak(self) -> None:
        """Start a new peak from what is held now (between measured steps)."""
        self.bytes_peak, self.device_peak = self.bytes_now, self.device_now

    def _key(self, r: Any) -> tuple[Any, Any]:
        """(key, weak reference): the buffer's id and a serial number (a new buffer at a
        dead one's address is a new entry); its id alone if it takes no weak reference."""
        known = self._alive.get(id(r))
        if known is not None and known[0]() is r:
            return known[1], known[0]
        try:
            ref = weakref.ref(r)
        except TypeError:
            return id(r), None
        key = (id(r), next(self._serial))
        self._alive[id(r)] = (ref, key)
        return key, ref

    def _hold(self, trees: list[Any]) -> dict[Any, int]:
        """Count the buffers of ``trees`` as held; returns them for :meth:`_drop`."""
        bufs = {}
        for r in map(owner, arrays(trees)):
            key, ref = self._key(r)
            bufs[key] = int(r.nbytes)
            self.held.setdefault(key, [int(r.nbytes), 0, ref])
        for key in bufs:
            entry = self.held[key]
            entry[1] += 1
            if entry[1] == 1:
                self.bytes_now += entry[0]
        self.bytes_peak = max(self.bytes_peak, self.bytes_now)
        self.device_peak = max(self.device_peak, self.device_now)
        return bufs

    def _drop(self, bufs: dict[Any, int]) -> None:
        for key in bufs:
            entry = self.held[key]
            entry[1] -= 1
            if entry[1] == 0:
                self.bytes_now -= entry[0]
                del self.held[key]

    # -- the hooks, passed on -------------------------------------------------------
    def fetch(self, unit: Any) -> dict[str, Any]:
        return self.inner.fetch(unit)

    def release(self, unit: Any, params: dict[str, Any]) -> None:
        self.inner.release(unit, params)

    def on_saved(self, unit: Any, saved: Any, x: Any) -> Any:
        kept = self.inner.on_saved(unit, saved, x)
        if id(kept) not in self._kept:  # a segment's later units keep the same object
            self._kept[id(kept)] = self._hold(_holds(kept))
        return kept

    def restore(self, unit: Any, kept: Any) -> Any:
        """What the kept object held before (a segment's checkpoint) and after (its
        recomputed ``saved``) are both counted at the peak, then the old is dropped.  A
        checkpoint the recompute freed as it went was on the device all through it."""
        old = self._kept.pop(id(kept))
        before = [key for key in old if self._on_device(key)]
        out = self.inner.restore(unit, kept)
        if isinstance(kept, Segment) and kept.units:  # the segment lives on
            self._kept[id(kept)] = self._hold(_holds(kept))
        self._lent[id(unit)] = self._hold([out])
        freed = sum(self.held[key][0] for key in before if not self._on_device(key))
        self.device_peak = max(self.device_peak, self.device_now + freed)
        self._drop(old)
        return out

    def _give_back(self, unit: Any) -> None:
        lent = self._lent.pop(id(unit), None)
        if lent is not None:
            self._drop(lent)

    def on_backward_input(self, unit: Any) -> None:
        """A zero-bubble B is done: the unit's ``saved`` is dropped (what W keeps is
        counted apart, by the pipeline engine)."""
        self._give_back(unit)
        self.inner.on_backward_input(unit)

    def on_grads(self, unit: Any, grads: dict[str, Any]) -> None:
        self._give_back(unit)
        self.inner.on_grads(unit, grads)


class MeteredStore(Store):
    """A :class:`~minipar.parallel.offload.store.Store` that counts: ``moved`` (bytes
    ``to_host``, ``to_disk``, ``to_device``, cumulative), ``held`` (bytes out now, by
    place), ``peak`` (the most out at once since :meth:`reset_peak`), ``seconds``
    (``out``, ``back``: the time spent moving)."""

    def __init__(self, target: str = "host", folder: str | None = None) -> None:
        super().__init__(target, folder)
        self.moved = {"to_host": 0, "to_disk": 0, "to_device": 0}
        self.held = {"host": 0, "disk": 0}
        self.peak = dict(self.held)
        self.seconds = {"out": 0.0, "back": 0.0}

    def reset_peak(self) -> None:
        self.peak = dict(self.held)

    def ledger(self, rank: int = 0) -> Ledger:
        """Activation bytes offloaded now, one row per place (host, disk)."""
        led = Ledger(rank)
        for place, b in self.held.items():
            led.entries.append(("activations", f"offloaded to {place}", b))
            led.places.append(place)
        return led

    def put(self, flat: Any) -> Offloaded:
        h = super().put(flat)
        self.moved["to_host" if h.place == "host" else "to_disk"] += h.nbytes
        self.held[h.place] += h.nbytes
        self.peak[h.place] = max(self.peak[h.place], self.held[h.place])
        return h

    def get(self, h: Offloaded) -> Any:
        self.moved["to_device"] += h.nbytes
        self.held[h.place] -= h.nbytes
        return super().get(h)

    def out(self, tree: Any, min_bytes: int = 0) -> Any:
        t0 = time.perf_counter()
        res = super().out(tree, min_bytes)
        self.seconds["out"] += time.perf_counter() - t0
        return res

    def back(self, tree: Any) -> Any:
        t0 = time.perf_counter()
        res = super().back(tree)
        self.seconds["back"] += time.perf_counter() - t0
        return res


class MeteredOptimizerOffload(OptimizerOffload):
    """An :class:`~minipar.parallel.offload.optimizer.OptimizerOffload` that counts:
    ``offloaded_bytes`` (master + moments moved off the device), ``moved`` (bytes over
    the link, cumulative: ``to_host`` the gradient slices, ``to_device`` the updated
    parameters), ``steps`` taken and ``seconds`` in :meth:`step` (copies and the host
    update)."""

    def __init__(self, states: Any, target: str = "host", folder: str | None = None) -> None:
        super().__init__(states, target, folder)
        self.offloaded_bytes = sum(int(a.nbytes) for a in self.state_arrays())
        self.moved = {"to_host": 0, "to_device": 0}
        self.seconds, self.steps = 0.0, 0

    def state_arrays(self) -> list[Any]:
        """The offloaded arrays (master first when there is one), for a ledger."""
        st = self.states
        return ([] if st.master is None else [st.master]) + list(st.optimizer.state_arrays())

    def step(self, found_inf: bool | None = None) -> bool:
        st, t0 = self.states, time.perf_counter()
        done = super().step(found_inf)
        n = st.hi - st.lo
        self.moved["to_host"] += n * st.grads.dtype.itemsize
        if done:
            self.moved["to_device"] += n * st.params.dtype.itemsize
            self.steps += 1
        self.seconds += time.perf_counter() - t0
        return done
