"""Training the tensor-parallel GPT on a grid: TP, TP+SP, TP x DP — обучение
тензорно-параллельного GPT на сетке рангов — 在进程网格上训练张量并行 GPT.

EN tensor parallelism combined with data parallelism (2-D parallelism) · RU тензорный
параллелизм вместе с параллелизмом по данным · ZH 张量并行与数据并行的组合

Megatron-LM (Shoeybi et al. 2019, arXiv 1909.08053, §3.1; Narayanan et al. 2021,
arXiv 2104.04473, §3): the world is a dp x tp grid (:class:`minipar.comm.topology.Grid`,
tp innermost).  The tp ranks of a row hold the slices of one model replica
(:class:`~minipar.parallel.tensor_parallel_gpt.TensorParallelGPT`) and see the same rows of
the batch; the dp ranks of a column hold the same slice of different replicas, each
takes its rows of the global batch (:func:`minipar.parallel.common.local_rows`) weighted
by b_r/B, and sums its gradient slice over the dp column (ring all-reduce, op
``dp_grad_allreduce``).  AdamW is element-wise, so stepping each slice is stepping the
whole model: the run equals the serial one (:func:`minipar.parallel.parity.compare`).

Bytes per rank per step, the formulas the tests check (ring, b = my rows, s = sequence,
h = d_model, L blocks, e = bytes per element):

    tp axis, blocks:  L × 4 all-reduces of b·s·h elements  ≈ 4L × 2(t−1)/t × b·s·h·e
                      (exact: :func:`minipar.collectives.cost.allreduce_bytes_sent`; a MoE
                      block's MLP f and g carry its E·C·h expert buffers instead)
    dp axis:          one all-reduce of my slice's Ψ/t gradients ≈ 2(d−1)/d × (Ψ/t)·e

(SP moves the blocks' same bytes as all-gathers and reduce-scatters, plus the re-gather
of the saved shard in backward and the small all-reduce of the sequence-split parameters'
gradients: :mod:`minipar.parallel.sequence_parallel`.)
"""

from __future__ import annotations

from typing import Any

import numpy as np

from minipar.collectives import allreduce
from minipar.collectives.cost import allreduce_bytes_sent
from minipar.nn import executor
from minipar.nn._dtype import compute_dtype
from minipar.nn.moe_steps import expert_capacity
from minipar.optim import FlatParams
from minipar.parallel.common import RunSpec, check_world, loss_weight
from minipar.parallel.sequence_parallel import ledger
from minipar.parallel.tensor_parallel import check_tp, gather_params, shard_params
from minipar.parallel.tensor_parallel_gpt import TensorParallelGPT, tp_loss_and_grads
from minipar.precision import ModelStates

__all__ = ["BLOCK_OPS", "OP_DP_GRADS", "TensorParallel", "tp_block_bytes_formula"]

OP_DP_GRADS = "dp_grad_allreduce"
#: the blocks' collectives: TP's f and g, SP's all-gather and reduce-scatter
BLOCK_OPS = ("tp_f", "tp_g", "sp_f", "sp_g")


def tp_block_bytes_formula(n_layer: int, b: int, s: int, h: int, t: int, rank: int,
                           itemsize: int) -> int:
    """Exact bytes rank ``rank`` of ``t`` sends per step in the blocks' f and g:
    n_layer × 4 ring all-reduces of b·s·h elements (the SP pairs send the same)."""
    return 4 * n_layer * allreduce_bytes_sent(b * s * h, itemsize, t, rank, "ring")


class _LedgerHooks(executor.Hooks):
    """The serial hooks, and the bytes each block's ``saved`` holds (its activations)."""

    def __init__(self, params: dict[str, Any], book: list[int]) -> None:
        super().__init__(params)
        self.book = book

    def on_saved(self, unit: Any, saved: Any, x: Any) -> Any:
        if unit.name.startswith("block"):
            self.book.append(ledger(saved))
        return saved


class TensorParallel:
    """This rank's part of a TP (x DP) training run on ``grid`` (dp x tp; pp = cp = 1).

    ``train_step(step) -> global loss`` (the same on every rank); ``full_params()`` is the
    whole model, flat in the serial order (gathered over tp: reporting only)."""

    def __init__(self, grid: Any, spec: RunSpec, sequence_parallel: bool = False) -> None:
        self.grid, self.spec, self.sp = grid, spec, sequence_parallel
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
        self.block_ledger: list[int] = []  #: bytes each block saved, in the last step

    def train_step(self, step: int) -> float:
        st, dp = self.states, self.dp
        x, y = self.spec.local_batch(step, dp.rank, dp.size)
        self.block_ledger = []
        hooks = _LedgerHooks(st.param_views(), self.block_ledger)
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

    # -- evidence ---------------------------------------------------------------------
    def rows(self) -> int:
        """b: the rows of the global batch this rank's replica sees."""
        from minipar.parallel.common import local_rows

        lo, hi = local_rows(self.spec.batch, self.dp.rank, self.dp.size)
        return hi - lo

    def bytes_by_op(self) -> dict[str, float]:
        """Bytes this rank sent per step, by operation (counted)."""
        ops = self.grid.world.stats.ops
        n = max(1, self.steps_done)
        return {op: s.bytes_sent / n for op, s in ops.items() if s.bytes_sent}

    def calls_by_op(self) -> dict[str, float]:
        """Calls per step, by operation (an all-reduce, all-gather, ... is one call)."""
        ops = self.grid.world.stats.ops
        n = max(1, self.steps_done)
        return {op: s.calls / n for op, s in ops.items() if s.calls}

    def tp_axis_bytes_formula(self) -> int | None:
        """Exact bytes this rank sends per step over ``tp`` (TP without SP; None with SP):
        the blocks' f and g, the embedding's g and the head's f (one ring all-reduce of
        b·s·h each), and the vocab-parallel loss's all-reduces of b·s and 2·b·s numbers
        in the compute dtype."""
        if self.sp:
            return None
        b, s, h, t, r = self.rows(), self.spec.seq, self.cfg.d_model, self.tp.size, self.tp.rank
        e, ic = self.states.params.itemsize, compute_dtype(self.cfg.dtype).itemsize
        ring = allreduce_bytes_sent
        return (self.block_bytes_formula() + 2 * ring(b * s * h, e, t, r, "ring")
                + ring(b * s, ic, t, r, "ring") + ring(2 * b * s, ic, t, r, "ring"))

    def block_bytes_formula(self) -> int:
        """Exact ring figure of the blocks' f and g for this rank: b·s·h elements each, but
        a MoE block's MLP f and g carry its expert buffers, E·C·h elements
        (C = :func:`~minipar.nn.moe_steps.expert_capacity` of the replica's b·s·k assignments)."""
        cfg, b, s, h = self.cfg, self.rows(), self.spec.seq, self.cfg.d_model
        t, r, e = self.tp.size, self.tp.rank, self.states.params.itemsize
        moe = sum(cfg.is_moe_block(i) for i in range(cfg.n_layer))
        dense = tp_block_bytes_formula(cfg.n_layer - moe, b, s, h, t, r, e)
        if not moe:
            return dense
        buffers = cfg.n_experts * expert_capacity(b * s * cfg.top_k, cfg.n_experts, cfg.capacity_factor) * h
        ring = allreduce_bytes_sent  # 2 on b·s·h (attention) + 2 on the buffers (experts)
        return dense + moe * 2 * (ring(b * s * h, e, t, r, "ring") + ring(buffers, e, t, r, "ring"))
