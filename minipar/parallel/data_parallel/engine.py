"""DDP's engine, the shell around :mod:`~minipar.parallel.data_parallel.ddp` — оболочка — 外壳.

:class:`DataParallel` is the :class:`~minipar.parallel.engine.Engine` of data
parallelism: it checks its options, builds the replica's model states and
buckets, decides which all-reduce each bucket runs, and calls the core
(:func:`~minipar.parallel.data_parallel.ddp.ddp_step` with
:class:`~minipar.parallel.data_parallel.ddp.DDPHooks`) once per step, around
it a barrier and the step's :class:`Timeline` (measured: the executor's
``records`` give the compute per unit, each bucket's request its start and
end); then ``state_dict``, ``memory()``, ``traffic()`` and the bytes counted.

**Which all-reduce, per bucket** (``algorithm="auto"``, the default).  Each
bucket b of S_b bytes takes the algorithm the α–β–γ model of Thakur,
Rabenseifner & Gropp (2005) predicts fastest for S_b on N ranks
(:func:`bucket_algorithm`, :mod:`minipar.collectives.cost_model`: latency α,
bandwidth β and the cost γ of the additions, constants from the committed
``calibration.json``).  Rank 0 decides and broadcasts, so every rank runs
the same algorithm per bucket whatever its files or clocks say.  On 2 ranks
the ring and recursive doubling send the same bytes, but the ring adds S_b/2
where recursive doubling adds S_b: the ring wins from S_b = 2α/γ up.  Only
the ring has a non-blocking version here, so a *ring* bucket is posted when
it is ready and advanced by ``progress()`` between units (overlapped), a
*recursive-doubling* bucket is all-reduced at once, blocking, when it becomes
ready (not overlapped): the right trade for a small bucket, whose cost is
latency — recursive doubling needs log2 N sequential messages, the ring
2(N-1), each advanced about once per unit of backward.  With PyTorch's
default 25 MiB buckets ``auto`` means the overlapped ring on any number of
ranks.  ``ring_min_bytes`` moves auto's switch for one DDP (to see both kinds
of bucket in one step); ``algorithm="ring"`` overlaps every bucket, ``"mpi"``
uses MPI's Iallreduce.  What the choice bought, measured: ``docs/PERFORMANCE.md``.

Model states per rank: the replica's (2 + 2 + K)Ψ bytes under mixed precision
(K = 12; :func:`~minipar.parallel.data_parallel.measure.replica_model_state_bytes`).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from minipar import checks
from minipar.collectives import allreduce
from minipar.collectives.cost_model import LinkCosts, allreduce_time, choose_by_model, load_costs
from minipar.comm.topology import Grid, require_grid
from minipar.comm.traced import TracedComm
from minipar.parallel.common import RunSpec, check_world, fp8_rows
from minipar.parallel.data_parallel.ddp import (
    OP_GRADS,
    Bucket,
    DDPHooks,
    ddp_step,
    local_batch,
    make_buckets,
    start_allreduce,
)
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
from minipar.precision import ModelStates

ALGORITHMS = ("auto", "ring", "mpi")
#: the keyword options of :class:`DataParallel` (``strategies.build("dp", spec, grid, **options)``)
OPTIONS = ("bucket_bytes", "algorithm", "overlap", "ring_min_bytes", "wrap_hooks")
OP_LOSS = "dp_loss_allreduce"
OP_EVAL = "dp_eval_allreduce"
DEFAULT_BUCKET_MB = 25.0  # PyTorch DDP's bucket_cap_mb


def bucket_algorithm(nbytes: int, world: int, algorithm: str = "auto",
                     ring_min_bytes: int | None = None, costs: LinkCosts | None = None) -> str:
    """The all-reduce a bucket of ``nbytes`` bytes runs on ``world`` ranks.

    ``"auto"``: the algorithm the α–β–γ model predicts fastest
    (:func:`~minipar.collectives.cost_model.choose_by_model`, ``costs`` or the committed
    calibration): the overlapped ring or blocking recursive doubling.  With
    ``ring_min_bytes``, the ring from that many bytes up instead (a fixed switch, to see
    both kinds of bucket in one step).  Any other ``algorithm`` (``"ring"``, ``"mpi"``) is
    every bucket's."""
    if algorithm != "auto":
        return algorithm
    if world == 1:
        return "recursive_doubling"
    if ring_min_bytes is not None:
        return "ring" if nbytes >= ring_min_bytes else "recursive_doubling"
    return choose_by_model(nbytes, world, costs)


def choice_note(nbytes: list[int], world: int, costs: LinkCosts) -> str:
    """One line: the model's predicted times of each distinct bucket size, and its pick."""
    parts = []
    for s in sorted(set(nbytes), reverse=True)[:3]:
        t = {a: allreduce_time(a, s, world, costs) for a in ("ring", "recursive_doubling")}
        pick = choose_by_model(s, world, costs)
        parts.append(f"{s:,} B: ring {t['ring'] * 1e6:.1f} us, recursive doubling "
                     f"{t['recursive_doubling'] * 1e6:.1f} us -> {pick.replace('_', ' ')}")
    return (f"auto by the alpha-beta-gamma model (Thakur et al. 2005; alpha "
            f"{costs.alpha_s * 1e6:.1f} us, 1/beta {1e-9 / costs.beta_s_per_byte:.2f} GB/s, "
            f"1/gamma {1e-9 / costs.gamma_s_per_byte:.2f} GB/s; decided on rank 0): "
            + "; ".join(parts))


@dataclass
class Timeline:
    """One step on one rank, seconds from the step's start (after a barrier):
    ``compute`` = [(piece, t0, t1)], ``comm`` = [(bucket index, t0, t1)]."""

    rank: int
    compute: list[tuple[str, float, float]] = field(default_factory=list)
    comm: list[tuple[int, float, float]] = field(default_factory=list)

    def as_dict(self) -> dict[str, Any]:
        return {"rank": self.rank, "compute": self.compute, "comm": self.comm}


class DataParallel:
    """A DDP replica on this rank, an :class:`~minipar.parallel.engine.Engine`:
    ``step(batch)`` cuts this rank's rows of the global batch, runs forward and the
    bucketed, overlapped backward + all-reduce, and the optimizer step
    (:func:`~minipar.parallel.data_parallel.ddp.ddp_step`); the global loss (the same on
    every rank).

    ``grid``: a :class:`~minipar.comm.topology.Grid` of dp ranks only (pp = cp = tp =
    ep = 1); the all-reduces run on ``grid.comm("dp")``.  ``bucket_bytes``: bucket
    capacity in bytes; ``algorithm``: ``"auto"`` (per bucket, what the α–β–γ model
    picks: the overlapped ring or blocking recursive doubling; :func:`bucket_algorithm`), ``"ring"``
    (ours, every bucket overlapped) or ``"mpi"`` (MPI's Iallreduce); ``overlap``: start
    each bucket during backward (True) or all of them after backward (False);
    ``ring_min_bytes``: with ``"auto"`` only, the bucket size in bytes from which the
    ring runs instead of the model's choice (None); ``wrap_hooks(hooks, units) ->
    hooks``: wraps each step's DDP hooks (remat, activation offload:
    :class:`minipar.parallel.offload.wrap.MemoryWrap`; None).  ``bucket_algorithms[i]``
    is bucket i's algorithm.  Every argument is checked on every rank before any message.

    State (:meth:`state_dict`): whole tensors under their serial names — params, the
    fp32 master weights (mixed precision) and the optimizer's moments — with replica =
    this rank's dp coordinate (replica 0 is the copy a checkpoint saves); scalars
    ``step`` and the optimizer's.  A mixture of experts routes each rank's rows as one
    group: the serial oracle's routing is ``(dp,)`` (``spec.routing`` () or that).
    """

    def __init__(self, grid: Grid, spec: RunSpec,
                 bucket_bytes: int = int(DEFAULT_BUCKET_MB * 2**20), algorithm: str = "auto", overlap: bool = True,
                 ring_min_bytes: int | None = None, wrap_hooks: Any = None) -> None:
        require_grid(grid, "data parallelism", ("dp",))
        checks.one_of("the data-parallel algorithm", algorithm, ALGORITHMS)
        if ring_min_bytes is not None and (algorithm != "auto"
                                           or not checks.is_integer(ring_min_bytes)
                                           or ring_min_bytes <= 0):
            raise ValueError(f"ring_min_bytes must be a positive number of bytes, and only with "
                             f"algorithm 'auto'; got {ring_min_bytes!r} with {algorithm!r}")
        if wrap_hooks is not None and not callable(wrap_hooks):
            raise ValueError(f"wrap_hooks must be a function (hooks, units) -> hooks, "
                             f"got {wrap_hooks!r}")
        self.grid = grid
        self.comm: TracedComm = grid.comm("dp")
        self.rank, self.world = self.comm.rank, self.comm.size
        check_world(spec.batch, self.world)
        if spec.experts and spec.routing not in ((), (self.world,)):
            raise ValueError(f"DDP routes each of its {self.world} ranks' rows as one MoE group: "
                             f"routing must be () or ({self.world},), got {spec.routing}")
        self.spec, self.algorithm, self.overlap = spec, algorithm, bool(overlap)
        self.model = spec.model()
        self.states = ModelStates(spec.precision, spec.initial_params(), spec.optimizer,
                                  **spec.opt_kwargs())
        self.layout = self.states.layout
        self.itemsize = self.states.grads.itemsize
        self.buckets = make_buckets(self.layout, bucket_bytes, self.itemsize)
        sizes = [b.size * self.itemsize for b in self.buckets]
        # decided on rank 0 and broadcast: one choice per bucket, the same on every rank
        choice = None
        if self.rank == 0:
            costs = load_costs() if algorithm == "auto" and ring_min_bytes is None else None
            choice = ([bucket_algorithm(s, self.world, algorithm, ring_min_bytes, costs)
                       for s in sizes],
                      choice_note(sizes, self.world, costs) if costs is not None and self.world > 1
                      else "")
        if self.world > 1:
            choice = self.comm.bcast(choice, root=0)
        self.bucket_algorithms, self.choice_note = choice
        self.timelines: list[Timeline] = []
        self.wrap_hooks = wrap_hooks
        self.walks: list[Any] = []  # what wrap_hooks made (closed by close())
        self.steps_done = 0
        self._traffic = AxisTraffic(grid)

    # -- one step -------------------------------------------------------------
    def local_batch(self, batch: Batch) -> tuple[Any, Any, float]:
        """This rank's rows of the global ``batch`` and their weight b_r / B
        (:func:`~minipar.parallel.data_parallel.ddp.local_batch`)."""
        return local_batch(batch, self.rank, self.world)

    def start_bucket(self, b: Bucket) -> Any:
        """Start bucket ``b``'s all-reduce with its algorithm
        (:func:`~minipar.parallel.data_parallel.ddp.start_allreduce`)."""
        return start_allreduce(self.comm, self.states.grads, b, self.bucket_algorithms[b.index])

    def step(self, batch: Batch) -> StepResult:
        """Forward, bucketed and overlapped backward + all-reduce, optimizer step
        (:func:`~minipar.parallel.data_parallel.ddp.ddp_step`).  ``records``: this rank's
        :class:`Timeline` of the step."""
        c, st = self.comm, self.states
        c.Barrier()  # align the ranks' clocks for the timeline (not counted as gradient bytes)
        t0 = time.perf_counter()
        x, y, weight = self.local_batch(batch)
        hooks = DDPHooks(st.param_views(), st.grads, self.layout, self.buckets, self.start_bucket,
                         self.overlap)
        units = self.model.units()
        walk = hooks if self.wrap_hooks is None else self.wrap_hooks(hooks, units)
        if walk is not hooks and hasattr(walk, "close"):
            self.walks.append(walk)
        records: list[tuple[str, str, float, float]] = []
        with fp8_rows(self.spec, c):  # per-tensor FP8: the whole batch's amax
            loss, done = ddp_step(units, hooks, st, x, y, weight, walk, records)
        t1 = time.perf_counter()
        self.timelines.append(self.timeline(records, hooks.inflight, t0, t1))
        self.steps_done += 1
        with c.operation(OP_LOSS):
            total = allreduce(c, np.array([weight * loss]))  # auto: recursive doubling
        return StepResult(float(total[0]), skipped=not done, records=(self.timelines[-1],))

    def timeline(self, records: list[tuple[str, str, float, float]], requests: list[Any],
                 t0: float, t1: float) -> Timeline:
        """The step's :class:`Timeline` from the executor's ``records`` and the buckets'
        ``requests`` (each holds when it was posted and seen complete): the optimizer ran
        from the end of backward and of the last all-reduce to ``t1``."""
        tl = Timeline(self.rank)
        fwd = [r for r in records if r[0] == "forward"]
        tl.compute.append(("forward", fwd[0][2] - t0, fwd[-1][3] - t0))
        tl.compute += [(name, a - t0, b - t0) for what, name, a, b in records if what == "backward"]
        tl.comm += [(b.index, req.t_start - t0, req.t_end - t0)
                    for b, req in zip(self.buckets, requests)]
        t_opt = max([records[-1][3], *(req.t_end for req in requests)])
        tl.compute.append(("optimizer", t_opt - t0, t1 - t0))
        return tl

    def evaluate(self, batch: Batch) -> float:
        """Forward only: this rank's rows' mean loss x b_r / B, summed over the ranks."""
        x, y, weight = self.local_batch(batch)
        with fp8_rows(self.spec, self.comm):
            loss = self.model.loss(self.states.param_views(), x, y)
        with self.comm.operation(OP_EVAL):
            return float(allreduce(self.comm, np.array([weight * loss]))[0])

    # -- the engine's state -----------------------------------------------------
    def state_dict(self) -> State:
        """Whole tensors (params, master, moments), replica = this rank's dp coordinate."""
        st = model_states(self.states, replica=self.rank)
        st.scalars["step"] = self.steps_done
        return st

    def load_state_dict(self, state: State | list[State]) -> None:
        """Params, master weights, moments and the optimizer's t from any layout's states."""
        self.steps_done = load_model_states(self.states, sources_of(state))

    def full_params(self) -> dict[str, Any]:
        """The replica's parameters (every rank holds them all: no message)."""
        return {n: v.copy() for n, v in self.states.param_views().items()}

    def memory(self) -> dict[str, int]:
        """Model-state bytes of the replica, by kind."""
        return memory_of(self.states)

    def traffic(self) -> dict[str, int]:
        """Bytes this rank sent since the last call, by grid axis (and ``"world"``)."""
        return self._traffic()

    def close(self) -> None:
        """Free what the hooks' wrappers made (offload files)."""
        for walk in self.walks:
            walk.close()
        self.walks = []

    # -- evidence -------------------------------------------------------------
    def bytes_sent_per_step(self) -> float:
        """Bytes this rank sent in gradient all-reduces, per step (counted)."""
        return self.comm.stats.bytes_sent(OP_GRADS) / max(1, len(self.timelines))


def build(spec: RunSpec, grid: Grid, **options: Any) -> DataParallel:
    """The ``"dp"`` row of :mod:`minipar.parallel.strategies`: ``DataParallel(grid, spec,
    **options)`` (``bucket_bytes``, ``algorithm``, ``overlap``, ``ring_min_bytes``,
    ``wrap_hooks``); ValueError naming any other option."""
    checks.known("data parallelism", options, OPTIONS)
    return DataParallel(grid, spec, **options)
