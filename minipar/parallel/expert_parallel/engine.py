"""Expert parallelism (EP) — параллелизм экспертов — 专家并行.

EN expert parallelism · RU параллелизм экспертов · ZH 专家并行

GShard (Lepikhin et al. 2020, arXiv 2006.16668), Switch Transformer (Fedus,
Zoph & Shazeer 2021, arXiv 2101.03961), DeepSpeed-MoE (Rajbhandari et al.
2022, arXiv 2201.05596) for EP combined with data parallelism.  N ranks are
data-parallel: rank r trains on its rows of the global batch, weighted
b_r / B (:mod:`minipar.parallel.common`).  The grid
(:class:`minipar.comm.topology.Grid` ``(comm, dp=N, ep=ep)``) cuts them into
blocks of ``ep`` ranks; inside a block each rank holds E/ep of every MoE
layer's experts and tokens travel to them by all-to-all
(:mod:`minipar.parallel.expert_parallel.layer`: dispatch → a2a → experts → a2a →
combine, fixed-capacity (E, C, d) buffers, and why); ``edp`` groups the ranks
that hold the same experts in the other blocks.  4 ranks, ep = 2, E = 4::

    ep group [0, 1]:  rank 0 experts 0 1 | rank 1 experts 2 3     edp groups [0, 2], [1, 3]
    ep group [2, 3]:  rank 2 experts 0 1 | rank 3 experts 2 3

**Gradients.**  Dense parameters (embedding, attention, LayerNorms, routers,
head) are replicated on all N ranks: their gradients are all-reduced over
all data-parallel ranks (``grid.comm("dp")``).  An expert's gradient already
sums, on its rank, the tokens every rank of the ep group sent it; it is
all-reduced only over its replicas (``grid.comm("edp")``, N/ep ranks; nothing
to do when ep = N).  Both with :func:`minipar.collectives.allreduce` (auto).
Each rank's parameters and optimizer states are the dense ones and its own
experts' only: (dense + expert/ep) instead of the whole model, in one flat
buffer with the dense parameters first and the rank's experts after them, so
that each all-reduce takes one contiguous span (:func:`dense_then_experts`,
:func:`sync_grads`: public, so the hybrid engine's EP stages can share them).

**Same drops as the serial run** (issue 11): every rank routes its own
micro-batch as one group, capacity C_r = ⌈n_r/E × capacity_factor⌉ over its
n_r = b_r·T tokens (GShard's local groups), so the oracle is
``serial_reference(spec, N)``: N micro-batches cut like the ranks' rows,
accumulated — the serial engine with routing groups ``(N,)``
(``RunSpec(routing=(N,))``; a spec naming other groups is refused).  Top-1 and
top-2, the capacity factor, the dropped tokens and the Switch auxiliary loss are
the serial block's, computed by its own functions; tests/test_expert_parallel.py
checks float64 parity with drops on 1, 2 and 4 ranks, E = 4 and 8, and with
ep < N (EP x data parallelism).

**The engine** (:class:`~minipar.parallel.engine.Engine`).  ``step(batch)`` takes
rank r's rows ``[lo_r, hi_r)`` of the global batch
(:func:`~minipar.parallel.common.local_rows`).
``state_dict()`` holds every tensor whole under its serial name: the dense ones on
every rank (replica = the rank), each expert's (``blocks.i.moe.experts.e.*``) on the
N/ep ranks holding it (replica = the edp coordinate), params, master weights and
moments alike; so a checkpoint saves each tensor once and any layout (another ep,
the serial engine) loads it.  ``full_params()`` gives every rank the whole model: its
dense tensors and the experts all-gathered over the ep group.

**Bytes per step the tests check** (counted per grid axis over the steps,
:meth:`ExpertParallel.bytes_by_axis`, against :meth:`ExpertParallel.bytes_formula`): on
``ep``, per MoE layer, the exact all-to-all figures of
:func:`~minipar.parallel.expert_parallel.measure.alltoall_bytes`
(4·(ep−1)/ep·E·C·d·b for the data when every rank has the same C, plus the
counts); on ``dp`` one all-reduce of the dense gradients, on ``edp`` one of
this rank's experts' gradients, each the exact figure of the algorithm auto
picks (:func:`minipar.collectives.cost.allreduce_bytes_sent`).

**DeepSeek-V3's experts** (:mod:`minipar.nn.moe_routing`): the shared experts are dense
(replicated, their gradients all-reduced over dp); dropless sends the counts first and
then only the tokens (:mod:`~minipar.parallel.expert_parallel.layer`), its bytes
(:func:`~minipar.parallel.expert_parallel.measure.rows_bytes`) the rows that went, mean
over the steps; the loss-free bias (:class:`~minipar.parallel.expert_bias.ExpertBias`) is
updated after each step from the loads summed over all N ranks (the step's global
batch), identical everywhere, saved by rank 0 (kind ``buffer``); node-limited groups
map onto whole ranks.

Bad input (:func:`~minipar.parallel.expert_parallel.options.check_ep`): no
experts, E not divisible by ep, top-k outside 1..E, capacity factor
<= 0, ep not dividing the N data-parallel ranks, expert groups that are not whole ranks,
a grid with a pp, cp or tp axis,
routing groups that are not ``(N,)``, any option: one ``ValueError`` on every rank
before any message.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import numpy as np

from minipar import checks
from minipar.backend import to_host
from minipar.collectives import all_gather, allreduce
from minipar.collectives.cost import allreduce_bytes_sent
from minipar.comm.topology import Grid, require_grid
from minipar.nn import executor
from minipar.nn.gpt import param_shapes
from minipar.nn.loss import cross_entropy_forward
from minipar.optim import FlatParams
from minipar.parallel.common import RunSpec, check_world, found_inf, local_rows, loss_weight
from minipar.parallel.engine import (
    AxisTraffic,
    Batch,
    State,
    StepResult,
    load_buffers,
    load_model_states,
    memory_of,
    model_states,
    routing_spans,
    sources_of,
    with_buffers,
)
from minipar.parallel.expert_bias import ExpertBias
from minipar.parallel.expert_parallel.layout import OPS, capacities, expert_ids
from minipar.parallel.expert_parallel.measure import alltoall_bytes, rows_bytes
from minipar.parallel.expert_parallel.model import EPBlockUnit, ep_units
from minipar.parallel.expert_parallel.options import check_ep
from minipar.precision import ModelStates

__all__ = ["OP_DENSE", "OP_EXPERT", "OP_FULL", "OP_LOSS", "EPHooks", "ExpertParallel", "build",
           "dense_then_experts", "expert_of", "is_expert", "sync_grads"]

OP_DENSE, OP_EXPERT, OP_LOSS = "ep_dense_allreduce", "ep_expert_allreduce", "ep_loss_allreduce"
OP_FULL = "ep_full_params"  # full_params: the experts all-gathered over the ep group


def is_expert(name: str) -> bool:
    """Whether the serial parameter ``name`` belongs to an expert (``blocks.i.moe.experts.e.*``)."""
    return ".moe.experts." in name


def expert_of(name: str) -> int:
    """The expert index e of the serial expert parameter ``blocks.i.moe.experts.e.*``."""
    return int(name.split(".moe.experts.")[1].split(".")[0])


def dense_then_experts(names: Iterable[str]) -> tuple[list[str], list[str]]:
    """``names`` cut in two, each in the given order: the dense parameters (replicated on
    every data-parallel rank) and the experts' (held by one rank of each ep group).  A flat
    buffer of the first then the second gives each gradient all-reduce one span."""
    names = list(names)
    return ([n for n in names if not is_expert(n)], [n for n in names if is_expert(n)])


def sync_grads(grid: Any, grads: Any, n_dense: int, algorithm: str = "auto",
               ops: tuple[str, str] = (OP_DENSE, OP_EXPERT)) -> None:
    """Sum a flat gradient buffer laid out by :func:`dense_then_experts`, in place: its first
    ``n_dense`` elements over ``grid``'s ``dp`` axis (every data-parallel rank), the rest over
    ``edp`` (the ranks holding the same experts).  ``ops``: the names the two all-reduces are
    counted under; ``algorithm``: :func:`minipar.collectives.allreduce`'s."""
    dp, edp = grid.comm("dp"), grid.comm("edp")
    with dp.operation(ops[0]):
        grads[:n_dense] = allreduce(dp, grads[:n_dense], "sum", algorithm)
    with edp.operation(ops[1]):
        grads[n_dense:] = allreduce(edp, grads[n_dense:], "sum", algorithm)


class EPHooks(executor.Hooks):
    """Parameters are views of this rank's flat buffer; a unit's gradients go into the
    flat gradient buffer; each MoE block's routing statistics are kept for the step."""

    def __init__(self, views: dict[str, Any], grad_views: dict[str, Any]) -> None:
        super().__init__(views)
        self.grad_views, self.stats = grad_views, []

    def on_saved(self, unit: Any, saved: Any, x: Any) -> Any:
        if isinstance(unit, EPBlockUnit):
            f = saved["ffn"]
            self.stats.append({"capacity": int(f["capacity"]), "dropped": int(f["dropped"]),
                               "routed": [int(v) for v in to_host(f["routed"])],
                               "loads": [int(v) for v in to_host(f["loads"])],
                               "tokens_per_expert": [int(v) for v in
                                                     to_host(f["tokens_per_expert"])],
                               "sent": [int(v) for v in f["sent"]],
                               "rows_in": np.asarray(f["rows_in"]).tolist()})
        return saved

    def on_grads(self, unit: Any, grads: dict[str, Any]) -> None:
        for k, g in grads.items():
            self.grad_views[unit.prefix + k][...] = g


class ExpertParallel:
    """One rank of EP x data-parallel training of ``spec``'s MoE GPT: an
    :class:`~minipar.parallel.engine.Engine`.

    ``grid``: a :class:`~minipar.comm.topology.Grid` ``(comm, dp=N, ep=ep)`` of the N
    data-parallel ranks (no pp, cp or tp axis); its ``ep`` axis is the expert-parallel
    group, ``edp`` the ranks holding the same experts.  No options (ValueError for any:
    the layout is the grid's).  ``step(batch)`` trains on this rank's rows of the global
    batch and returns the global loss (the same on every rank); ``full_params()`` gives
    every rank the whole model in serial names; ``stats`` per step, per MoE block, this
    rank's routing; ``bytes_by_axis()`` the bytes the steps sent per step on each axis.
    """

    def __init__(self, grid: Grid, spec: RunSpec, **options: Any) -> None:
        checks.known("expert parallelism", options, (),
                     "its layout is the grid's: Grid(comm, dp=N, ep=...)")
        require_grid(grid, "expert parallelism", ("dp", "ep"),
                     "the hybrid engine combines them")
        world = grid.world.size
        check_ep(spec.experts, spec.top_k, spec.capacity_factor, grid.size("ep"), world,
                 spec.expert_groups)
        check_world(spec.batch, world)
        groups = [local_rows(spec.batch, r, world) for r in range(world)]
        if spec.routing and routing_spans(spec.batch, spec.routing) != groups:
            raise ValueError(f"routing groups {spec.routing} are not expert parallelism's: each "
                             f"of the {world} data-parallel ranks routes its own rows as one "
                             f"group, routing ({world},)")
        self.spec, self.grid, self.comm = spec, grid, grid.world
        self.rank, self.world = self.comm.rank, world
        self.cfg = spec.config()
        self.rows = groups[self.rank]
        self.weight = loss_weight(spec.batch, self.rank, world)
        tokens = [spec.seq * (hi - lo) for lo, hi in (groups[r] for r in grid.ranks("ep"))]
        self.caps = capacities(spec.experts, spec.capacity_factor, tokens, spec.top_k)
        self.units = ep_units(self.cfg, grid.comm("ep"), self.caps, tokens[grid.coord("ep")])
        first = self.units[1]
        self.experts = first.moe.ids if isinstance(first, EPBlockUnit) else []
        init = spec.initial_params()
        mine = {n for u in self.units for n in u.full_names}
        dense, own = dense_then_experts(n for n in init if n in mine)
        self.n_dense = sum(init[n].size for n in dense)
        self.states = ModelStates(spec.precision, {n: init[n] for n in dense + own},
                                  spec.optimizer, **spec.opt_kwargs())
        self.bias = ExpertBias(self.cfg, range(self.cfg.n_layer), replica=self.rank)
        self.layout = self.states.layout
        self.itemsize = self.states.grads.itemsize
        self.stats: list[list[dict[str, Any]]] = []
        self.steps_done = 0
        self._step_bytes = dict.fromkeys(self._sent(), 0)  # sent by step() alone
        self._traffic = AxisTraffic(grid)

    def _sent(self) -> dict[str, int]:
        """Bytes this rank has sent on each grid axis and on the grid's own communicator
        (the loss all-reduce), from the shared counters."""
        world = self.comm.stats.bytes_sent(comm=self.comm.name)
        return {**self.grid.bytes_by_axis(), "world": world}

    def _local(self, batch: Batch) -> tuple[Any, Any]:
        """This rank's rows of the global ``batch`` (its routing group)."""
        if batch.size != self.spec.batch:
            raise ValueError(f"expert parallelism: a batch of {batch.size} rows, but the "
                             f"capacities were set for --batch {self.spec.batch} rows")
        mine = batch.rows(*self.rows)
        return mine.tokens, mine.targets

    def _views(self) -> dict[str, Any]:
        """The parameter views and the loss-free biases the units fetch."""
        return {**self.states.param_views(), **self.bias.views()}

    def _global_loss(self, loss: float) -> float:
        with self.comm.operation(OP_LOSS):
            return float(allreduce(self.comm, np.array([self.weight * loss]))[0])

    # -- one step ---------------------------------------------------------------------
    def step(self, batch: Batch) -> StepResult:
        """Forward (all-to-alls inside the MoE blocks), backward, gradient all-reduces
        (dense over dp, experts over edp), optimizer step on this rank's rows of the
        global ``batch``; the global loss."""
        before = self._sent()
        st = self.states
        x, y = self._local(batch)
        hooks = EPHooks(self._views(), self.layout.unflatten(st.grads))
        loads: dict[str, Any] = {}
        loss = executor.loss_and_grads(self.units, hooks, x, y, self.weight * st.loss_scale,
                                       loads=loads)
        self.stats.append(hooks.stats)
        self.bias.update(loads, self.comm)  # the step's global batch: every data-parallel rank
        g = st.grads
        sync_grads(self.grid, g, self.n_dense)
        done = st.step(found_inf=found_inf(self.comm, st))  # every rank skips alike
        total = self._global_loss(loss)
        self.steps_done += 1
        for k, v in self._sent().items():
            self._step_bytes[k] = self._step_bytes.get(k, 0) + v - before.get(k, 0)
        return StepResult(total, skipped=not done)

    def evaluate(self, batch: Batch) -> float:
        """Forward only (the all-to-alls run, nothing is trained): the global mean loss,
        each rank's rows routed as one group."""
        x, y = self._local(batch)
        aux: list[float] = []
        logits, _ = executor.forward(self.units, executor.Hooks(self._views()), x, aux=aux)
        return self._global_loss(cross_entropy_forward(logits, y)[0] + sum(aux))

    # -- state ------------------------------------------------------------------------
    def state_dict(self) -> State:
        """Every tensor whole, in its serial name: the dense ones on every rank (replica =
        the rank, 0 saves them), each expert's on the ranks holding it (replica = the edp
        coordinate, 0 saves them); params, master weights and moments alike."""
        dp, edp = self.grid.coord("dp"), self.grid.coord("edp")
        st = model_states(self.states, replica=lambda name: edp if is_expert(name) else dp)
        st.scalars["step"] = self.steps_done
        return with_buffers(st, self.bias.arrays, self.rank)

    def load_state_dict(self, state: State | Iterable[State]) -> None:
        """This rank's tensors from the overlapping pieces of ``state`` (any layout's)."""
        sources = sources_of(state)
        self.steps_done = load_model_states(self.states, sources)
        load_buffers(self.bias.arrays, sources)

    def full_params(self) -> dict[str, Any]:
        """Collective: the whole model on every rank, serial names in the serial order, the
        parameter dtype: the dense tensors this rank holds, every expert all-gathered over
        the ep group (counted on ``ep``)."""
        views = self.states.param_views()
        ep = self.grid.comm("ep")
        with ep.operation(OP_FULL):
            got = all_gather(ep, self.states.params[self.n_dense:])
        own = self.layout.size - self.n_dense  # the same on every rank of the group
        shapes = param_shapes(self.cfg)
        out: dict[str, Any] = {}
        for j in range(ep.size):
            ids = expert_ids(self.cfg.n_experts, ep.size, j)
            names = [n for n in shapes if is_expert(n) and expert_of(n) in ids]
            part = FlatParams.from_shapes({n: shapes[n] for n in names})
            out.update(part.unflatten(got[j * own:(j + 1) * own]))
        return {n: out[n] if is_expert(n) else views[n].copy() for n in shapes}

    def memory(self) -> dict[str, int]:
        """Model-state bytes this rank holds by kind: the dense tensors and its E/ep experts."""
        return memory_of(self.states)

    def traffic(self) -> dict[str, int]:
        """Bytes this rank sent since the last call, by grid axis (and ``"world"``)."""
        return self._traffic()

    def close(self) -> None:
        """Nothing to free: the communicators are the grid's (its owner frees them)."""

    # -- evidence ---------------------------------------------------------------------
    def bytes_by_axis(self) -> dict[str, float]:
        """Bytes this rank sent per step on the ep, edp and dp communicators, counted over
        the steps alone (not ``evaluate`` or ``full_params``)."""
        n = max(1, self.steps_done)
        return {a: b / n for a, b in self._step_bytes.items() if a in ("ep", "edp", "dp")}

    def bytes_formula(self) -> dict[str, int]:
        """The exact bytes per step on each axis, from the formulas (module docstring)."""
        n_exp = self.layout.size - self.n_dense
        return {"ep": sum(sum(a[k] for k in OPS) for a in self._alltoall_per_layer()),
                "edp": allreduce_bytes_sent(n_exp, self.itemsize, self.grid.size("edp"),
                                            self.grid.coord("edp"), "auto"),
                "dp": allreduce_bytes_sent(self.n_dense, self.itemsize, self.world, self.rank,
                                           "auto")}

    def alltoall_data_bytes(self) -> int:
        """Bytes per step of the four data all-to-alls alone (no counts): the figure
        :func:`minipar.plan.moe.moe_alltoall_bytes_per_rank` (backward=True) gives for top-1."""
        return sum(sum(a[k] for k in OPS[1:]) for a in self._alltoall_per_layer())

    def _alltoall_per_layer(self) -> list[dict[str, float]]:
        """Per MoE layer, the bytes per step of each all-to-all: fixed by the capacities, or,
        dropless, the rows the steps really sent (their mean over the steps)."""
        moe_layers = sum(isinstance(u, EPBlockUnit) for u in self.units)
        coord, d = self.grid.coord("ep"), self.cfg.d_model
        if self.caps[0] is not None:
            return [alltoall_bytes(self.cfg.n_experts, d, self.caps, coord,
                                   self.itemsize)] * moe_layers
        per_step = [[rows_bytes(s["sent"], s["rows_in"], coord, d, self.itemsize)
                     for s in step] for step in self.stats]
        n = max(1, len(per_step))
        return [{k: sum(step[i][k] for step in per_step) / n for k in OPS}
                for i in range(moe_layers)] if per_step else []


def build(spec: RunSpec, grid: Grid, **options: Any) -> ExpertParallel:
    """The EP engine of ``spec`` on ``grid`` (:mod:`minipar.parallel.strategies`' row "ep")."""
    return ExpertParallel(grid, spec, **options)
