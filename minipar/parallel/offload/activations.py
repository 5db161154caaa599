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
  bytes are accounted in their own ledger column (``docs/ARCHITECTURE.md``, "The device boundary");
* ``"disk"`` — each buffer written to a ``numpy.memmap`` file in a private
  temporary folder and dropped from memory: a real drop in resident memory on
  any machine (tracemalloc shows it); read back and deleted in backward.  No
  ``flush``: the operating system writes the pages back in the background, the
  way ZeRO-Infinity's NVMe writes overlap compute.

Moved are *buffers*, each once (:class:`~minipar.parallel.offload.store.Store`, the
tiers): q, k and v of one attention are views of one qkv array; the buffer goes
out once and the three views are rebuilt on the restored buffer (same offsets,
strides and dtypes).  The values come back bit for bit, so training is
bit-identical to no offload (tests/test_offload.py).

With ``device₀`` the activation bytes a plain walk holds after forward and ``M``
the bytes moved out,

    device = device₀ − M,    host (or disk) = M,    moved back = M after backward

(:func:`minipar.parallel.offload.measure.kept_by_place` of the executor's ``kept``
list; the bytes and seconds moved are counted by the store passed in,
:class:`~minipar.parallel.offload.measure.MeteredStore`).  :class:`Offload` wraps any
hooks, like :class:`~minipar.parallel.remat.Checkpointing`, and composes with it:
``Offload(Checkpointing(h, units), Store("disk"))`` offloads the checkpoints (each
segment's input) and the last segment kept whole.
"""

from __future__ import annotations

from typing import Any

from minipar import checks
from minipar.nn.executor import Hooks
from minipar.parallel.offload.store import Store, View
from minipar.parallel.remat import Segment, Whole

__all__ = ["Offload"]


class Offload(Hooks):
    """Hooks that move ``saved`` out after forward and back before backward:
    ``Offload(hooks, store, min_bytes=0)``.

    ``hooks``: the wrapped hooks (serial, DDP's, ZeRO's, a
    :class:`~minipar.parallel.remat.Checkpointing`); ``store``: the
    :class:`~minipar.parallel.offload.store.Store` that moves buffers to host or disk;
    ``min_bytes``: smaller buffers stay.  ``grads`` is the wrapped hooks'; anything else
    of theirs is read on them, ``inner``."""

    def __init__(self, hooks: Hooks, store: Store, min_bytes: int = 0) -> None:
        checks.integer("min_bytes", min_bytes, 0)
        self.inner, self.store, self.min_bytes = hooks, store, min_bytes

    @property
    def grads(self) -> dict[str, Any]:  # type: ignore[override]
        return self.inner.grads

    def close(self) -> None:
        """Remove the store's files (disk)."""
        self.store.folder.close()

    def fetch(self, unit: Any) -> dict[str, Any]:
        return self.inner.fetch(unit)

    def release(self, unit: Any, params: dict[str, Any]) -> None:
        self.inner.release(unit, params)

    def on_saved(self, unit: Any, saved: Any, x: Any) -> Any:
        """Out: the unit's ``saved`` (or what the wrapped hooks kept of it); a checkpoint
        once per segment."""
        kept = self.inner.on_saved(unit, saved, x)
        if isinstance(kept, Segment):
            if kept.x is not None and not isinstance(kept.x, View):
                kept.x = self.store.out(kept.x, self.min_bytes)
        elif isinstance(kept, Whole):
            kept.kept = self.store.out(kept.kept, self.min_bytes)
        else:
            kept = self.store.out(kept, self.min_bytes)
        return kept

    def restore(self, unit: Any, kept: Any) -> Any:
        """Back on the device, then the wrapped hooks' ``restore`` (remat recomputes)."""
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
