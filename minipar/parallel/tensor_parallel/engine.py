"""Training the tensor-parallel GPT on a grid: TP, TP+SP, TP x DP — обучение
тензорно-параллельного GPT на сетке рангов — 在进程网格上训练张量并行 GPT.

EN tensor parallelism combined with data parallelism (2-D parallelism) · RU тензорный
параллелизм вместе с параллелизмом по данным · ZH 张量并行与数据并行的组合

Megatron-LM (Shoeybi et al. 2019, arXiv 1909.08053, §3.1; Narayanan et al. 2021,
arXiv 2104.04473, §3): the world is a dp x tp grid (:class:`minipar.comm.topology.Grid`,
tp innermost).  The tp ranks of a row hold the slices of one model replica
(:class:`TensorParallelGPT`, the units of :mod:`.model`) and see the same rows of
the batch; the dp ranks of a column hold the same slice of different replicas, each
takes its rows of the global batch (:func:`minipar.parallel.common.local_rows`) weighted
by b_r/B, and sums its gradient slice over the dp column (ring all-reduce, op
``dp_grad_allreduce``).  AdamW is element-wise, so stepping each slice is stepping the
whole model: the run equals the serial one (:func:`minipar.parallel.parity.compare`).

:class:`TensorParallel` is an :class:`~minipar.parallel.engine.Engine`: ``step`` takes
the GLOBAL batch and cuts this replica's rows; ``state_dict`` gives every slice with
its :class:`~minipar.parallel.engine.Shard` (:func:`~.shards.placements`: rows and
columns one piece, ``w_qkv`` three).  Who holds which copy, dp 2 x tp 2::

                tp 0                     tp 1
    dp 0   slices, replica 0        slices, replica 0      whole tensors (LayerNorms,
           whole,  replica 0        whole,  replica 1      b_out, pos_emb, router):
    dp 1   slices, replica 1        slices, replica 1      replica dp·t + tp, so one
           whole,  replica 2        whole,  replica 3      copy of each is saved

Per step the tp axis carries the blocks' f and g (4 all-reduces of b·s·h elements per
block), the embedding's g, the head's f and the vocab-parallel loss; the dp axis one
all-reduce of this rank's Ψ/t gradients.  The exact byte formulas and the activation
ledger of a step are in :mod:`minipar.parallel.tensor_parallel.measure`.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

import numpy as np

import time

from minipar import checks
from minipar.collectives import allreduce
from minipar.nn import executor
from minipar.nn.gpt_config import GPTConfig
from minipar.nn.units import Unit
from minipar.parallel.common import RunSpec, check_world, fp8_rows, found_inf, local_rows
from minipar.parallel.engine import (
    AxisTraffic,
    Batch,
    State,
    StepResult,
    load_model_states,
    memory_of,
    model_states,
    sources_of,
)
from minipar.parallel.tensor_parallel.layers import (
    ColumnParallelLinear,
    RowParallelLinear,
    vocab_parallel_cross_entropy_forward,
)
from minipar.parallel.tensor_parallel.model import tp_gpt_units, tp_loss_and_grads
from minipar.parallel.tensor_parallel.overlap import (
    AsyncColumnParallelLinear,
    AsyncRowParallelLinear,
)
from minipar.parallel.tensor_parallel.shards import (
    check_tp,
    gather_params,
    kind_of,
    placements,
    shard_params,
)
from minipar.precision import ModelStates

__all__ = ["OP_DP_GRADS", "TensorParallel", "TensorParallelGPT", "build"]

OP_DP_GRADS = "dp_grad_allreduce"


class TensorParallelGPT:
    """The GPT sliced over the tensor-parallel communicator ``comm``, without an optimizer
    (every rank of it calls every method alike): the units of
    :mod:`~minipar.parallel.tensor_parallel.model` for tests and tools.  Shards keep the
    serial parameter names (:func:`~.shards.shard_params`)."""

    def __init__(self, cfg: GPTConfig, comm: Any, sequence_parallel: bool = False) -> None:
        self.cfg, self.comm, self.sp = cfg, comm, sequence_parallel
        self.rank, self.t = comm.Get_rank(), comm.Get_size()
        check_tp(cfg, self.t, sequence_parallel)
        self._units = tp_gpt_units(cfg, comm, sequence_parallel)

    def units(self) -> tuple[Unit, ...]:
        return self._units

    def shard(self, full: dict[str, Any]) -> dict[str, Any]:
        """This rank's shard of the full parameters (cut, not re-drawn)."""
        return shard_params(full, self.cfg, self.t, self.rank)

    def _check(self, tokens: Any) -> None:
        check_tp(self.cfg, self.t, self.sp, getattr(tokens, "shape", (0, 0))[1])

    def forward(self, shard: dict[str, Any], tokens: Any) -> Any:
        """This rank's vocabulary columns of the logits, (B, T, V/t)."""
        self._check(tokens)
        return executor.forward(self._units, executor.Hooks(shard), tokens)[0]

    def loss(self, shard: dict[str, Any], tokens: Any, targets: Any) -> float:
        self._check(tokens)
        aux: list[float] = []
        logits, _ = executor.forward(self._units, executor.Hooks(shard), tokens, aux=aux)
        return vocab_parallel_cross_entropy_forward(self.comm, logits, targets)[0] + sum(aux)

    def loss_and_grads(self, shard: dict[str, Any], tokens: Any, targets: Any,
                       loss_scale: float = 1.0) -> tuple[float, dict[str, Any]]:
        """(loss, grads of this rank's shard, keyed and ordered like ``shard``)."""
        self._check(tokens)
        hooks = executor.Hooks(shard)
        loss = tp_loss_and_grads(self._units, hooks, self.comm, tokens, targets, loss_scale)
        return loss, {k: hooks.grads[k] for k in shard}


class TensorParallel:
    """This rank's part of a TP (x DP) training run on ``grid`` (dp x tp; pp = cp = 1).

    ``sequence_parallel``: TP+SP (:mod:`~minipar.parallel.tensor_parallel.model`);
    ``hooks(params) -> executor.Hooks`` builds each step's executor hooks from this
    rank's parameter views (default: the serial ones;
    :class:`~minipar.parallel.tensor_parallel.measure.BlockLedger` notes each block's
    saved bytes).  ``timeline=True``: a
    :class:`~minipar.parallel.tensor_parallel.measure.CommClock` on the tp communicator
    keeps the last step's compute and communication intervals in ``records`` (``compute``,
    ``comm``: ``(name, t0, t1)``).  Every argument is checked on every rank before any
    message."""

    def __init__(self, grid: Any, spec: RunSpec, sequence_parallel: bool = False,
                 hooks: Callable[[dict[str, Any]], executor.Hooks] = executor.Hooks,
                 overlap: bool = False, timeline: bool = False) -> None:
        for name, flag in (("sequence_parallel", sequence_parallel), ("overlap", overlap),
                           ("timeline", timeline)):
            if not isinstance(flag, bool):
                raise ValueError(  # noqa: TRY004 (the one-line ValueError of every option)
                    f"{name} must be True or False, got {flag!r}")
        if not callable(hooks):
            raise ValueError(  # noqa: TRY004
                f"hooks must be a callable params -> executor.Hooks, got {hooks!r}")
        if grid is None or grid.size("pp") != 1 or grid.size("cp") != 1:
            raise ValueError("TensorParallel runs on a dp x tp grid" + (
                "" if grid is None else
                f"; got pp = {grid.size('pp')}, cp = {grid.size('cp')}"))
        self.grid, self.spec, self.sp, self.hooks = grid, spec, sequence_parallel, hooks
        self.tp, self.dp = grid.comm("tp"), grid.comm("dp")
        t, d = grid.size("tp"), grid.size("dp")
        self.cfg = spec.config()
        check_tp(self.cfg, t, sequence_parallel, spec.seq)
        check_world(spec.batch, d)
        if spec.experts and spec.routing not in ((), (d,)):
            raise ValueError(f"routing groups {spec.routing} are not this layout's: each of "
                             f"the {d} data-parallel replicas routes its rows as one group, ({d},)")
        self.model = TensorParallelGPT(self.cfg, self.tp, sequence_parallel)
        self.overlap = overlap
        if overlap:
            overlap_layers(self.model.units())
        self.states = ModelStates(spec.precision,
                                  shard_params(spec.initial_params(), self.cfg, t, self.tp.rank),
                                  spec.optimizer, **spec.opt_kwargs())
        self.placements = placements(self.cfg, t, self.tp.rank)
        self.steps_done = 0
        self._traffic = AxisTraffic(grid)
        self.records: dict[str, Any] | None = None  # the last step's intervals (timeline)
        self._clock = None
        if timeline:
            from minipar.parallel.tensor_parallel.measure import CommClock

            self._clock = CommClock(self.tp)

    # -- the batch -------------------------------------------------------------------
    def _mine(self, batch: Batch) -> tuple[Any, Any, float]:
        """This replica's rows of the global batch and their weight b_r / B."""
        lo, hi = local_rows(batch.size, self.dp.rank, self.dp.size)
        return batch.tokens[lo:hi], batch.targets[lo:hi], (hi - lo) / batch.size

    def rows(self) -> int:
        """b: the rows of the global batch (of ``spec.batch`` rows) this replica sees."""
        lo, hi = local_rows(self.spec.batch, self.dp.rank, self.dp.size)
        return hi - lo

    def _sum_over_dp(self, value: float, op: str) -> float:
        with self.dp.operation(op):
            return float(allreduce(self.dp, np.array([value]), "sum")[0])

    # -- the engine ------------------------------------------------------------------
    def step(self, batch: Batch) -> StepResult:
        if self._clock is None:
            return self._step(batch)
        t0 = time.perf_counter()
        self._clock.forget(t0)
        out = self._step(batch)
        self.records = self._clock.timeline(t0, time.perf_counter())
        return out

    def _step(self, batch: Batch) -> StepResult:
        st, dp = self.states, self.dp
        x, y, weight = self._mine(batch)
        hooks = self.hooks(st.param_views())
        with fp8_rows(self.spec, dp):  # per-tensor FP8: the amax over the replicas' rows too
            loss = tp_loss_and_grads(self.model.units(), hooks, self.tp, x, y,
                                     weight * st.loss_scale)
        st.set_grads(hooks.grads)
        del hooks
        if dp.size > 1:
            with dp.operation(OP_DP_GRADS):
                st.grads[...] = allreduce(dp, st.grads, "sum", "ring")
        done = st.step(found_inf=found_inf(self.grid.world, st))  # every rank skips alike
        self.steps_done += 1
        return StepResult(self._sum_over_dp(weight * loss, "dp_loss_allreduce"), skipped=not done)

    def evaluate(self, batch: Batch) -> float:
        """The global mean loss, forward only (each replica's rows one routing group)."""
        x, y, weight = self._mine(batch)
        with fp8_rows(self.spec, self.dp):
            loss = self.model.loss(self.states.param_views(), x, y)
        return self._sum_over_dp(weight * loss, "dp_eval_allreduce")

    def state_dict(self) -> State:
        """Every slice with its shard (serial names, global shapes); replica = my dp
        coordinate for slices, dp·t + tp for the tensors every tp rank holds whole."""
        dp, t, r = self.grid.coord("dp"), self.grid.size("tp"), self.grid.coord("tp")
        st = model_states(self.states, self.placements, replica=lambda name: (
            dp * t + r if kind_of(name) == "replicated" else dp))
        st.scalars["step"] = self.steps_done
        return st

    def load_state_dict(self, state: State | Iterable[State]) -> None:
        self.steps_done = load_model_states(self.states, sources_of(state), self.placements)

    def full_params(self) -> dict[str, Any]:
        """The whole model on every rank: serial names and order, the params' dtype
        (the slices ring all-gathered over tp, counted on ``tp`` as ``tp_full_params``)."""
        return gather_params(self.tp, self.states.param_views(), self.cfg)

    def memory(self) -> dict[str, int]:
        return memory_of(self.states)

    def traffic(self) -> dict[str, int]:
        """Bytes this rank sent since the last call, by grid axis (and ``"world"``)."""
        return self._traffic()

    def close(self) -> None:
        """Nothing to free: the grid's communicators are its owner's."""


def overlap_layers(units: Any) -> int:
    """``overlap=True`` (``--tp-overlap``): every column- and row-parallel layer of
    ``units`` (attention, MLP, head) becomes its overlapped form
    (:mod:`~minipar.parallel.tensor_parallel.overlap`: the same slices, messages and
    sums, moved while the GEMMs run); the number swapped."""
    swap = {ColumnParallelLinear: AsyncColumnParallelLinear,
            RowParallelLinear: AsyncRowParallelLinear}
    swapped = 0
    for u in units:
        for owner in (u, getattr(u, "attention", None), getattr(u, "mlp", None)):
            for layer in (vars(owner).values() if owner is not None else ()):
                if type(layer) in swap:
                    layer.__class__ = swap[type(layer)]
                    swapped += 1
    return swapped


def build(spec: RunSpec, grid: Any, **options: Any) -> TensorParallel:
    """The engine of strategies "tp" and "sp" (``sequence_parallel=``; ``hooks=``;
    ``overlap=``; ``timeline=``)."""
    checks.known("tensor parallelism", options, ("sequence_parallel", "hooks", "overlap",
                                                 "timeline"))
    return TensorParallel(grid, spec, **options)
