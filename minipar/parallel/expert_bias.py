"""The loss-free bias as engine state — смещение экспертов как состояние — 专家偏置作为状态.

EN expert bias (auxiliary-loss-free balancing) as state · RU смещение экспертов (балансировка
без вспомогательной потери) как состояние · ZH 专家偏置（无辅助损失均衡）作为状态

Auxiliary-loss-free balancing (Wang et al. 2024, arXiv 2408.15664; DeepSeek-V3, arXiv
2412.19437, §2.1.2) keeps one bias b (E,) per MoE layer, ``blocks.{i}.moe.expert_bias``:
it steers which experts a token chooses, never the gates.  It is **state, not a
parameter**: no gradient, no optimizer, but in ``state_dict``, checkpoints and resume
(kind ``"buffer"``, replica 0 saved: :func:`minipar.parallel.engine.with_buffers`), and
the same on every rank that runs the layer.

The shell around :func:`minipar.nn.moe_routing.update_bias` (the rule itself):
:class:`ExpertBias` holds the biases of the MoE blocks a rank runs, hands them to the
units among the parameter views (:meth:`ExpertBias.views`), and after a step
(:meth:`ExpertBias.update`) sums the loads the executor counted (once per forward,
never by a recompute: :func:`minipar.nn.executor.forward`'s ``loads``) over the ranks
that routed the step's tokens, then updates every bias once.  The bias is constant
through the micro-batches of a step.  It also keeps the step's global loads for the
paper's MaxVio (max load / mean load − 1), whatever the balancing.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import numpy as np

from minipar.backend import array_module, to_host, xp
from minipar.nn import executor
from minipar.nn.moe_routing import update_bias

__all__ = ["BIAS", "BiasHooks", "ExpertBias", "max_violation"]

#: the bias's name inside a block
BIAS = "moe.expert_bias"


def max_violation(loads: Any) -> float:
    """MaxVio = max_i load_i / mean load − 1 (DeepSeek-V3 / Wang et al.): 0 when even."""
    loads = np.asarray(loads, dtype=np.float64)
    mean = loads.mean()
    return float(loads.max() / mean - 1.0) if mean > 0 else 0.0


class ExpertBias:
    """The loss-free biases of the MoE blocks ``blocks`` (indices) of ``cfg`` one rank runs
    (none unless ``cfg.load_balance == "loss-free"``); ``replica``: which copy this rank's is
    (0 is saved).  ``loads`` (per step, per MoE block run: the global loads) and
    ``max_vio`` (the same, MaxVio) are recorded for every MoE config."""

    def __init__(self, cfg: Any, blocks: Iterable[int], replica: int = 0) -> None:
        self.cfg, self.replica = cfg, replica
        self.moe_blocks = [i for i in blocks if cfg.is_moe_block(i)]
        on = bool(cfg.n_experts) and cfg.load_balance == "loss-free"
        self.arrays = {f"blocks.{i}.{BIAS}": xp.zeros(cfg.n_experts, dtype=xp.float64)
                       for i in self.moe_blocks} if on else {}
        self.loads: list[dict[str, list[int]]] = []
        self.max_vio: list[dict[str, float]] = []

    def views(self) -> dict[str, Any]:
        """The biases by full name, to add to the parameter views the units fetch from."""
        return self.arrays

    def update(self, loads: dict[str, Any], *comms: Any, op: str = "expert_loads") -> None:
        """After a step: the loads counted on this rank (by block prefix) summed over
        ``comms`` in turn (the ranks that routed the step's tokens: a pipeline's dp replicas,
        DualPipe's two copies; none: this rank alone), recorded, and each bias updated once
        (:func:`~minipar.nn.moe_routing.update_bias`)."""
        if not self.moe_blocks:
            return
        names = [f"blocks.{i}." for i in self.moe_blocks]
        mine = np.stack([np.asarray(to_host(loads.get(n, np.zeros(self.cfg.n_experts))),
                                    dtype=np.float64) for n in names])
        for comm in comms:
            if comm is None or comm.size == 1:
                continue
            from minipar.collectives import allreduce  # not at import: the launcher has no MPI
            with comm.operation(op):
                mine = allreduce(comm, mine.reshape(-1)).reshape(mine.shape)
        total = {n: [int(round(v)) for v in row] for n, row in zip(names, mine)}
        self.loads.append(total)
        self.max_vio.append({n: max_violation(row) for n, row in zip(names, mine)})
        for n, row in zip(names, mine):
            name = n + BIAS
            if name in self.arrays:
                b = self.arrays[name]
                b[...] = update_bias(b, array_module(b).asarray(row), self.cfg.bias_update_rate)


class BiasHooks(executor.Hooks):
    """``inner`` hooks whose ``fetch`` also hands an MoE block its bias (from ``bias``, by
    full name); everything else is ``inner``'s.  Put innermost (a recompute fetches through
    it too), for engines whose hooks read parameters from elsewhere (a pipeline stage)."""

    def __init__(self, inner: Any, bias: dict[str, Any]) -> None:
        self.inner, self.bias = inner, bias

    @property
    def grads(self) -> dict[str, Any]:  # type: ignore[override]
        return self.inner.grads

    def fetch(self, unit: Any) -> dict[str, Any]:
        p = self.inner.fetch(unit)
        name = unit.prefix + BIAS
        return {**p, BIAS: self.bias[name]} if name in self.bias else p

    def release(self, unit: Any, params: dict[str, Any]) -> None:
        self.inner.release(unit, {k: v for k, v in params.items() if k != BIAS})

    def on_saved(self, unit: Any, saved: Any, x: Any) -> Any:
        return self.inner.on_saved(unit, saved, x)

    def restore(self, unit: Any, kept: Any) -> Any:
        return self.inner.restore(unit, kept)

    def on_backward_input(self, unit: Any) -> None:
        self.inner.on_backward_input(unit)

    def on_grads(self, unit: Any, grads: dict[str, Any]) -> None:
        self.inner.on_grads(unit, grads)
