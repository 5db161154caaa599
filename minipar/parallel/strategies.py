"""Every strategy from one table — таблица стратегий — 策略表.

``build(name, spec, grid, **options)`` returns an :class:`~minipar.parallel.engine.Engine`
(the same methods for every strategy), so ``minipar run``, the parity check, the
training loop, the checkpoint and the benchmarks are written once.  ``spec`` is the
:class:`~minipar.parallel.common.RunSpec` (model, task, optimizer, MoE routing groups),
``grid`` the :class:`~minipar.comm.topology.Grid` of the ranks (its sizes say the
layout: dp, pp, cp, tp, ep; ``None`` for the serial engine), ``options`` the
strategy's own (DDP's buckets, ZeRO's stage, the pipeline's schedule, ...).

Each row names the module whose ``build(spec, grid, **options)`` makes the engine; the
module is imported only when its strategy is built (a family never imports another).
"""

from __future__ import annotations

import importlib
from typing import Any

from minipar import checks
from minipar.parallel.engine import Engine

#: strategy -> the module whose ``build(spec, grid, **options)`` returns its engine
STRATEGIES: dict[str, str] = {
    "serial": "minipar.parallel.engine",
    # data parallelism (DDP: buckets, overlap) and the parameter server
    "dp": "minipar.parallel.data_parallel.engine",
    # --
    "ps": "minipar.parallel.data_parallel.ps_engine",
    # ZeRO stages 0-3
    "zero": "minipar.parallel.zero.engine",
    # tensor parallelism (Megatron), and with sequence parallelism
    "tp": "minipar.parallel.tensor_parallel.engine",
    # --
    "sp": "minipar.parallel.tensor_parallel.engine",
    # context parallelism: ring attention, Ulysses
    "cp": "minipar.parallel.context_parallel.engine",
    # pipeline parallelism: GPipe, 1F1B, interleaved
    "pp": "minipar.parallel.pipeline.engine",
    # expert parallelism
    "ep": "minipar.parallel.expert_parallel.engine",
    # every axis on one grid
    "hybrid": "minipar.parallel.hybrid.engine",
}


def build(name: str, spec: Any, grid: Any = None, **options: Any) -> Engine:
    """The engine of strategy ``name`` on ``grid`` (ValueError for an unknown name)."""
    module = importlib.import_module(STRATEGIES[checks.one_of("strategy", name, STRATEGIES)])
    if name in ("tp", "sp"):
        options = {**options, "sequence_parallel": name == "sp"}
    return module.build(spec, grid, **options)
