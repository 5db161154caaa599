"""``minipar run sp -n N [--tp T --dp D]``: sequence parallelism (Korthikanti et al. 2022).

EN sequence parallelism · RU параллелизм по последовательности · ZH 序列并行

The run of :mod:`minipar.run.tp` with ``sequence_parallel=True``
(:mod:`minipar.parallel.tensor_parallel.layers`, arXiv 2205.05198): the LayerNorm regions keep
a 1/t shard of the sequence, f and g become all-gather and reduce-scatter along it (the
same bytes as TP's all-reduces), and each block's saved activations shrink to
sbh(40/t + 2as/(ht)) + 8sb/t bytes in minipar's block (the paper's sbh(34/t + 5as/(ht))
with dropout).  Bad input adds to tp's: ``--seq`` not divisible by t, or ``--experts``.
"""

from __future__ import annotations

import argparse
from typing import Any

from minipar.run import tp
from minipar.run.tp import check_sizes, engine_options, report_grid, trace_events

__all__ = ["add_arguments", "check", "engine_options", "grid_sizes", "report", "trace_events"]


def add_arguments(parser: argparse.ArgumentParser) -> None:
    tp.add_arguments(parser, sequence_parallel=True)


def check(options: dict[str, Any], spec: Any) -> None:
    check_sizes(options, spec, True)
    tp.check_overlap(options, spec, True)


def grid_sizes(options: dict[str, Any], spec: Any = None) -> dict[str, int]:
    """``{"dp": dp, "tp": tp}``: :func:`minipar.run.tp.grid_sizes` with SP's sequence rule."""
    return tp.grid_sizes(options, spec, sequence_parallel=True)


def report(engine: Any, grid: Any, options: dict[str, Any], spec: Any,
           history: Any) -> dict[str, Any] | None:
    return report_grid(engine, grid, options, spec, True, len(history.losses))
