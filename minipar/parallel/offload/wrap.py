"""Remat and offload around a strategy's hooks — рематериализация и выгрузка вокруг хуков стратегии — 在策略钩子外包裹重计算与卸载.

EN remat + activation offload wrapper · RU обёртка «рематериализация + выгрузка
активаций» · ZH 重计算 + 激活卸载包装

A strategy that walks the units executor (DDP, ZeRO) takes one ``wrap_hooks(hooks,
units) -> hooks``; :class:`MemoryWrap` is that function for the two memory techniques,
composed inside out as ZeRO-Infinity offloads the activation checkpoints (Rajbhandari
et al. 2021, arXiv 2104.07857), with their measurements around each core:

    Offload( ActivationLedger( Checkpointing( the strategy's hooks, units ) ),
             MeteredStore("host" | "disk", folder) )

(:class:`~minipar.parallel.remat.Checkpointing`,
:class:`~minipar.parallel.offload.activations.Offload`; the ledger and the metered
store from :mod:`minipar.parallel.offload.measure`; either technique alone when only
one is asked for).  It keeps what it made, so a run reports what was held and moved
(:meth:`MemoryWrap.summary`: the ledger's activation peak on the device, bytes out and
back, seconds spent moving).  The results are those of the wrapped hooks, bit for bit:
``minipar run dp|zero --remat --offload`` equals the serial run (tests/test_offload.py).
:func:`check_target` is the one check of an offload target and folder.
"""

from __future__ import annotations

import os
import tempfile
from typing import Any

from minipar import checks
from minipar.nn.executor import Hooks
from minipar.parallel.offload.activations import Offload
from minipar.parallel.offload.measure import ActivationLedger, MeteredStore
from minipar.parallel.offload.store import TARGETS
from minipar.parallel.remat import Checkpointing

__all__ = ["MemoryWrap", "check_target", "remat_offload_wrapper"]


def check_target(target: Any, folder: Any = None) -> str:
    """The target's name; one-line ValueError for an unknown target or an unusable folder."""
    checks.one_of("offload target", target, TARGETS)
    if folder is not None:
        if target != "disk":
            raise ValueError(f"an offload folder ({folder}) is for target 'disk', not {target!r}")
        if not os.path.isdir(folder):
            raise ValueError(f"offload folder {folder} does not exist or is not a directory")
        try:  # os.access says yes to root everywhere: try it
            os.rmdir(tempfile.mkdtemp(prefix="minipar-offload-check-", dir=folder))
        except OSError as e:
            raise ValueError(f"offload folder {folder} is not writable ({e.strerror})") from None
    return str(target)


class MemoryWrap:
    """``(hooks, units) -> hooks``: remat, offload or both around a strategy's hooks
    (``DataParallel(wrap_hooks=...)``, ``ZeRO``'s ``memory_wrap``; a pipeline stage wraps
    its chunks' hooks itself, in its ``StageMemory``).

    Keeps, for every call, the hooks it made, the ledger (remat) and the store (offload)
    in ``made`` (``(hooks, ledger or None, store or None)``), so a run can report what
    they held and moved (:meth:`summary`)."""

    def __init__(self, remat: int | None = None, offload: str | None = None,
                 folder: str | None = None, selective: bool = False) -> None:
        if remat is not None:
            checks.integer("remat interval", remat, 0, why="0: ceil(sqrt n)")
        if offload is not None:
            check_target(offload, folder)
        self.remat, self.offload, self.folder, self.selective = remat, offload, folder, selective
        self.made: list[tuple[Hooks, ActivationLedger | None, MeteredStore | None]] = []

    def __call__(self, hooks: Hooks, units: Any) -> Hooks:
        h, ledger, store = hooks, None, None
        if self.selective:
            h = ledger = ActivationLedger(Checkpointing(h, units, selective=True))
        elif self.remat is not None:
            h = ledger = ActivationLedger(Checkpointing(h, units, every=self.remat or None))
        if self.offload is not None:
            store = MeteredStore(self.offload, self.folder)
            h = Offload(h, store)
        self.made.append((h, ledger, store))
        return h

    def close(self) -> None:
        """Remove the offload files of every store made."""
        for _, _, store in self.made:
            if store is not None:
                store.folder.close()

    def summary(self, last: int | None = None) -> dict[str, Any]:
        """Activation bytes held at most (remat's ledger), bytes moved and seconds (offload),
        over the wrappers made (the ``last`` ones only, if given)."""
        out: dict[str, Any] = {"remat": self.remat, "offload": self.offload}
        made = self.made if last is None else self.made[-last:]
        # with offload, the device's share: what was moved out no longer counts
        peaks = [led.device_peak if self.offload else led.bytes_peak
                 for _, led, _ in made if led is not None]
        if peaks:
            out["remat_activation_peak_bytes"] = max(peaks)
        stores = [s for _, _, s in made if s is not None]
        if stores:
            out["offload_bytes_out"] = sum(s.moved["to_host"] + s.moved["to_disk"] for s in stores)
            out["offload_bytes_back"] = sum(s.moved["to_device"] for s in stores)
            out["offload_peak_bytes"] = max(max(s.peak.values()) for s in stores)
            out["offload_seconds"] = sum(s.seconds["out"] + s.seconds["back"] for s in stores)
        return out


def remat_offload_wrapper(remat: int | None = None, offload: str | None = None,
                          folder: str | None = None) -> MemoryWrap | None:
    """A :class:`MemoryWrap`, or None when neither remat nor offload is asked for."""
    if remat is None and offload is None:
        return None
    return MemoryWrap(remat, offload, folder)
