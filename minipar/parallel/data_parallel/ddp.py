"""Data parallelism (DDP) — параллелизм по данным — 数据并行.

Li et al. 2020, "PyTorch Distributed: Experiences on Accelerating Data
Parallel Training", arXiv 2006.15704; Sergeev & Del Balso 2018, "Horovod",
arXiv 1802.05799.  Every rank holds a full replica of the model states; rank
r computes the gradients of its rows of the global batch
(:func:`minipar.parallel.common.local_rows`), weighted by b_r / B so that the
*sum* over ranks is the serial mean gradient, and the ranks sum them with an
all-reduce.  Then every rank takes the same optimizer step on the same
gradient: the replicas stay identical, and equal to the serial run.

**Buckets, overlapped with backward** (DDP's ``bucket_cap_mb``).  The
gradients are grouped, in *reverse* parameter order (the order backward
produces them: ``lm_head`` first, ``tok_emb`` last), into buckets of at least
``bucket_bytes`` bytes; a bucket is a contiguous span of the flat gradient
buffer.  The step is the units executor's walk (:mod:`minipar.nn.executor`)
with DDP's hooks (:class:`DDPHooks`): ``fetch`` hands out views of the flat
parameters, ``on_grads`` writes a unit's gradients into the flat gradient
buffer and, as soon as a bucket's last gradient exists, starts its
all-reduce, while backward goes on with earlier units; after every unit it
calls ``progress()`` on the reductions in flight.  :class:`Timeline` records,
per rank, the compute intervals per unit (the executor's records) and the
communication interval per bucket — the overlap, measured.  MoE blocks need
nothing extra: the executor adds their auxiliary loss and scales its
gradient like the loss's.

**Which all-reduce, per bucket** (``algorithm="auto"``, the default).  Each
bucket b of S_b bytes takes the algorithm the α–β–γ model of Thakur,
Rabenseifner & Gropp (2005) predicts fastest for S_b on N ranks
(:func:`bucket_algorithm`, :mod:`minipar.collectives.cost_model`: latency α,
bandwidth β and the cost γ of the additions, constants from the committed
``calibration.json``).  Rank 0 decides and broadcasts, so every rank runs
the same algorithm per bucket whatever its files or clocks say.  On 2 ranks
the ring and recursive doubling send the same bytes, but the ring adds S_b/2
where recursive doubling adds S_b: the ring wins from S_b = 2α/γ up (a few
hundred KiB here).  Only the ring has a non-blocking
version here (:mod:`minipar.collectives.nonblocking`), so:

* a *ring* bucket is posted when it is ready and advanced by ``progress()``
  between units: overlapped with backward, as above;
* a *recursive-doubling* bucket is all-reduced at once, blocking, when it
  becomes ready (:class:`~minipar.collectives.nonblocking.BlockingAllreduceRequest`):
  that bucket is **not overlapped**.  That is the right trade for a small bucket: its cost is
  latency, not bandwidth — recursive doubling needs log2 N sequential
  messages, the ring 2(N-1), and the non-blocking ring advances only when a
  rank calls ``progress()``, about one step per unit of backward, so a small
  bucket posted as a ring would sit in flight for up to 2(N-1) units to
  save a few tens of microseconds of blocking.

With PyTorch's default 25 MiB buckets ``auto`` means the overlapped ring on
any number of ranks.  The model compares *blocking* times, so it is
conservative for the ring, which also overlaps.  Before the model, auto took
recursive doubling below 8 MiB (then the blocking collectives' rule too;
:func:`~minipar.collectives.auto.choose_allreduce` now asks the same model): in ``minipar bench dp``
(Ψ = 3.4 M float32, 13 buckets of 1 MiB, 2 ranks on this 2-core machine)
that cost 1.66-1.85x speed-up against 1.92-1.99x with the ring on every
bucket, which is what the model now picks there.  ``ring_min_bytes`` moves auto's
switch for one DDP (to see both kinds of bucket in one step on a small
model); ``algorithm="ring"`` overlaps every bucket, ``"mpi"`` uses MPI's
Iallreduce.

Formula the tests check (bytes per rank per step, S = Ψ x itemsize): each
bucket b of n_b elements costs the exact figure of the algorithm a_b it ran,
so rank r sends exactly

    Σ_b allreduce_bytes_sent(n_b, itemsize, N, r, a_b)       (measure.bytes_formula(dp))

counted under ``"dp_grad_allreduce"`` (the loss, one number, all-reduced by
auto under ``"dp_loss_allreduce"``).  With the ring on every bucket that is
≈ 2(N-1)/N x S, the ZeRO paper's "2Ψ" per step for DP (Rajbhandari et al.
2019, arXiv 1910.02054, §7: reduce-scatter Ψ + all-gather Ψ elements, i.e.
2Ψ x (N-1)/N elements sent per rank on a ring); recursive doubling sends
log2 N x S_b per bucket when N is a power of two (S_b on 2 ranks, as the
ring).  Model states per rank: the replica's (2 + 2 + K)Ψ bytes under mixed
precision (K = 12; :func:`~minipar.parallel.data_parallel.measure.replica_model_state_bytes`).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from minipar import checks
from minipar.collectives import allreduce
from minipar.collectives.cost_model import LinkCosts, allreduce_time, choose_by_model, load_costs
from minipar.collectives.nonblocking import TAG_BASE, BlockingAllreduceRequest, iallreduce
from minipar.comm.topology import Grid, require_grid
from minipar.comm.traced import TracedComm
from minipar.nn import executor
from minipar.optim import FlatParams
from minipar.parallel.common import RunSpec, check_world, local_rows
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
OP_GRADS = "dp_grad_allreduce"
OP_LOSS = "dp_loss_allreduce"
OP_EVAL = "dp_eval_allreduce"
DEFAULT_BUCKET_MB = 25.0  # PyTorch DDP's bucket_cap_mb


@dataclass(frozen=True)
class Bucket:
    """Gradients reduced together: ``names`` (reverse parameter order) = flat span [lo, hi)."""

    index: int
    names: tuple[str, ...]
    lo: int
    hi: int

    @property
    def size(self) -> int:
        return self.hi - self.lo


def make_buckets(layout: FlatParams, bucket_bytes: int, itemsize: int) -> list[Bucket]:
    """Walk the parameters from last to first, closing a bucket once it holds
    >= ``bucket_bytes`` bytes (a parameter is never split).  ``bucket_bytes = 1``: one
    parameter per bucket; more than the model: one bucket for all."""
    checks.integer("bucket size", bucket_bytes, 1, why="bytes")
    buckets: list[Bucket] = []
    names: list[str] = []
    hi = layout.size
    lo = hi
    for name in reversed(layout.names):
        names.append(name)
        lo = layout.span(name)[0]
        if (hi - lo) * itemsize >= bucket_bytes:
            buckets.append(Bucket(len(buckets), tuple(names), lo, hi))
            names, hi = [], lo
    if names:
        buckets.append(Bucket(len(buckets), tuple(names), lo, hi))
    return buckets


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


class DDPHooks(executor.Hooks):
    """The executor's hooks for one DDP step: parameters are views of the replica's flat
    buffer; a unit's gradients go into the flat gradient buffer, and every bucket whose
    gradients are all there starts its all-reduce (buckets in order, as backward fills them)."""

    def __init__(self, dp: DataParallel, views: dict[str, Any]) -> None:
        super().__init__(views)
        self.dp = dp
        self.grad_views = dp.layout.unflatten(dp.states.grads)
        self.ready: set[str] = set()
        self.inflight: list[Any] = []  # one request per started bucket, in bucket order

    def on_grads(self, unit: Any, grads: dict[str, Any]) -> None:
        for k, g in grads.items():
            self.grad_views[unit.prefix + k][...] = g
        self.ready.update(unit.full_names)
        buckets = self.dp.buckets
        while (self.dp.overlap and len(self.inflight) < len(buckets)
               and self.ready.issuperset(buckets[len(self.inflight)].names)):
            self.inflight.append(self.dp.start_bucket(buckets[len(self.inflight)]))
        for req in self.inflight:
            req.progress()

    def finish(self) -> None:
        """Start the buckets not started yet (all of them without overlap) and wait for all."""
        for b in self.dp.buckets[len(self.inflight):]:
            self.inflight.append(self.dp.start_bucket(b))
        for req in self.inflight:
            req.wait()


class DataParallel:
    """A DDP replica on this rank, an :class:`~minipar.parallel.engine.Engine`:
    ``step(batch)`` cuts this rank's rows of the global batch, runs forward and the
    bucketed, overlapped backward + all-reduce, and the optimizer step; the global loss
    (the same on every rank).

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

    def __init__(self, grid: Grid, spec: RunSpec, bucket_bytes: int = int(DEFAULT_BUCKET_MB * 2**20),
                 algorithm: str = "auto", overlap: bool = True,
                 ring_min_bytes: int | None = None, wrap_hooks: Any = None) -> None:
        require_grid(grid, "data parallelism", ("dp",))
        checks.one_of("the data-parallel algorithm", algorithm, ALGORITHMS)
        if ring_min_bytes is not None and (algorithm != "auto" or not checks.is_integer(ring_min_bytes)
                                           or ring_min_bytes <= 0):
            raise ValueError(f"ring_min_bytes must be a positive number of bytes, and only with "
                             f"algorithm 'auto'; got {ring_min_bytes!r} with {algorithm!r}")
        if wrap_hooks is not None and not callable(wrap_hooks):
            raise ValueError(f"wrap_hooks must be a function (hooks, units) -> hooks, got {wrap_hooks!r}")
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
        """This rank's rows of the global ``batch`` (:func:`~minipar.parallel.common.local_rows`)
        and their weight b_r / B: the weighted sum over ranks is the global mean."""
        lo, hi = local_rows(batch.size, self.rank, self.world)
        # copies: a view would hold the whole batch (and remat's ledger counts what is held)
        return batch.tokens[lo:hi].copy(), batch.targets[lo:hi].copy(), (hi - lo) / batch.size

    def step(self, batch: Batch) -> StepResult:
        """Forward, bucketed and overlapped backward + all-reduce, optimizer step.
        ``records``: this rank's :class:`Timeline` of the step."""
        c, st = self.comm, self.states
        c.Barrier()  # align the ranks' clocks for the timeline (not counted as gradient bytes)
        t0 = time.perf_counter()
        x, y, weight = self.local_batch(batch)
        hooks = DDPHooks(self, st.param_views())
        units = self.model.units()
        walk = hooks if self.wrap_hooks is None else self.wrap_hooks(hooks, units)
        if walk is not hooks and hasattr(walk, "close"):
            self.walks.append(walk)
        records: list[tuple[str, str, float, float]] = []
        loss = executor.loss_and_grads(units, walk, x, y, weight * st.loss_scale, records)
        hooks.finish()
        tl = Timeline(self.rank)
        fwd = [r for r in records if r[0] == "forward"]
        tl.compute.append(("forward", fwd[0][2] - t0, fwd[-1][3] - t0))
        tl.compute += [(name, a - t0, b - t0) for what, name, a, b in records if what == "backward"]
        tl.comm += [(b.index, req.t_start - t0, req.t_end - t0)
                    for b, req in zip(self.buckets, hooks.inflight)]
        t_opt = time.perf_counter()
        done = st.step(found_inf=st.local_found_inf() if st.scaler else None)  # grads equal on all ranks
        tl.compute.append(("optimizer", t_opt - t0, time.perf_counter() - t0))
        self.timelines.append(tl)
        self.steps_done += 1
        with c.operation(OP_LOSS):
            total = allreduce(c, np.array([weight * loss]))  # auto: recursive doubling
        return StepResult(float(total[0]), skipped=not done, records=(tl,))

    def start_bucket(self, b: Bucket) -> Any:
        """Start bucket ``b``'s all-reduce: a request in flight (ring, MPI) or done (blocking)."""
        buf = self.states.grads[b.lo:b.hi]
        algo = self.bucket_algorithms[b.index]
        if algo == "recursive_doubling":
            return BlockingAllreduceRequest(self.comm, buf, algo, name=OP_GRADS)
        return iallreduce(self.comm, buf, TAG_BASE + b.index, algo,
                          name=OP_GRADS if algo == "ring" else "mpi_" + OP_GRADS)

    def evaluate(self, batch: Batch) -> float:
        """Forward only: this rank's rows' mean loss x b_r / B, summed over the ranks."""
        x, y, weight = self.local_batch(batch)
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
