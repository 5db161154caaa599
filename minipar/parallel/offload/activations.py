"""Activation offloading — выгрузка активаций — 激活卸载: saved activations out to host or disk and back.

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
  bytes are accounted in their own ledger column (``../shared/ARCHITECTURE.md`` §5);
* ``"disk"`` — each buffer written to a ``numpy.memmap`` file in a private
  temporary folder and dropped from memory: a real drop in resident memory on
  any machine (tracemalloc shows it); read back and deleted in backward.  No
  ``flush``: the operating system writes the pages back in the background, the
  way ZeRO-Infinity's NVMe writes overlap compute (an msync per buffer measured
  about 3x the time of the whole move here).

Moved are *buffers*, each once (:mod:`minipar.parallel.offload.store`, the
tiers): q, k and v of one attention are views of one qkv array; the buffer
goes out once and the three views are rebuilt on the restored buffer (same
offsets, strides and dtypes).  The values come back bit
for bit, so training is bit-identical to no offload (tests/test_offload.py).

The bookkeeping the tests check: with ``device₀`` the activation bytes a
plain walk holds after forward and ``M`` the bytes this class moved out,

    device = device₀ − M,    host (or disk) = M,    moved back = M after backward

(:func:`minipar.parallel.offload.measure.kept_by_place` of the executor's
``kept`` list), and with disk, tracemalloc's bytes held after forward drop by M
(up to the handles' few hundred bytes each).  The time cost is measured: ``seconds["out"]``,
``seconds["back"]``.  :class:`Offload` wraps any hooks, like
:class:`~minipar.parallel.remat.Checkpointing`, and composes with it:
``Offload(Checkpointing(h, units), "disk")`` offloads the checkpoints (each
segment's input) and the last segment kept whole.  A strategy gets both through
one ``wrap_hooks`` (:mod:`minipar.parallel.offload.wrap`); the optimizer-state half
of ZeRO-Offload is :mod:`minipar.parallel.offload.optimizer`.
"""

from __future__ import annotations

from typing import Any

from minipar import checks
from minipar.memory import Ledger
from minipar.nn.executor import Hooks
from minipar.parallel.offload.store import Store, View
from minipar.parallel.remat import Segment, Whole

__all__ = ["Offload"]


class Offload(Hooks):
    """Hooks that move ``saved`` out after forward and back before backward:
    ``Offload(hooks, target="host"|"disk", folder=None, min_bytes=0)``.

    ``hooks``: the wrapped hooks (serial, DDP's, ZeRO's, a
    :class:`~minipar.parallel.remat.Checkpointing`); ``folder``: where disk
    offload makes its private folder; ``min_bytes``: smaller buffers stay.  Counters
    (the :class:`~minipar.parallel.offload.store.Store`'s): ``moved``, ``held``,
    ``peak``, ``seconds``; :meth:`ledger` is what is offloaded now.  ``grads`` is the
    wrapped hooks'; anything else of theirs (DDP's ``finish``, ZeRO's
    ``peak_gathered_bytes``, Checkpointing's ``bytes_peak``) is read on them, ``inner``."""

    def __init__(self, hooks: Hooks, target: str = "host", folder: str | None = None,
                 min_bytes: int = 0) -> None:
        checks.integer("min_bytes", min_bytes, 0)
        self.inner, self.store, self.min_bytes = hooks, Store(target, folder), min_bytes
        self.target = self.store.target

    @property
    def grads(self) -> dict[str, Any]:  # type: ignore[override]
        return self.inner.grads

    moved = property(lambda self: self.store.moved)
    held = property(lambda self: self.store.held)
    peak = property(lambda self: self.store.peak)
    seconds = property(lambda self: self.store.seconds)

    def reset_peak(self) -> None:
        self.store.reset_peak()
        if hasattr(self.inner, "reset_peak"):  # a Checkpointing's ledger
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
        if isinstance(kept, Segment):  # a checkpoint: its input, once per segment
            if kept.x is not None and not isinstance(kept.x, View):
                kept.x = self.store.out(kept.x, self.min_bytes)
            return kept
        if isinstance(kept, Whole):
            kept.kept = self.store.out(kept.kept, self.min_bytes)
            return kept
        return self.store.out(kept, self.min_bytes)

    def restore(self, unit: Any, kept: Any) -> Any:
        if isinstance(kept, Segment):
            if isinstance(kept.x, View):
                kept.x = self.store.back(kept.x)
        elif isinstance(kept, Whole):
            kept.kept = self.store.back(kept.kept)
        else:
            kept = self.store.back(kept)
        return self.inner.restore(unit, kept)

    def on_backward_input(self, unit: Any) -> None:
        self.inner.on_backward_input(unit)

    def on_grads(self, unit: Any, grads: dict[str, Any]) -> None:
        self.inner.on_grads(unit, grads)
