"""ZeRO, stages 0-3: sharded data parallelism (stage 3 is PyTorch's FSDP).

EN Zero Redundancy Optimizer (ZeRO) · RU оптимизатор с нулевой избыточностью · ZH 零冗余优化器

Rajbhandari, Rasley, Ruwase & He 2019, "ZeRO: Memory Optimizations Toward
Training Trillion Parameter Models", arXiv 1910.02054.  Stage 3 is what
PyTorch calls Fully Sharded Data Parallel (Zhao et al. 2023, arXiv 2304.11277).

Data parallelism keeps the same model states on all N ranks.  ZeRO keeps one
copy in total: rank r owns the contiguous slice ``[lo_r, hi_r)`` of the flat
parameter buffer (``numpy.array_split`` rule: C_r = Ψ//N elements, one more
for the first Ψ mod N ranks) and holds for it what the stage partitions:

=========  ============================  =====================================
stage      held in full on every rank    communication per step
=========  ============================  =====================================
0  DP      params, grads, optimizer      all-reduce of the gradients (auto)
1  P_os    params, grads                 reduce-scatter grads, step own slice
                                         of fp32 master + Adam m, v;
                                         all-gather the updated params
2  P_os+g  params                        the same; grads are reduce-scattered
                                         unit by unit as backward makes them,
                                         a rank keeps only its gradient slice
3  P_os+g+p  nothing                     per unit: all-gather its params just
                                         before its forward and again before
                                         its backward, drop them after; reduce-
                                         scatter its grads after its backward
=========  ============================  =====================================

A *unit* is the embedding, one transformer block, or the head (ln_f +
lm_head): contiguous spans of the flat buffer.  A unit's part on rank r is
the overlap of its span with ``[lo_r, hi_r)``, so gathering every unit once
moves exactly one all-gather of the buffer.  The step is the units
executor's one walk over the model (:mod:`minipar.nn.executor`) with ZeRO's
hooks (:mod:`minipar.parallel.zero.hooks`): ``fetch`` = views or, stage 3,
the all-gather; ``release`` drops stage 3's gathered parameters; ``on_grads``
writes the full gradient buffer or reduce-scatters the unit's gradients.
Because ``saved`` holds activations only, nothing of a unit's parameters
lives between its forward and its backward.  The optimizer is element-wise
(``minipar.optim``), so stepping slices equals stepping the whole.  MoE
blocks work unchanged (the executor adds their auxiliary loss).

**Formulas the tests check** (tests/test_zero.py, ``minipar.plan.zero``):

* parity: on 1-4 ranks every stage's losses and final float64 parameters
  equal ``minipar.train.train``'s (``minipar.parallel.common.parity``), for
  the dense GPT and (stages 1-3) a mixture of experts, whose oracle routes
  the same groups as the ranks (``serial_reference(spec, N)``);
* model-state bytes per rank, mixed precision (2 + 2 + K, K = 12):
  (2+2+K)Ψ, 4Ψ + KΨ/N, 2Ψ + (2+K)Ψ/N, (2+2+K)Ψ/N, measured by the ledger
  (exact but for the uneven shard: C_r instead of Ψ/N) and by tracemalloc;
* bytes sent per rank per step, b bytes per element (2 for 16-bit).  The
  paper's "2Ψ" is one reduce-scatter of Ψ elements plus one all-gather of Ψ,
  each of which makes a ring rank send (N-1)/N of Ψ: 2Ψ(N-1)/N x b in all,
  exactly (2Ψ - C_r - C_{r+1}) b.  Stage 3's "3Ψ" adds the second all-gather
  (backward): (3Ψ - C_r - 2C_{r+1}) b.  (The embedding's backward reads no
  weights; following the paper's and FSDP's uniform rule we gather it anyway.)

**Which all-reduce** (``allreduce="auto"``, the default).  Stages 1-3 use the
ring's reduce-scatter and all-gather.  Stage 0's gradient all-reduce and the
one-number all-reduces (``found_inf`` under loss scaling, the loss a run
reports) go through :func:`minipar.collectives.allreduce` with the engine's
``allreduce``: ``"auto"`` picks recursive doubling or the ring, whichever the
α–β–γ model says is faster for S on N ranks (the ring from a few hundred KB
up; :func:`minipar.collectives.auto.choose_allreduce`), counted under the
name of the algorithm that ran.  So stage 0 of a small model sends recursive
doubling's bytes, log2 N x S when N is a power of two (the ring's
2(N-1)/N x S on 2 ranks); the paper's 2Ψ(N-1)/N is the ring's figure,
``allreduce="ring"``.  :func:`minipar.parallel.zero.measure.exact_bytes_sent`
gives the exact figure of whichever ran.

The code: the technique in :mod:`minipar.parallel.zero.shard` (who owns what,
and the aliasing of the optimizer's slice), :mod:`minipar.parallel.zero.hooks`
(gather, release, reduce-scatter) and :mod:`minipar.parallel.zero.step` (the step
of each stage); this shell checks the options, wires the offloads, and holds the
state_dict, ledger, memory and traffic; the measurements of a run and the paper's
figures for it are in :mod:`minipar.parallel.zero.measure`.
"""

from __future__ import annotations

import time
from typing import Any

import numpy as np

from minipar import checks
from minipar.collectives import all_gather, allreduce, choose_allreduce
from minipar.comm.traced import TracedComm
from minipar.memory import Ledger
from minipar.nn import executor
from minipar.nn.loss import cross_entropy_forward
from minipar.parallel.common import fp8_rows, local_rows, loss_weight
from minipar.parallel.engine import (
    AxisTraffic,
    Batch,
    Shard,
    State,
    StepResult,
    flat_pieces,
    load_pieces,
    load_scalars,
    optimizer_scalars,
    sources_of,
    whole,
)
from minipar.parallel.offload.measure import MeteredOptimizerOffload
from minipar.parallel.offload.store import TARGETS
from minipar.parallel.offload.wrap import check_target, remat_offload_wrapper
from minipar.parallel.zero.hooks import ZeroHooks
from minipar.parallel.zero.shard import layout_of, shard_range, shard_states, unit_table
from minipar.parallel.zero.step import zero_step
from minipar.parallel.zero.zeropp import PARTS, ZeroPPHooks
from minipar.precision import get

STAGES = (0, 1, 2, 3)
#: the all-reduces ZeRO can run for stage 0's gradients and the one-number reductions
#: (``minipar.collectives.allreduce``'s names; ``"auto"`` by message size and N)
ALLREDUCE_CHOICES = ("auto", "ring", "recursive_doubling", "tree")
#: the operations (``TracedComm.operation``) that are not ZeRO's own communication (the
#: byte figures leave them out: :func:`minipar.parallel.zero.measure.step_bytes`): the
#: loss's sum over the ranks in ``step`` and ``evaluate``, stage 3's ``full_params``
OP_LOSS, OP_EVAL, OP_GATHER = "zero_loss_allreduce", "zero_eval_allreduce", "gather_for_check"
#: the options :func:`build` takes (``ZeRO``'s keywords)
OPTIONS = ("stage", "allreduce", "remat", "offload", "offload_optimizer", "offload_dir",
           "prefetch", "reshard_after_forward", "timeline", "zeropp", "zeropp_block")
#: ZeRO++'s quantization block (elements of the flat buffer per scale; a minipar default,
#: a power of two the size of a few cache lines of scales-to-values, 1/32 of float64's bytes)
ZEROPP_BLOCK = 256


class MeteredZeroHooks(ZeroHooks):
    """:class:`~minipar.parallel.zero.hooks.ZeroHooks` that also measure
    ``peak_gathered_bytes``, the most stage 3 held all-gathered at once (``gathered``
    and the buffers of the all-gathers in flight, after each fetch): the measured answer
    to "does stage 3 free what it gathers?" and to what prefetching costs
    (:func:`~minipar.parallel.zero.measure.prefetch_peak_elements`).  With ``records``
    (a list; stage 3), the communication intervals ``("comm", "all_gather" or
    "reduce_scatter", t_posted, t_done)``: a blocking collective's when it returns, a
    non-blocking request's at the first hook that sees it done (then it is let go, so
    that its buffer is freed when the hooks free it)."""

    def __init__(self, *args: Any, records: list[Any] | None = None, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.peak_gathered_bytes = 0
        self.records = records
        self.walk: list[str] = []  # the units fetched while no plan is set, in order
        self._watched: list[Any] = []  # non-blocking requests posted, not yet seen done

    def plan(self, order: list[str]) -> None:
        super().plan(order)
        self._watched = []  # (an evaluation's gathers are not the step's)

    def held_gathered_bytes(self) -> int:
        return (sum(v.nbytes for v in self.gathered.values())
                + sum(r.buf.nbytes for r in self.inflight.values()))

    def _record(self, what: str, t0: float, posted: list[Any]) -> None:
        if self.records is None or self.stage != 3:
            return
        if not self.prefetch:
            self.records.append(("comm", what, t0, time.perf_counter()))
            return
        self._watched += [r for r in posted if not any(r is w for w in self._watched)]
        self.records += [("comm", r.name, r.t_start, r.t_end) for r in self._watched if r.done]
        self._watched = [r for r in self._watched if not r.done]

    def fetch(self, unit: Any) -> dict[str, Any]:
        if self.at >= len(self.order):  # unplanned (ZeRO++ plans such a walk as it goes)
            self.walk.append(unit.name)
        before, t0 = list(self.inflight.values()), time.perf_counter()
        params = super().fetch(unit)
        self.peak_gathered_bytes = max(self.peak_gathered_bytes, self.held_gathered_bytes())
        self._record("all_gather", t0, before + list(self.inflight.values()))
        return params

    def release(self, unit: Any, params: dict[str, Any]) -> None:
        super().release(unit, params)
        if self.prefetch:
            self._record("", 0.0, [])

    def on_grads(self, unit: Any, grads: dict[str, Any]) -> None:
        t0 = time.perf_counter()
        super().on_grads(unit, grads)
        self._record("reduce_scatter", t0, [r for r, *_ in self.pending])

    def finish(self) -> None:
        posted = [r for r, *_ in self.pending]
        super().finish()
        if self.prefetch:
            self._record("", 0.0, posted)


class MeteredZeroPPHooks(MeteredZeroHooks, ZeroPPHooks):
    """:class:`MeteredZeroHooks` of ZeRO++ (:class:`~minipar.parallel.zero.zeropp.ZeroPPHooks`),
    which also measure ``peak_secondary_bytes``: the most hpZ held in its secondary slices
    (the memory hpZ adds: :func:`~minipar.parallel.zero.measure.hpz_secondary_elements`)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.peak_secondary_bytes = 0

    def fetch(self, unit: Any) -> dict[str, Any]:
        params = super().fetch(unit)
        held = sum(v.nbytes for v in self.secondary.values())
        self.peak_secondary_bytes = max(self.peak_secondary_bytes, held)
        return params


def check_zeropp(parts: Any, stage: int = 3, block: Any = ZEROPP_BLOCK,
                 reshard: bool = True) -> tuple[str, ...]:
    """ZeRO++'s parts as a tuple in :data:`PARTS` order ("qwz,hpz" or a sequence; empty: off);
    ValueError for an unknown part, a stage other than 3, a block size that is not positive,
    or ``reshard`` False (ZeRO++ changes the later all-gathers it removes)."""
    names = [p.strip() for p in (parts.split(",") if isinstance(parts, str) else parts or ())]
    names = [p for p in names if p]
    for p in names:
        checks.one_of("--zeropp part", p, PARTS)
    checks.integer("--zeropp-block", block, 1)
    if names and stage != 3:
        raise ValueError(f"--zeropp is ZeRO-3's (it quantizes the parameter all-gathers and "
                         f"gradient reduce-scatters of stage 3); got --stage {stage}: "
                         "add --stage 3")
    if names and not reshard:
        raise ValueError("--zeropp with --no-reshard-after-forward: ZeRO++ changes the "
                         "backward all-gather that this option removes; drop one of them")
    return tuple(p for p in PARTS if p in names)


def check_stage(stage: Any) -> int:
    """The stage as an int; ValueError unless 0, 1, 2 or 3."""
    return checks.integer("ZeRO stage", stage, min(STAGES), max(STAGES),
                          why="0: plain DP, 1: optimizer states, 2: + gradients, 3: + parameters")


def check_allreduce(algorithm: Any) -> str:
    """The all-reduce algorithm's name; ValueError unless one of :data:`ALLREDUCE_CHOICES`."""
    return str(checks.one_of("ZeRO's all-reduce", algorithm, ALLREDUCE_CHOICES))


class ZeRO:
    """One rank's part of ZeRO-``stage`` training of ``spec``'s GPT on ``grid`` (dp = N).

    The engine interface (:class:`minipar.parallel.engine.Engine`): ``step(batch)`` takes
    this rank's rows ``[lo_r, hi_r)`` of the global batch (:func:`minipar.spans.span`,
    weight w_r = b_r / B) and returns the global mean loss.  Every rank draws the same
    float64 initial parameters (``spec.initial_params()``) and keeps only what its stage
    allows.  Attributes: ``params`` the full flat param-dtype buffer (stages 0-2, else
    None), ``grads`` the full flat gradient buffer (stages 0-1, else None), ``states`` the
    :class:`~minipar.precision.ModelStates` of this rank's slice ``opt_range`` (master
    weights, moments; its params/grads are views into the full buffers where those
    exist: :func:`~minipar.parallel.zero.shard.shard_states`), ``zero_hooks`` its executor
    hooks (:class:`~minipar.parallel.zero.hooks.ZeroHooks`, measured:
    :class:`MeteredZeroHooks`), ``hooks`` those the
    executor walks (``zero_hooks``, or wrapped by remat/offload).

    Options (keyword only, each checked on every rank before any message):
    ``stage`` 0-3 (default 1); ``allreduce`` the all-reduce of stage 0's gradients and
    of the one-number reductions (found_inf, the loss): ``"auto"``, ``"ring"``,
    ``"recursive_doubling"``, ``"tree"``; ``remat`` (K: keep every K-th unit's input,
    0: K = ceil(sqrt n); :mod:`minipar.parallel.remat`) and ``offload`` ``"host"`` /
    ``"disk"`` (saved activations: :mod:`minipar.parallel.offload.activations`), made into
    ``memory_wrap`` (:class:`~minipar.parallel.offload.wrap.MemoryWrap`);
    ``offload_optimizer`` ``"host"``/``"disk"`` keeps the master weights and moments there
    and steps there (ZeRO-Offload, :mod:`minipar.parallel.offload.optimizer`; ``offload``
    its :class:`~minipar.parallel.offload.measure.MeteredOptimizerOffload`);
    ``offload_dir`` the folder of whichever offload goes to disk; ``prefetch`` K >= 0
    (stage 3 only): the all-gathers of the next K units of the walk posted while a unit
    computes and the reduce-scatters non-blocking (0: every collective blocks);
    ``reshard_after_forward`` (stage 3, default True; FSDP2's switch): False keeps each
    unit gathered from its forward to its backward (Ψ gathered at the peak, one
    all-gather of the parameters per step instead of two).  The shell decides when:
    before each walk it gives the hooks the walk's order
    (:meth:`~minipar.parallel.zero.hooks.ZeroHooks.plan`).  ``timeline=True`` (stage 3)
    keeps the last step's compute and communication intervals in ``records``.
    ``zeropp`` (stage 3): ZeRO++'s parts, "qwz,hpz,qgz" or any subset
    (:class:`~minipar.parallel.zero.zeropp.ZeroPPHooks`, metered:
    :class:`MeteredZeroPPHooks`), quantized in blocks of ``zeropp_block`` elements, over
    the nodes of the grid's hosts (:func:`node_comms`); the walk is then always planned.
    """

    def __init__(self, grid: Any, spec: Any, *, stage: int = 1, allreduce: str = "auto",
                 remat: int | None = None, offload: str | None = None,
                 offload_optimizer: str | None = None, offload_dir: str | None = None,
                 prefetch: int = 0, reshard_after_forward: bool = True,
                 timeline: bool = False, zeropp: Any = (), zeropp_block: int = ZEROPP_BLOCK
                 ) -> None:
        self.stage, self.policy = check_stage(stage), get(spec.precision)
        # ZeRO++'s parts, block and communicators live in its hooks (``zeropp``: a property)
        zeropp = check_zeropp(zeropp, self.stage, zeropp_block, reshard_after_forward)
        self.prefetch = checks.integer("prefetch", prefetch, 0, None)
        if (self.prefetch or not reshard_after_forward) and self.stage != 3:
            raise ValueError(f"prefetch and reshard_after_forward are stage 3's (parameters "
                             f"gathered per unit); got stage {self.stage}: use stage 3")
        self.reshard = bool(reshard_after_forward)
        self._learned: list[str] = []  # under remat: the first step's walk (the plan after)
        # the last step's compute and communication intervals (stage 3, when asked)
        self.records: list[Any] | None = [] if timeline and self.stage == 3 else None
        self.allreduce = check_allreduce(allreduce)
        if grid is None:
            raise ValueError("ZeRO needs a grid of its ranks: Grid(comm, dp=N)")
        if grid.size("dp") != grid.world.size:
            raise ValueError(f"ZeRO shards over data-parallel ranks only: the grid must be "
                             f"dp = {grid.world.size}, got {grid!r}")
        for name, target in (("offload", offload), ("offload_optimizer", offload_optimizer)):
            if target is not None:
                checks.one_of(f"ZeRO's {name}", target, TARGETS)
        if offload_dir is not None and "disk" not in (offload, offload_optimizer):
            raise ValueError(f"offload_dir {offload_dir} needs offload or offload_optimizer "
                             "'disk'")
        act_dir = offload_dir if offload == "disk" else None
        opt_dir = offload_dir if offload_optimizer == "disk" else None
        if offload_optimizer is not None:
            check_target(offload_optimizer, opt_dir)
        self.grid, self.spec = grid, spec
        self.comm: TracedComm = grid.comm("dp")
        n, r = self.comm.size, self.comm.rank
        self.model = spec.model()
        self.layout = layout_of(self.model.cfg)
        self.units = tuple(u for u, *_ in unit_table(self.model.cfg))
        psi = self.layout.size
        self.shard = shard_range(psi, n, r)  # ValueError before any message
        self.rows = local_rows(spec.batch, r, n)  # this rank's rows of the global batch
        self.weight = loss_weight(spec.batch, r, n)  # w_r = b_r / B
        if remat is not None:
            checks.integer("remat", remat, 0, len(self.units))  # 0: ceil(sqrt n)
        self.memory_wrap = remat_offload_wrapper(remat, offload, act_dir)
        self.opt_range = (0, psi) if self.stage == 0 else self.shard
        self.param_range = self.shard if self.stage == 3 else (0, psi)
        self.optimizer_name, self.opt_kwargs = spec.optimizer, spec.opt_kwargs()
        self.steps_done = 0
        flat = self.layout.flatten(spec.initial_params(), np.float64)
        self.params, self.grads, self.states = shard_states(
            self.stage, flat, self.shard, self.policy, spec.optimizer, **self.opt_kwargs)
        del flat
        extra: dict[str, Any] = {}
        if zeropp:
            node, cross = node_comms(grid, self.comm)
            extra = {"parts": zeropp, "block": int(zeropp_block), "node": node, "cross": cross}
        hooks = MeteredZeroPPHooks if zeropp else MeteredZeroHooks
        self.zero_hooks = self.hooks = hooks(
            self.stage, self.comm, psi, self.shard, self.states, unit_table(self.model.cfg),
            params=self.params, grads=self.grads, dtype=self.policy.param_dtype,
            prefetch=self.prefetch, reshard=self.reshard, records=self.records, **extra)
        self.offload = None
        if offload_optimizer is not None:
            self.offload = MeteredOptimizerOffload(self.states, offload_optimizer, opt_dir)
        if self.memory_wrap is not None:
            self.hooks = self.memory_wrap(self.hooks, self.units)
        self._traffic = AxisTraffic(grid)

    @property
    def zeropp(self) -> tuple[str, ...]:
        """ZeRO++'s parts this engine runs (empty: plain ZeRO)."""
        return getattr(self.zero_hooks, "parts", ())

    # -- one training step ---------------------------------------------------
    def _local(self, batch: Batch) -> tuple[Any, Any]:
        """This rank's rows of the global batch, as arrays of their own (a view would
        keep, and be counted with, the whole batch in the saved activations)."""
        lo, hi = self.rows
        return batch.tokens[lo:hi].copy(), batch.targets[lo:hi].copy()

    def _global_loss(self, local: float, what: str) -> float:
        """Σ_r w_r ℓ_r over the ranks: the global mean loss, the same on every rank."""
        # set aside (not a step's ZeRO traffic: step_bytes, the host split leave it out)
        with self.comm.stats.set_aside(), self.comm.operation(what):
            return float(allreduce(self.comm, np.array([self.weight * local]),
                                   algorithm=self.allreduce)[0])

    def step(self, batch: Batch) -> StepResult:
        """Forward, backward, communication and optimizer step on this rank's rows.

        The gradients are those of w_r x the local mean loss, so the sum over ranks is
        the serial mean's.  The loss is summed over the ranks (operation :data:`OP_LOSS`)."""
        x, y = self._local(batch)
        if self.records is not None:
            self.records.clear()
        names = [u.name for u in self.units]
        # the walk: forward, then backward in reverse; under remat (recomputations fetch
        # again) the walk of the first step, learnt as it runs (blocking), as FSDP does
        walk = names + names[::-1] if self.memory_wrap is None else self._learned
        self.zero_hooks.walk = []
        self._plan(walk)
        with fp8_rows(self.spec, self.comm):  # per-tensor FP8: the whole batch's amax
            loss, done = zero_step(self.stage, self.comm, self.units, self.hooks, x, y,
                                   self.weight * self.states.loss_scale, self.states,
                                   self.params, self.grads, self.offload, self.allreduce,
                                   self.zero_hooks, self.records)
        self._learned = self._learned or list(self.zero_hooks.walk)
        self.steps_done += 1
        return StepResult(self._global_loss(loss, OP_LOSS), skipped=not done)

    def evaluate(self, batch: Batch) -> float:
        """The global mean loss without a step: a forward of this rank's rows through
        ZeRO's own hooks (stage 3 gathers each unit), summed over the ranks."""
        x, y = self._local(batch)
        aux: list[float] = []
        self._plan([u.name for u in self.units])
        with fp8_rows(self.spec, self.comm):
            logits, kept = executor.forward(self.units, self.zero_hooks, x, aux=aux)
        del kept
        return self._global_loss(cross_entropy_forward(logits, y)[0] + sum(aux), OP_EVAL)

    def _plan(self, order: list[str]) -> None:
        """When to gather (stage 3 with prefetch or without resharding): the walk's order."""
        if self.prefetch or not self.reshard or self.zeropp:
            self.zero_hooks.plan(order)

    def grad_allreduce(self) -> str | None:
        """The algorithm stage 0's gradient all-reduce runs (``auto`` resolved by the
        gradient buffer's bytes and N); None for stages 1-3 (reduce-scatter + all-gather)."""
        if self.stage != 0:
            return None
        if self.allreduce != "auto":
            return self.allreduce
        return choose_allreduce(self.grads.nbytes, self.comm.size)

    # -- the state, layout-independent ---------------------------------------
    def state_dict(self) -> State:
        """Every array this rank holds, as pieces of the serial tensors (views).

        ``param``: the whole tensors (stages 0-2, replica = this rank: rank 0's copy is
        the one saved), or stage 3's flat range ``[lo_r, hi_r)`` cut per tensor
        (:func:`~minipar.parallel.engine.flat_pieces`, replica 0); ``master``,
        ``exp_avg``, ``exp_avg_sq`` (or ``momentum``): the range ``opt_range`` cut per
        tensor, replica 0 (stage 0: the whole, replica = this rank).  Scalars: ``step``
        and the optimizer's and loss scaler's (:func:`~minipar.parallel.engine.optimizer_scalars`)."""
        st, r = State(), self.comm.rank
        st.scalars.update(optimizer_scalars(self.states))
        st.scalars["step"] = self.steps_done
        params = self.params if self.params is not None else self.states.params
        kinds = [("param", params, self.param_range, r if self.stage < 3 else 0)]
        flats = [("master", self.states.master)] if self.states.master is not None else []
        opt = self.states.optimizer
        if getattr(opt, "m", None) is not None:
            flats += [("exp_avg", opt.m), ("exp_avg_sq", opt.v)]
        elif getattr(opt, "buf", None) is not None:
            flats += [("momentum", opt.buf)]
        kinds += [(k, a, self.opt_range, r if self.stage == 0 else 0) for k, a in flats]
        for n, shape in zip(self.layout.names, self.layout.shapes):
            t0, t1 = self.layout.span(n)
            full = whole(n, shape)
            for kind, flat, (lo, hi), replica in kinds:
                a, b = max(t0, lo), min(t1, hi)
                if a >= b:
                    continue
                st.arrays[(kind, n)] = (Shard(n, shape, flat_pieces(full, shape, a - t0, b - t0),
                                              replica), flat[a - lo:b - lo])
        return st

    def load_state_dict(self, state: State | Any) -> None:
        """Fill every array from the overlapping pieces of ``state`` (one State, or every
        rank's of any layout), then the optimizer's step count, the loss scale and ``step``."""
        sources = sources_of(state)
        load_pieces(self.state_dict(), sources)
        self.steps_done = load_scalars(self.states, sources)

    def full_params(self) -> dict[str, Any]:
        """The whole model under its serial names, on every rank (collective: stage 3
        all-gathers it, operation :data:`OP_GATHER`); copies in the param dtype."""
        if self.params is not None:
            flat = self.params.copy()
        else:
            with self.comm.operation(OP_GATHER):
                flat = all_gather(self.comm, self.states.params)
        return self.layout.unflatten(flat)

    # -- what a rank holds and sends -----------------------------------------
    def ledger(self) -> Ledger:
        """Model-state bytes this rank holds, by category (each buffer once)."""
        led = Ledger(self.comm.rank)
        led.add("params", "params", self.params if self.params is not None else self.states.params)
        led.add("grads", "grads", self.grads if self.grads is not None else self.states.grads)
        where = self.offload.place if self.offload is not None else "device"
        led.add("optimizer states", "moments", self.states.optimizer.state_arrays(), where)
        if self.states.master is not None:
            led.add("optimizer states", "fp32 master weights", self.states.master, where)
        return led

    def memory(self) -> dict[str, int]:
        """Model-state bytes by category (:meth:`ledger`), the most stage 3 held gathered
        at once (``gathered_peak``) and, under remat, the activation peak."""
        out = {k: int(v) for k, v in self.ledger().bytes_by_category().items()}
        out["gathered_peak"] = int(self.zero_hooks.peak_gathered_bytes)
        if self.zeropp:
            out["hpz_secondary_peak"] = int(self.zero_hooks.peak_secondary_bytes)
        if self.memory_wrap is not None:
            peak = self.memory_wrap.summary().get("remat_activation_peak_bytes")
            if peak is not None:
                out["activations_peak"] = int(peak)
        return out

    def traffic(self) -> dict[str, int]:
        """Bytes this rank sent since the last call, by grid axis (and ``"world"``)."""
        return self._traffic()

    def close(self) -> None:
        """Remove the offload files (optimizer states, activations on disk)."""
        if self.offload is not None:
            self.offload.close()
        if self.memory_wrap is not None:
            self.memory_wrap.close()
        if self.zeropp and self.zero_hooks.node is not None:
            self.zero_hooks.node.Free()
            self.zero_hooks.cross.Free()
            self.zero_hooks.node = self.zero_hooks.cross = None


def node_comms(grid: Any, comm: Any, axis: str = "dp") -> tuple[Any, Any]:
    """ZeRO++'s two communicators over ``comm`` (the dp ranks): my node's ranks
    (``"zeropp_node"``, rank k) and the ranks of my local index in every node
    (``"zeropp_cross"``, rank m), so that dp rank r = mK + k (``axis``: the grid's axis of
    ``comm``).  The nodes are the grid's
    hosts (``--node K``, or MPI's own); ValueError (on every rank, before any message)
    unless every node holds K consecutive dp ranks."""
    hosts = [grid.hosts[w] for w in grid.ranks(axis)]  # (the hybrid's: dp or edp = dp·cp)
    n, k = comm.size, hosts.count(hosts[0])  # the same on every rank
    blocks = [hosts[r - r % k] for r in range(n)] if n % k == 0 else []
    if blocks != hosts or len(set(hosts)) * k != n:
        raise ValueError(f"ZeRO++ needs nodes of equally many consecutive data-parallel ranks; "
                         f"the {n} ranks sit on hosts {hosts}: use --node K with K dividing {n}")
    r = comm.rank
    for name in ("zeropp_node", "zeropp_cross"):  # their bytes are the axis's (Grid.serves)
        grid.serves(name, axis)
    return (comm.Split(r // k, r % k, name="zeropp_node"),
            comm.Split(r % k, r // k, name="zeropp_cross"))


def build(spec: Any, grid: Any, **options: Any) -> ZeRO:
    """The ZeRO engine (:mod:`minipar.parallel.strategies`' row "zero"); ``options``:
    :data:`OPTIONS` (``ZeRO``'s keywords)."""
    checks.known("ZeRO", options, OPTIONS)
    return ZeRO(grid, spec, **options)
