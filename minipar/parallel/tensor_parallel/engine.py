"""Training the tensor-parallel GPT on a grid: TP, TP+SP, TP x DP — обучение
тензорно-параллельного GPT на сетке рангов — 在进程网格上训练张量并行 GPT.

EN tensor parallelism combined with data parallelism (2-D parallelism) · RU тензорный
параллелизм вместе с параллелизмом по данным · ZH 张量并行与数据并行的组合

Megatron-LM (Shoeybi et al. 2019, arXiv 1909.08053, §3.1; Narayanan et al. 2021,
arXiv 2104.04473, §3): the world is a dp x tp grid (:class:`minipar.comm.topology.Grid`,
tp innermost).  The tp ranks of a row hold the slices of one model replica
(:class:`~minipar.parallel.tensor_parallel.model.TensorParallelGPT`) and see the same rows of
the batch; the dp ranks of a column hold the same slice of different replicas, each
takes its rows of the global batch (:func:`minipar.parallel.common.local_rows`) weighted
by b_r/B, and sums its gradient slice over the dp column (ring all-reduce, op
``dp_grad_allreduce``).  AdamW is element-wise, so stepping each slice is stepping the
whole model: the run equals the serial one (:func:`minipar.parallel.parity.compare`).

Per step the tp axis carries the blocks' f and g (4 all-reduces of b·s·h elements per
block), the embedding's g, the head's f and the vocab-parallel loss; the dp axis one
all-reduce of this rank's Ψ/t gradients.  The exact byte formulas and the activation
ledger of a step are in :mod:`minipar.parallel.tensor_parallel.measure`.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from minipar.collectives import allreduce
from minipar.nn import executor
from minipar.optim import FlatParams
from minipar.parallel.common import RunSpec, check_world, local_rows, loss_weight
from minipar.parallel.tensor_parallel.layers import check_tp, gather_params, shard_params
from minipar.parallel.tensor_parallel.model import TensorParallelGPT, tp_loss_and_grads
from minipar.precision import ModelStates

__all__ = ["OP_DP_GRADS", "TensorParallel"]

OP_DP_GRADS = "dp_grad_allreduce"


class TensorParallel:
    """This rank's part of a TP (x DP) training run on ``grid`` (dp x tp; pp = cp = 1).

    ``train_step(step) -> global loss`` (the same on every rank); ``full_params()`` is the
    whole model, flat in the serial order (gathered over tp: reporting only).  ``hooks``
    builds each step's executor hooks from this rank's parameter views (default: the
    serial ones; :class:`~minipar.parallel.tensor_parallel.measure.BlockLedger` notes
    each block's saved bytes)."""

    def __init__(self, grid: Any, spec: RunSpec, sequence_parallel: bool = False,
                 hooks: Callable[[dict[str, Any]], executor.Hooks] = executor.Hooks) -> None:
        self.grid, self.spec, self.sp, self.make_hooks = grid, spec, sequence_parallel, hooks
        self.tp, self.dp = grid.comm("tp"), grid.comm("dp")
        t, d = grid.size("tp"), grid.size("dp")
        if grid.size("pp") != 1 or grid.size("cp") != 1:
            raise ValueError(f"TensorParallel runs on a dp x tp grid; got pp = {grid.size('pp')}, "
                             f"cp = {grid.size('cp')}")
        self.cfg = spec.config()
        check_tp(self.cfg, t, sequence_parallel, spec.seq)
        check_world(spec.batch, d)
        self.model = TensorParallelGPT(self.cfg, self.tp, sequence_parallel)
        full = spec.initial_params()
        self.layout = FlatParams.like(full)  # the serial order, for full_params()
        self.states = ModelStates(spec.precision, shard_params(full, self.cfg, t, self.tp.rank),
                                  spec.optimizer, **spec.opt_kwargs())
        self.weight = loss_weight(spec.batch, self.dp.rank, d)
        self.steps_done = 0

    def train_step(self, step: int) -> float:
        st, dp = self.states, self.dp
        x, y = self.spec.local_batch(step, dp.rank, dp.size)
        hooks = self.make_hooks(st.param_views())
        loss = tp_loss_and_grads(self.model.units(), hooks, self.tp, x, y,
                                 self.weight * st.loss_scale)
        st.set_grads(hooks.grads)
        del hooks
        if dp.size > 1:
            with dp.operation(OP_DP_GRADS):
                st.grads[...] = allreduce(dp, st.grads, "sum", "ring")
        found_inf = None
        if st.scaler is not None:  # every rank must skip the step alike
            w = self.grid.world
            with w.operation("found_inf"):
                found_inf = bool(allreduce(w, np.array([float(st.local_found_inf())]), "max")[0])
        st.step(found_inf=found_inf)
        self.steps_done += 1
        with dp.operation("dp_loss_allreduce"):
            return float(allreduce(dp, np.array([self.weight * loss]), "sum")[0])

    def train(self) -> list[float]:
        return [self.train_step(s) for s in range(self.spec.steps)]

    def full_params(self) -> Any:
        """The whole model, flat, in the serial parameter order and the params' dtype."""
        full = gather_params(self.tp, self.states.param_views(), self.cfg)
        return self.layout.flatten(full, self.states.params.dtype)

    def rows(self) -> int:
        """b: the rows of the global batch this rank's replica sees."""
        lo, hi = local_rows(self.spec.batch, self.dp.rank, self.dp.size)
        return hi - lo
