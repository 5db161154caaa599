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
accumulated.  Top-1 and top-2, the capacity factor, the dropped tokens and
the Switch auxiliary loss are the serial block's, computed by its own
functions; tests/test_expert_parallel.py checks float64 parity with drops on
1, 2 and 4 ranks, E = 4 and 8, and with ep < N (EP x data parallelism).

**Bytes per step the tests check** (counted per grid axis,
:meth:`ExpertParallel.bytes_formula`): on ``ep``, per MoE layer, the exact
all-to-all figures of
:func:`~minipar.parallel.expert_parallel.measure.alltoall_bytes`
(4·(ep−1)/ep·E·C·d·b for the data when every rank has the same C, plus the
counts); on ``dp`` one all-reduce of the dense gradients, on ``edp`` one of
this rank's experts' gradients, each the exact figure of the algorithm auto
picks (:func:`minipar.collectives.cost.allreduce_bytes_sent`).

Bad input (:func:`~minipar.parallel.expert_parallel.layout.check_ep`): no
experts, E not divisible by ep, top-k outside 1..min(2, E), capacity factor
<= 0, ep not dividing the N data-parallel ranks: one ``ValueError`` on every
rank before any message.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import numpy as np

from minipar.collectives import allreduce
from minipar.collectives.cost import allreduce_bytes_sent
from minipar.comm.topology import Grid
from minipar.comm.traced import traced
from minipar.nn import executor
from minipar.nn.gpt import param_shapes
from minipar.optim import FlatParams
from minipar.parallel.common import RunSpec, check_world, local_rows, loss_weight
from minipar.parallel.expert_parallel.layer import EPBlockUnit, ep_units
from minipar.parallel.expert_parallel.layout import OPS, capacities, check_ep
from minipar.parallel.expert_parallel.measure import alltoall_bytes
from minipar.precision import ModelStates

__all__ = ["OP_DENSE", "OP_EXPERT", "OP_LOSS", "EPHooks", "ExpertParallel",
           "dense_then_experts", "is_expert", "sync_grads"]

OP_DENSE, OP_EXPERT, OP_LOSS = "ep_dense_allreduce", "ep_expert_allreduce", "ep_loss_allreduce"


def is_expert(name: str) -> bool:
    """Whether the serial parameter ``name`` belongs to an expert (``blocks.i.moe.experts.e.*``)."""
    return ".moe.experts." in name


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
                               "routed": [int(v) for v in f["routed"]],
                               "tokens_per_expert": [int(v) for v in f["tokens_per_expert"]]})
        return saved

    def on_grads(self, unit: Any, grads: dict[str, Any]) -> None:
        for k, g in grads.items():
            self.grad_views[unit.prefix + k][...] = g


class ExpertParallel:
    """One rank of EP x data-parallel training of ``spec``'s MoE GPT.

    ``comm``: the N data-parallel ranks (an mpi4py communicator or TracedComm);
    ``ep``: ranks per expert-parallel group (default N).  ``train_step(step)``
    returns the global loss (the same on every rank); ``full_params()`` the
    whole model's flat parameters in the serial layout (rank 0; None elsewhere);
    ``stats`` per step, per MoE block, this rank's routing.
    """

    def __init__(self, comm: Any, spec: RunSpec, ep: int | None = None) -> None:
        world = comm.Get_size()
        ep = world if ep is None else ep
        check_ep(spec.experts, spec.top_k, spec.capacity_factor, ep, world)
        check_world(spec.batch, world)
        self.spec, self.ep_size = spec, ep
        self.grid = Grid(traced(comm), dp=world, ep=ep)
        self.comm = self.grid.world
        self.rank, self.world = self.comm.rank, world
        self.cfg = spec.config()
        self.rows = local_rows(spec.batch, self.rank, world)
        self.weight = loss_weight(spec.batch, self.rank, world)
        group = self.grid.ranks("ep")
        tokens = [spec.seq * (hi - lo) for lo, hi in
                  (local_rows(spec.batch, r, world) for r in group)]
        self.caps = capacities(spec.experts, spec.capacity_factor, tokens, spec.top_k)
        self.units = ep_units(self.cfg, self.grid.comm("ep"), self.caps,
                              tokens[self.grid.coord("ep")])
        first = self.units[1]
        self.experts = first.moe.ids if isinstance(first, EPBlockUnit) else []
        init = spec.initial_params()
        mine = {n for u in self.units for n in u.full_names}
        dense, own = dense_then_experts(n for n in init if n in mine)
        self.n_dense = sum(init[n].size for n in dense)
        self.states = ModelStates(spec.precision, {n: init[n] for n in dense + own},
                                  spec.optimizer, **spec.opt_kwargs())
        self.layout = self.states.layout
        self.itemsize = self.states.grads.itemsize
        self.stats: list[list[dict[str, Any]]] = []

    # -- one step ---------------------------------------------------------------------
    def train_step(self, step: int) -> float:
        """Forward (all-to-alls inside the MoE blocks), backward, gradient all-reduces
        (dense over dp, experts over edp), optimizer step; the global loss."""
        st = self.states
        x, y = self.spec.local_batch(step, self.rank, self.world)
        hooks = EPHooks(st.param_views(), self.layout.unflatten(st.grads))
        loss = executor.loss_and_grads(self.units, hooks, x, y, self.weight * st.loss_scale)
        self.stats.append(hooks.stats)
        g = st.grads
        sync_grads(self.grid, g, self.n_dense)
        found_inf = None
        if st.scaler is not None:  # every rank must skip the step alike
            inf = np.array([float(not np.isfinite(g).all())])
            found_inf = bool(allreduce(self.comm, inf, op="max")[0])
        st.step(found_inf=found_inf)
        with self.comm.operation(OP_LOSS):
            total = allreduce(self.comm, np.array([self.weight * loss]))
        return float(total[0])

    def train(self) -> list[float]:
        """``spec.steps`` steps; the global losses."""
        return [self.train_step(s) for s in range(self.spec.steps)]

    def free(self) -> None:
        """Free the grid's sub-communicators (collective: every rank calls it)."""
        self.grid.free()

    # -- evidence ---------------------------------------------------------------------
    def full_params(self) -> Any:
        """The whole model's flat parameters in the serial layout, on rank 0 (None elsewhere):
        rank 0's dense parameters and every expert from the rank holding it."""
        views = self.states.param_views()
        experts = {n: np.array(v) for n, v in views.items() if is_expert(n)}
        got = self.comm.comm.gather(experts)  # not counted: a report, not training traffic
        if self.rank != 0:
            return None
        full = {n: views[n] for n in views if not is_expert(n)}
        for part in got:
            full.update(part)
        shapes = param_shapes(self.cfg)
        return FlatParams.from_shapes(shapes).flatten({n: full[n] for n in shapes},
                                                      self.states.params.dtype)

    def bytes_by_axis(self, steps: int | None = None) -> dict[str, float]:
        """Bytes this rank sent per step on the ep, edp and dp communicators (counted)."""
        n = max(1, len(self.stats) if steps is None else steps)
        return {a: b / n for a, b in self.grid.bytes_by_axis().items() if a in ("ep", "edp", "dp")}

    def bytes_formula(self) -> dict[str, int]:
        """The exact bytes per step on each axis, from the formulas (module docstring)."""
        moe_layers = sum(isinstance(u, EPBlockUnit) for u in self.units)
        a2a = alltoall_bytes(self.cfg.n_experts, self.cfg.d_model, self.caps,
                             self.grid.coord("ep"), self.itemsize)
        n_exp = self.layout.size - self.n_dense
        return {"ep": moe_layers * sum(a2a[k] for k in OPS),
                "edp": allreduce_bytes_sent(n_exp, self.itemsize, self.grid.size("edp"),
                                            self.grid.coord("edp"), "auto"),
                "dp": allreduce_bytes_sent(self.n_dense, self.itemsize, self.world, self.rank,
                                           "auto")}

    def alltoall_data_bytes(self) -> int:
        """Bytes per step of the four data all-to-alls alone (no counts): the figure
        :func:`minipar.plan.moe.moe_alltoall_bytes_per_rank` (backward=True) gives for top-1."""
        moe_layers = sum(isinstance(u, EPBlockUnit) for u in self.units)
        a2a = alltoall_bytes(self.cfg.n_experts, self.cfg.d_model, self.caps,
                             self.grid.coord("ep"), self.itemsize)
        return moe_layers * sum(a2a[k] for k in OPS[1:])
