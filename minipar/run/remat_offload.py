"""``--remat [K]``, ``--offload host|disk``: memory options shared by ``minipar run`` strategies.

EN activation checkpointing and offloading options · RU параметры рематериализации и
выгрузки · ZH 重计算与卸载选项

``minipar run dp`` and ``minipar run zero`` (and the pipeline's ``pp``) take
the same three options, checked here before MPI starts:

* ``--remat [K]`` — activation checkpointing (Chen et al. 2016,
  :mod:`minipar.parallel.remat`): keep every K-th unit's input and
  recompute the rest in backward; ``--remat`` alone: K = ⌈√n⌉ of the n units
  (embedding, blocks, head).  K must be 1..n;
* ``--offload host|disk`` — saved activations moved out after forward and back
  before backward (:mod:`minipar.parallel.offload.activations`); with ``--remat``, the
  checkpoints are what moves;
* ``--offload-dir DIR`` — where disk offload writes (default: the system's
  temporary folder); a folder that is missing or not writable is one line.

``minipar run zero`` adds ``--offload-optimizer host|disk`` (ZeRO-Offload:
:mod:`minipar.parallel.offload.optimizer`).  The rank side builds the wrapper
with :func:`wrapper` and reports with :func:`summary_notes`.
"""

from __future__ import annotations

import argparse
from typing import Any

from minipar.cli.options import integer

TARGETS = ("host", "disk")  # minipar.parallel.offload.store.TARGETS (a test checks they agree)


def add_arguments(parser: argparse.ArgumentParser, optimizer: bool = False,
                  remat_alone: str = "K = ceil(sqrt(units))") -> None:
    """The options; ``remat_alone`` says what ``--remat`` without K does for this strategy."""
    g = parser.add_argument_group("memory: activation checkpointing and offloading")
    g.add_argument("--remat", type=integer(1), nargs="?", const=0, default=None, metavar="K",
                   help="activation checkpointing: keep every K-th unit's input, recompute "
                        f"the rest (--remat alone: {remat_alone}; default off)")
    g.add_argument("--offload", choices=TARGETS, default=None,
                   help="move saved activations to host memory or to disk between forward "
                        "and backward")
    if optimizer:
        g.add_argument("--offload-optimizer", choices=TARGETS, default=None,
                       help="ZeRO-Offload: fp32 master weights and Adam moments on host or "
                            "disk, the optimizer step there")
    g.add_argument("--offload-dir", default=None, metavar="DIR",
                   help="folder for disk offload (default: the system's temporary folder)")


def check(options: dict[str, Any], spec: Any) -> None:
    """Launcher side: K within the units walked; an offload folder that exists and is
    writable, and only with a disk target."""
    k = options.get("remat")
    units = spec.layers + 2  # embedding, the blocks, the head
    if k is not None and not 0 <= k <= units:
        raise ValueError(f"--remat {k}: the interval must be 1..{units} (the model has "
                         f"{units} units: embedding, {spec.layers} blocks, head)")
    folder = options.get("offload_dir")
    if folder is not None:
        targets = [options.get("offload"), options.get("offload_optimizer")]
        if "disk" not in targets:
            raise ValueError(f"--offload-dir {folder} needs --offload disk"
                             + (" or --offload-optimizer disk" if "offload_optimizer" in options
                                else ""))
        from minipar.parallel.offload.wrap import check_target

        try:
            check_target("disk", folder)
        except ValueError as e:
            raise ValueError(f"--offload-dir: {e}") from None


def _folder(options: dict[str, Any], target: str | None) -> str | None:
    return options.get("offload_dir") if target == "disk" else None


def wrapper(options: dict[str, Any]) -> Any:
    """Rank side: the ``wrap_hooks`` for DataParallel / ZeRO (a MemoryWrap), or None."""
    from minipar.parallel.offload.wrap import remat_offload_wrapper

    target = options.get("offload")
    return remat_offload_wrapper(options.get("remat"), target, _folder(options, target))


def optimizer_keywords(options: dict[str, Any]) -> dict[str, Any]:
    """ZeRO's ``offload_optimizer`` / ``offload_dir`` keywords from the options."""
    target = options.get("offload_optimizer")
    if target is None:
        return {}
    return {"offload_optimizer": target, "offload_dir": _folder(options, target)}


def summary_notes(wrap: Any, last: int | None = None) -> tuple[dict[str, Any], list[str]]:
    """The run's memory figures (summary keys) and note lines, from a MemoryWrap (or None).

    ``last``: count only the last ``last`` wrappers it made (ZeRO wraps once per
    engine; its measured engine is the last one)."""
    if wrap is None:
        return {}, []
    s = wrap.summary(last)
    notes = []
    if s.get("remat") is not None:
        k = s["remat"] or "ceil(sqrt n)"
        held = s.get("remat_activation_peak_bytes")
        notes.append(f"remat every {k} units: "
                     + (f"activation bytes held at most {held:,}"
                        + (" on the device" if s.get("offload") else "") + ", "
                        if held is not None else "")
                     + "one extra forward of every segment but the last")
    if s.get("offload") is not None:
        notes.append(f"activation offload to {s['offload']}: {s['offload_bytes_out']:,} bytes "
                     f"out and {s['offload_bytes_back']:,} back, at most "
                     f"{s['offload_peak_bytes']:,} there at once, "
                     f"{s['offload_seconds'] * 1e3:.1f} ms spent moving")
    return s, notes
