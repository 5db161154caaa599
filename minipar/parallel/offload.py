"""Offloading — выгрузка (оффлоадинг) — 卸载: saved activations out to host or disk and back.

EN offloading (activation offload; ZeRO-Infinity's NVMe tier) · RU выгрузка
активаций на хост или диск · ZH 激活卸载（主机内存 / 磁盘）

Between a unit's forward and its backward its ``saved`` (the activations,
:mod:`minipar.nn.executor`) sits idle — for the whole rest of the forward and
most of the backward.  Offloading moves it off the accelerator as soon as
forward made it and brings it back just before backward needs it
(ZeRO-Offload, Ren et al. 2021, arXiv 2101.06840; ZeRO-Infinity, Rajbhandari
et al. 2021, arXiv 2104.07857, which adds NVMe as a tier and offloads the
activation checkpoints).  Two tiers, through :mod:`minipar.backend`:

* ``"host"`` — CuPy: a real device→host copy into pinned memory, queued on a
  side stream (asynchronous: the next unit's forward runs while it copies);
  NumPy: host and device are the same RAM, so the copy frees nothing, but the
  bytes are accounted in their own ledger column (``../shared/ARCHITECTURE.md`` §8);
* ``"disk"`` — each buffer written to a ``numpy.memmap`` file in a private
  temporary folder and dropped from memory: a real drop in resident memory on
  any machine (tracemalloc shows it); read back and deleted in backward.  No
  ``flush``: the operating system writes the pages back in the background, the
  way ZeRO-Infinity's NVMe writes overlap compute (an msync per buffer measured
  about 3x the time of the whole move here).

Moved are *buffers*, each once (:mod:`minipar.parallel.offload_store`, the
tiers): q, k and v of one attention are views of one qkv array; the buffer
goes out once and the three views are rebuilt on the restored buffer (same
offsets, strides and dtypes).  The values come back bit
for bit, so training is bit-identical to no offload (tests/test_offload.py).

The bookkeeping the tests check: with ``device₀`` the activation bytes a
plain walk holds after forward and ``M`` the bytes this class moved out,

    device = device₀ − M,    host (or disk) = M,    moved back = M after backward

(``minipar.memory.bytes_by_place`` of the executor's ``kept`` list), and with
disk, tracemalloc's bytes held after forward drop by M (up to the handles'
few hundred bytes each).  The time cost is measured: ``seconds["out"]``,
``seconds["back"]``.  :class:`Offload` wraps any hooks, like
:class:`~minipar.parallel.checkpointing.Checkpointing`, and composes with it:
``Offload(Checkpointing(h, units), "disk")`` offloads the checkpoints (each
segment's input) and the last segment kept whole.  The optimizer-state half of
ZeRO-Offload is :mod:`minipar.parallel.offload_optimizer`.
"""

from __future__ import annotations

from typing import Any

from minipar.memory import Ledger, bytes_by_place
from minipar.nn.executor import Hooks
from minipar.parallel.checkpointing import Checkpointing, _Segment, _Whole
from minipar.parallel.offload_store import TARGETS, Offloaded, Store, _View, check_target

__all__ = ["TARGETS", "MemoryWrap", "Offload", "Offloaded", "Store", "check_target",
           "kept_by_place", "remat_offload_wrapper"]


class Offload(Hooks):
    """Hooks that move ``saved`` out after forward and back before backward:
    ``Offload(hooks, target="host"|"disk", folder=None, min_bytes=0)``.

    ``hooks``: the wrapped hooks (serial, DDP's, ZeRO's, a
    :class:`~minipar.parallel.checkpointing.Checkpointing`); ``folder``: where disk
    offload makes its private folder; ``min_bytes``: smaller buffers stay.  Counters
    (the :class:`Store`'s): ``moved``, ``held``, ``peak``, ``seconds``; :meth:`ledger`
    is what is offloaded now.  Other attributes (``grads``, DDP's ``finish``, ZeRO's
    ``peak_gathered_bytes``, Checkpointing's ``bytes_peak``) are the wrapped hooks'."""

    def __init__(self, hooks: Hooks, target: str = "host", folder: str | None = None,
                 min_bytes: int = 0) -> None:
        if isinstance(min_bytes, bool) or not isinstance(min_bytes, int) or min_bytes < 0:
            raise ValueError(f"min_bytes must be an integer >= 0, got {min_bytes!r}")
        self.inner, self.store, self.min_bytes = hooks, Store(target, folder), min_bytes
        self.target = self.store.target

    def __getattr__(self, name: str) -> Any:  # only for names not found on self
        if name in ("inner", "store"):
            raise AttributeError(name)
        return getattr(self.inner, name)

    @property
    def grads(self) -> dict[str, Any]:  # type: ignore[override]
        return self.inner.grads

    moved = property(lambda self: self.store.moved)
    held = property(lambda self: self.store.held)
    peak = property(lambda self: self.store.peak)
    seconds = property(lambda self: self.store.seconds)

    def reset_peak(self) -> None:
        self.store.reset_peak()
        if hasattr(self.inner, "reset_peak"):
            self.inner.reset_peak()

    def close(self) -> None:
        self.store.close()

    def ledger(self, rank: int = 0) -> Ledger:
        """Activation bytes offloaded now, one row per place (host, disk)."""
        led = Ledger(rank)
        for place, b in self.store.held.items():
            led.entries.append(("activations", f"offloaded to {place}", b))
            led.places.append(place)
        return led

    # -- the hooks ------------------------------------------------------------------
    def fetch(self, unit: Any) -> dict[str, Any]:
        return self.inner.fetch(unit)

    def release(self, unit: Any, params: dict[str, Any]) -> None:
        self.inner.release(unit, params)

    def on_saved(self, unit: Any, saved: Any, x: Any) -> Any:
        kept = self.inner.on_saved(unit, saved, x)
        if isinstance(kept, _Segment):  # a checkpoint: its input, once per segment
            if kept.x is not None and not isinstance(kept.x, _View):
                kept.x = self.store.out(kept.x, self.min_bytes)
            return kept
        if isinstance(kept, _Whole):
            kept.kept = self.store.out(kept.kept, self.min_bytes)
            return kept
        return self.store.out(kept, self.min_bytes)

    def restore(self, unit: Any, kept: Any) -> Any:
        if isinstance(kept, _Segment):
            if isinstance(kept.x, _View):
                kept.x = self.store.back(kept.x)
        elif isinstance(kept, _Whole):
            kept.kept = self.store.back(kept.kept)
        else:
            kept = self.store.back(kept)
        return self.inner.restore(unit, kept)

    def on_grads(self, unit: Any, grads: dict[str, Any]) -> None:
        self.inner.on_grads(unit, grads)


def kept_by_place(kept: list[Any]) -> dict[str, int]:
    """Activation bytes of an executor's ``kept`` list by place (device, host, disk),
    each buffer once; Checkpointing's segments (their checkpoint) and kept-whole units
    are looked into."""
    trees, seen = [], set()
    for k in kept:
        if isinstance(k, _Segment):
            if id(k) not in seen:
                seen.add(id(k))
                trees.append(k.x)
        elif isinstance(k, _Whole):
            trees.append(k.kept)
        else:
            trees.append(k)
    return bytes_by_place(trees)


class MemoryWrap:
    """``(hooks, units) -> hooks``: remat, offload or both around a strategy's hooks
    (``DataParallel(wrap_hooks=...)``, ``ZeRO(wrap_hooks=...)``, the pipeline's stages).

    Keeps every wrapper it made (``made``) so a run can report what they held and moved
    (:meth:`summary`)."""

    def __init__(self, remat: int | None = None, offload: str | None = None,
                 folder: str | None = None, selective: bool = False) -> None:
        if remat is not None and (isinstance(remat, bool) or not isinstance(remat, int)
                                  or remat < 0):
            raise ValueError(f"remat interval must be an integer >= 1 (0: ceil(sqrt n)), "
                             f"got {remat!r}")
        if offload is not None:
            check_target(offload, folder)
        self.remat, self.offload, self.folder, self.selective = remat, offload, folder, selective
        self.made: list[Hooks] = []

    def __call__(self, hooks: Hooks, units: Any) -> Hooks:
        h = hooks
        if self.selective:
            h = Checkpointing(h, units, selective=True)
        elif self.remat is not None:
            h = Checkpointing(h, units, every=self.remat or None)
        if self.offload is not None:
            h = Offload(h, self.offload, self.folder)
        self.made.append(h)
        return h

    def summary(self, last: int | None = None) -> dict[str, Any]:
        """Activation bytes held at most (remat's ledger), bytes moved and seconds (offload),
        over the wrappers made (the ``last`` ones only, if given)."""
        out: dict[str, Any] = {"remat": self.remat, "offload": self.offload}
        made = self.made if last is None else self.made[-last:]
        cks = [h.inner if isinstance(h, Offload) else h for h in made]
        # with offload, the device's share: what was moved out no longer counts
        peaks = [c.device_peak if self.offload else c.bytes_peak
                 for c in cks if isinstance(c, Checkpointing)]
        if peaks:
            out["remat_activation_peak_bytes"] = max(peaks)
        offs = [h for h in made if isinstance(h, Offload)]
        if offs:
            out["offload_bytes_out"] = sum(o.moved["to_host"] + o.moved["to_disk"] for o in offs)
            out["offload_bytes_back"] = sum(o.moved["to_device"] for o in offs)
            out["offload_peak_bytes"] = max(max(o.peak.values()) for o in offs)
            out["offload_seconds"] = sum(o.seconds["out"] + o.seconds["back"] for o in offs)
        return out


def remat_offload_wrapper(remat: int | None = None, offload: str | None = None,
                          folder: str | None = None) -> MemoryWrap | None:
    """A :class:`MemoryWrap`, or None when neither remat nor offload is asked for."""
    if remat is None and offload is None:
        return None
    return MemoryWrap(remat, offload, folder)
