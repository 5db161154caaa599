"""Remat and offload around a strategy's hooks — рематериализация и выгрузка вокруг хуков стратегии — 在策略钩子外包裹重计算与卸载.

EN remat + activation offload wrapper · RU обёртка «рематериализация + выгрузка
активаций» · ZH 重计算 + 激活卸载包装

A strategy that walks the units executor (DDP, ZeRO) takes one ``wrap_hooks(hooks,
units) -> hooks``; :class:`MemoryWrap` is that function for the two memory techniques,
composed inside out as ZeRO-Infinity offloads the activation checkpoints (Rajbhandari
et al. 2021, arXiv 2104.07857):

    Offload( Checkpointing( the strategy's hooks, units ), "host" | "disk" )

(:class:`~minipar.parallel.remat.Checkpointing`,
:class:`~minipar.parallel.offload.activations.Offload`; either alone when only one is
asked for).  It keeps every wrapper it made, so a run reports what they held and moved
(:meth:`MemoryWrap.summary`: the ledger's activation peak on the device, bytes out and
back, seconds spent moving).  The results are those of the wrapped hooks, bit for bit:
``minipar run dp|zero --remat --offload`` equals the serial run (tests/test_offload.py).
"""

from __future__ import annotations

from typing import Any

from minipar import checks
from minipar.nn.executor import Hooks
from minipar.parallel.offload.activations import Offload
from minipar.parallel.offload.store import check_target
from minipar.parallel.remat import Checkpointing

__all__ = ["MemoryWrap", "remat_offload_wrapper"]


class MemoryWrap:
    """``(hooks, units) -> hooks``: remat, offload or both around a strategy's hooks
    (``DataParallel(wrap_hooks=...)``, ``ZeRO(wrap_hooks=...)``; a pipeline stage wraps
    its chunks' hooks itself, in its ``StageMemory``).

    Keeps every wrapper it made (``made``) so a run can report what they held and moved
    (:meth:`summary`)."""

    def __init__(self, remat: int | None = None, offload: str | None = None,
                 folder: str | None = None, selective: bool = False) -> None:
        if remat is not None:
            checks.integer("remat interval", remat, 0, why="0: ceil(sqrt n)")
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
