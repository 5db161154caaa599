"""The pipeline engine: the shell around the stage loop, on MPI.

EN pipeline parallelism (engine) · RU конвейерный параллелизм (движок) · ZH 流水线并行（引擎）

GPipe (Huang et al. 2018, arXiv 1811.06965), 1F1B and interleaved 1F1B
(Narayanan et al. 2021, arXiv 2104.04473), zero bubble (Qi et al. 2023, arXiv
2401.10241).  Rank s of the grid's ``pp`` axis holds stage s — its chunks of units
(:mod:`.partition`), their parameters, gradients and AdamW states only — and runs
``stage_schedule(kind, s, p, m, v)`` (:mod:`.schedule`) with the stage loop
(:class:`~.stage_loop.StageLoop`: the technique).  This shell gives the loop what it
runs with and keeps the books:

* the messages: a :class:`~.p2p.StageLink` over the grid's pipeline neighbours, whose
  *wire* says what travels (:class:`~.p2p.Whole`; the hybrid's PTD-P scatter/gather);
* the hooks of each chunk (:class:`~.stage.StageMemory`: gradients added to the stage's
  flat buffer, remat, offload) and the step after the flush, the *sync*'s (the
  pipeline's: :class:`~.parts.AllReduceSync`, one all-reduce over the ``dp`` axis, the
  pipeline replicas; the hybrid's: ZeRO or experts apart);
* the *stage model* (:class:`~.parts.SerialStage`): the units, the stage's
  parameters and where each sits in the serial tensor, my rows of the batch, the loss.

**Composition, not inheritance.**  The hybrid engine
(:func:`minipar.parallel.hybrid.engine.build`) is this class given tensor-, context- or
expert-parallel stage models, a wire and a sync, and three values: ``loss_weight``
(under context parallelism each rank's loss counts s_c/s), ``reports_loss`` (the tp ranks
of a group compute the same loss: one reports it) and ``replica_of`` (which copy of a
tensor a rank holds, for the checkpoint).

**Measurement enters from outside the loop.**  The loop runs every instruction through
the ``around`` this engine passes: its start and end (``perf_counter``, seconds from the
step's start, after a barrier; and in CPU seconds, ``process_time``) become a
:class:`~.simulate.Record`, so the bubble functions and charts of :mod:`.measure` read
the measured timeline as they read a simulated one; every compute runs inside
``StageMemory.measured`` (the activation peak, what offload moved); after each B the
bytes kept only for W (``w_peak_bytes``).

**DualPipe's pairs, overlapped** (DeepSeek-V3, arXiv 2412.19437, §3.2.1).  A
:class:`~.stage_loop.ForwardBackward` runs as a :class:`minipar.overlap.Pair`: its forward
computes until it starts an experts' all-to-all (non-blocking:
:func:`minipar.collectives.alltoall.all_to_all_rows`) and hands the core to its backward, which
computes until it starts one of its own and hands back; each waits for its message only
when it resumes.  The pair's pipeline receives are posted before it, its forward's send
started before its backward (``_overlap_plan``); every message in flight, sends, receives
and all-to-alls, is ``Test``ed before each unit (``progress``, as DDP's buckets).  An
interleaved pair is recorded as its F then its B, each as long as it held the core.

**The engine interface** (:class:`minipar.parallel.engine.Engine`, built by
``strategies.build("pp", spec, grid, **options)``): ``step(batch)`` cuts this replica's
rows of the GLOBAL batch and runs the instruction list; the global loss.
``evaluate(batch)`` runs every micro-batch's forward through the stages
(:func:`~.schedule.forward_schedule`), no backward; ``state_dict()``: the stage's tensors
whole, under their serial names (replica: the dp coordinate); ``full_params()``: every
stage's tensors on every rank.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import replace
from typing import Any

from minipar import checks, overlap, spans
from minipar.comm.topology import require_grid
from minipar.nn import weight_grad
from minipar.nn.dtypes import check_model_dtype
from minipar.parallel.common import check_world
from minipar.parallel.engine import (AxisTraffic, Batch, State, StepResult, load_buffers,
                                     saved_step, sources_of, with_buffers)
from minipar.parallel.expert_bias import BiasHooks, ExpertBias
from minipar.parallel.pipeline.p2p import OP_ACT, OP_GRAD, StageLink, Whole
from minipar.parallel.pipeline.partition import check_pipeline, stage_units
from minipar.parallel.pipeline.parts import AllReduceSync, SerialStage, all_reduce
from minipar.parallel.pipeline.schedule import forward_schedule, placement, stage_schedule
from minipar.parallel.pipeline.simulate import COMPUTE_WHAT, WHAT, Record
from minipar.parallel.pipeline.stage import StageHooks, StageMemory
from minipar.parallel.pipeline.stage_loop import (
    Backward,
    BackwardInput,
    Forward,
    ForwardBackward,
    Instruction,
    RecvAct,
    RecvGrad,
    SendAct,
    StageLoop,
    virtual_stage,
)

__all__ = ["OPTIONS", "OP_ACT", "OP_GRAD", "PipelineParallel", "build"]

OP_DP, OP_LOSS = "pp_dp_grad_allreduce", "pp_loss_allreduce"
OP_MIRROR = "dualpipe_copies_grad_allreduce"

#: the keyword options of :func:`build` (``PipelineParallel``'s arguments after grid, spec)
OPTIONS = ("schedule", "micro_batches", "chunks", "balance", "remat", "offload",
           "offload_dir", "instructions")
#: the instructions whose compute is measured (the activation ledgers' peaks)
MEASURED = (Forward, Backward, BackwardInput)


class PipelineParallel:
    """Stage ``grid.coord("pp")`` of a pipeline replica ``grid.coord("dp")``.

    ``schedule``: naive, gpipe, 1f1b, interleaved (``chunks`` v > 1), or the zero-bubble
    zb-h1, zb-h2, zb-v (``chunks`` 2, the V placement), whose backwards run as B and W;
    ``micro_batches`` m; ``balance``: blocks per virtual stage (default even);
    ``remat``: None, True (GPipe's: keep each chunk's input per micro-batch,
    recompute the chunk in backward) or k units per segment; ``offload``: None,
    "host" or "disk" (:class:`minipar.parallel.offload.activations.Offload` around each chunk's
    checkpointing: the kept activations move out between forward and backward;
    ``offload_dir`` for disk); ``instructions``: run this list instead of the
    schedule's (a learner's schedule).  Every argument is checked on every rank before any message.
    Keyword only, what the hybrid engine gives: ``stage_model`` (default
    :class:`~.parts.SerialStage`), ``wire`` (default :class:`~.p2p.Whole`), ``sync``
    (default :class:`~.parts.AllReduceSync` over dp); ``loss_weight`` (each micro-batch's
    loss weight w_i = b_i/B times it; 1), ``reports_loss`` (whether my loss counts in the
    global sum; True), ``replica_of(kind, name)`` (which copy of tensor ``name``'s
    ``kind`` mine is, for ``state_dict``; default: my dp coordinate).
    """

    def __init__(self, grid: Any, spec: Any, schedule: str = "1f1b", micro_batches: int = 1,
                 chunks: int = 1, balance: Sequence[int] | None = None, remat: Any = None,
                 offload: str | None = None, offload_dir: str | None = None,
                 instructions: Sequence[Instruction] | None = None, *,
                 stage_model: Any = None, wire: Any = None, sync: Any = None,
                 loss_weight: float = 1.0, reports_loss: bool = True,
                 replica_of: Callable[[str, str], int] | None = None) -> None:
        axes = SerialStage.axes if stage_model is None else stage_model.axes
        require_grid(grid, "the pipeline executor",
                     ("dp", "pp") + tuple(a for a in axes if a not in ("dp", "pp")))
        self.grid, self.spec, self.kind = grid, spec, schedule
        self.p, self.dp = grid.size("pp"), grid.size("dp")
        self.stage, self.replica = grid.coord("pp"), grid.coord("dp")
        self.m, self.v = micro_batches, chunks
        self.place = placement(schedule)
        check_world(spec.batch, self.dp)
        rows = spans.counts(spec.batch, self.dp)[-1]
        self.balance = check_pipeline(spec.layers, self.p, micro_batches, schedule, chunks,
                                      balance, rows, remat)
        self.instructions = (list(instructions) if instructions is not None else
                             stage_schedule(schedule, self.stage, self.p, micro_batches,
                                            chunks))
        self.stage_model = SerialStage(grid, spec) if stage_model is None else stage_model
        self.world = grid.world
        self.sync = (AllReduceSync(self.world, all_reduce(grid.comm("dp"), OP_DP))
                     if sync is None else sync)
        self.reports_loss = reports_loss
        base = replica_of or (lambda kind, name: self.replica)
        #: DualPipe's second copy of every tensor (ranks p/2..p - 1), summed with the first
        #: before each step (:meth:`_step`); saved from the first copy only (replica 0)
        self.mirror = (grid.comm("pp").Split(min(self.stage, self.p - 1 - self.stage),
                                             self.stage, name="pp_mirror")
                       if self.place == "dual" else None)
        second = int(self.stage >= self.p // 2)
        self.replica_of = ((lambda kind, name: 2 * base(kind, name) + second)
                           if self.mirror is not None else base)
        self.model = self.stage_model.model
        self.chunk_units = stage_units(self.stage_model.units(), self.balance, self.stage,
                                       self.p, chunks, self.place)
        # DualPipe: ranks s and p - 1 - s hold the same two stages (chunks swapped): the
        # flat buffers follow the model's order on both, so one sum adds the two copies
        order = sorted(range(chunks), key=lambda c: virtual_stage(self.stage, c, self.p,
                                                                  self.place) % self.p
                       if self.place == "dual" else c)
        self.units = units = [u for c in order for u in self.chunk_units[c]]
        params = self.stage_model.params([n for u in units for n in u.full_names])
        self.states = self.sync.build(spec, params, units)
        self.stage_layout = self.sync.layout  # the stage's Ψ_p parameters, flat
        self.act_dtype = check_model_dtype(self.model.cfg.dtype)
        self.wire = Whole() if wire is None else wire
        self.link = StageLink(grid.p2p, self.stage, self.p, self.v, self.act_dtype,
                              spec.d_model, self.wire, self.place)
        self.loop = StageLoop(self.stage, self.p, self.v, self.chunk_units, self.link,
                              self.stage_model, self.place, loss_weight)
        self.stage_memory = StageMemory(self.chunk_units, remat, offload, offload_dir)
        blocks = [int(u.prefix.split(".")[1]) for u in units if u.prefix.startswith("blocks.")]
        self.bias = ExpertBias(self.model.cfg, blocks, self.replica_of("buffer", "bias"))
        self.records: list[list[Record]] = []  # per step: wall-clock seconds from its start
        #: per step: this rank's messages in flight, (start, end) seconds from its start
        self.comm_intervals: list[list[tuple[float, float]]] = []
        #: per step: the experts' all-to-alls (post to completion; also in comm_intervals),
        #: the waits for them inside a compute (not computing), the pairs that took turns
        self.a2a_intervals: list[list[tuple[float, float]]] = []
        self.blocked_intervals: list[list[tuple[float, float]]] = []
        self.overlapped_pairs: list[int] = []
        self._overlap_plan()
        self.cpu_records: list[list[Record]] = []  # per step: CPU seconds (process_time)
        self.steps_done = 0
        #: the most bytes this stage kept only for W at once (B done, W not: the linears'
        #: inputs and output gradients, Qi et al. 2023), over every step; 0 unsplit
        self.w_peak_bytes = 0
        self._traffic = AxisTraffic(grid)

    @property
    def activation_peak_bytes(self) -> int:
        """The most activation bytes this stage held at once (all chunks, every step)."""
        return self.stage_memory.activation_peak_bytes

    @property
    def offload_stats(self) -> dict[str, Any]:
        """Bytes moved out and back, the most held out at once, seconds spent moving."""
        return self.stage_memory.offload_stats

    # -- the engine interface ------------------------------------------------------
    def step(self, batch: Batch) -> StepResult:
        """Run this stage's instruction list once on my replica's rows of ``batch``; the
        global loss (the same on every rank) and this step's records (wall clock)."""
        st, mem = self.states, self.stage_memory
        x, y = self._rows(batch)
        self.world.Barrier()  # align the ranks' clocks: records are seconds from here
        t0 = time.perf_counter()
        st.grads[...] = 0
        overlap.record()  # the experts' all-to-alls of this step (started inside layers)
        self.overlapped_pairs.append(0)
        mem.start_step(st, self._with_bias(self.sync.step_hooks()),
                       lambda: (self.link.progress(), overlap.progress()))
        early: dict[Instruction, tuple[float, float, float, float]] = {}
        wall: list[Record] = []
        cpu: list[Record] = []  # the same instructions timed in this process's CPU seconds
        c0 = time.process_time()

        def timed(ins: Instruction, dispatch: Callable[[Any], None]) -> None:
            """One instruction, timed; a compute's activation peak measured; after a B,
            the bytes kept only for W."""
            if isinstance(ins, ForwardBackward):  # its forward and backward are timed
                n = len(wall)
                pair = overlap.Pair(lambda: self.loop.do(ins.forward),
                                    lambda: self.loop.do(ins.backward))
                pair.run()  # the two take turns where an all-to-all is in flight
                if pair.interleaved:
                    _as_computed(ins, n, pair)
                    self.overlapped_pairs[-1] += 1
                return
            if ins in self._wait_first:  # the pair's pre-posted receive, waited for now
                r = self._wait_first[ins]
                self.loop.table[type(r)](r)
            a, ca = time.perf_counter(), time.process_time()
            if ins in self._prepost:  # the pair's receive: posted now, waited for at use
                self.link.prepost(ins, self.loop.vs(ins.chunk), self._rows_seq(ins))
            elif ins in early:  # the pair's forward's send, already started
                a, ca, b, cb = early.pop(ins)
                _record(ins, a, b, ca, cb)
                return
            elif isinstance(ins, MEASURED):
                mem.measured(ins.chunk, lambda: dispatch(ins))
            else:
                dispatch(ins)
            b, cb = time.perf_counter(), time.process_time()
            _record(ins, a, b, ca, cb)
            if ins in self._send_early:  # start the forward's send before the backward
                s = self._send_early[ins]
                a2, ca2 = time.perf_counter(), time.process_time()
                self.loop.table[type(s)](s)
                early[s] = (a2, ca2, time.perf_counter(), time.process_time())

        def _as_computed(ins: ForwardBackward, n: int, pair: overlap.Pair) -> None:
            """An interleaved pair's two records (each spanning the other's turns) redrawn
            as its F then its B, each as long as it held the core (wall and CPU)."""
            for recs, spent in ((wall, pair.seconds), (cpu, pair.cpu)):
                mine = [i for i in range(n, len(recs)) if recs[i].what in COMPUTE_WHAT]
                t = min(recs[i].start for i in mine)
                for part, took in zip((ins.forward, ins.backward), spent):
                    i = next(i for i in mine if recs[i].what == WHAT[type(part)]
                             and (recs[i].micro_batch, recs[i].chunk) == (part.mb, part.chunk))
                    recs[i] = recs[i]._replace(start=t, end=t + took)
                    t += took

        def _record(ins: Instruction, a: float, b: float, ca: float, cb: float) -> None:
            if isinstance(ins, BackwardInput):
                self.w_peak_bytes = max(self.w_peak_bytes, weight_grad.kept_bytes(
                    [p for ps in self.loop.pending.values() for p in ps]))
            what = (self.stage, WHAT[type(ins)], getattr(ins, "mb", None),
                    getattr(ins, "chunk", None))
            wall.append(Record(*what, a - t0, b - t0))
            cpu.append(Record(*what, ca - c0, cb - c0))

        loss = self.loop.run(self.instructions, x, y, batch.size, self.m, mem.hooks,
                             self._step, st.loss_scale, around=timed)
        self.records.append(wall)
        a2a = overlap.recorded()
        self.a2a_intervals.append([(r.t_start - t0, r.t_end - t0) for r in a2a])
        self.comm_intervals.append([(s - t0, e - t0) for s, e, _ in self.link.in_flight]
                                   + self.a2a_intervals[-1])
        self.blocked_intervals.append([(r.blocked[0] - t0, r.blocked[1] - t0) for r in a2a
                                       if r.blocked is not None])
        self.cpu_records.append(cpu)
        mem.end_step()
        # once, after the step: the loads of DualPipe's two copies, then of the dp replicas
        self.bias.update(self.loop.loads or {}, self.mirror, self.grid.comm("dp"))
        self.steps_done += 1
        return StepResult(self._global(loss), skipped=not self.loop.stepped,
                          records=tuple(wall))

    def _overlap_plan(self) -> None:
        """DualPipe's overlapped pairs, for real: each pair's receives are posted before
        its computation (``_prepost``) and waited for only right before the forward or
        backward that needs it (``_wait_first``), and its forward's send starts right after
        the forward, while the backward computes (``_send_early``)."""
        here = set(self.instructions)
        self._prepost: set[Instruction] = set()
        self._wait_first: dict[Instruction, Instruction] = {}
        self._send_early: dict[Instruction, Instruction] = {}
        for ins in self.instructions:
            if not isinstance(ins, ForwardBackward):
                continue
            f, b = ins.forward, ins.backward
            for part, r in ((f, RecvAct(f.mb, f.chunk)), (b, RecvGrad(b.mb, b.chunk))):
                if r in here:
                    self._prepost.add(r)
                    self._wait_first[part] = r
            if SendAct(f.mb, f.chunk) in here:
                self._send_early[f] = SendAct(f.mb, f.chunk)

    def _rows_seq(self, ins: Instruction) -> tuple[int, int]:
        lo, hi = self.loop.cuts[ins.mb, ins.chunk]
        return hi - lo, self.loop.x.shape[1]

    def hidden_fraction(self, step: int = -1, a2a: bool = False) -> float | None:
        """The share of this rank's message time (every send and receive in flight, and the
        experts' all-to-alls) that its computing covered, in step ``step``
        (:func:`minipar.overlap.hidden_fraction`); a compute's waits for its own all-to-all
        are not computing.  ``a2a``: of the experts' all-to-alls alone."""
        compute = [(r.start, r.end) for r in self.records[step] if r.what in COMPUTE_WHAT]
        return overlap.hidden_fraction(overlap.minus(compute, self.blocked_intervals[step]),
                                       (self.a2a_intervals if a2a else self.comm_intervals)[step])

    def _step(self) -> bool:
        """After the flush: DualPipe sums its two copies' gradients (ranks s and p − 1 − s),
        then the sync's step (data parallelism's sum, the update)."""
        if self.mirror is not None:
            all_reduce(self.mirror, OP_MIRROR)(self.states.grads, None)
        return self.sync.step()

    def evaluate(self, batch: Batch) -> float:
        """Forward only: every micro-batch through the stages (no backward, nothing kept);
        the global mean loss, the same on every rank."""
        x, y = self._rows(batch)
        hooks = [self._with_bias(self.sync.eval_hooks())] * self.v
        loss = self.loop.run(forward_schedule(self.stage, self.p, self.m, self.v, self.place),
                             x, y, batch.size, self.m, hooks, keep=False)
        return self._global(loss)

    def state_dict(self) -> State:
        """The stage's params and optimizer states under their serial names, each with the
        pieces of the serial tensor it holds (the stage model's placements; the sync's
        ranges) and its replica (``replica_of``; the pipeline's: whole tensors, my dp
        coordinate); scalars: ``step`` and the optimizer's."""
        st = self.sync.state(self.stage_model.placements(self.stage_layout.names))
        for key, (shard, arr) in st.arrays.items():
            st.arrays[key] = (replace(shard, replica=self.replica_of(*key)), arr)
        st.scalars["step"] = self.steps_done
        return with_buffers(st, self.bias.arrays, self.bias.replica)

    def load_state_dict(self, state: State | Iterable[State]) -> None:
        """Read my stage's tensors from the overlapping pieces of ``state`` (any layout)."""
        sources = sources_of(state)
        self.sync.load(sources, self.stage_model.placements(self.stage_layout.names))
        load_buffers(self.bias.arrays, sources)
        self.steps_done = saved_step(sources)

    def full_params(self) -> dict[str, Any]:
        """The whole model under its serial names, serial order, on every rank (collective;
        a report: the pickled all-gathers on the world's own communicators are not counted)."""
        return self.stage_model.gather(self.world, self.sync.stage_params())

    def model_state_bytes(self) -> dict[str, int]:
        """Params, grads and optimizer states this rank holds between steps (bytes, by kind)."""
        return self.sync.model_state_bytes()

    def memory(self) -> dict[str, int]:
        """Model-state bytes by kind, and the activation peak of the stage."""
        return {**self.model_state_bytes(), "activations_peak": int(self.activation_peak_bytes)}

    def traffic(self) -> dict[str, int]:
        """Bytes this rank sent since the last call, by grid axis (and ``"world"``)."""
        return self._traffic()

    def close(self) -> None:
        """Remove what an interrupted step left offloaded (the grid is the caller's)."""
        self.stage_memory.end_step()
        getattr(self.sync, "close", lambda: None)()  # (the hybrid's ZeRO++ communicators)
        if self.mirror is not None:
            self.mirror.Free()
            self.mirror = None

    # -- around the loop -------------------------------------------------------------
    def _with_bias(self, hooks: Any) -> Any:
        """The stage's hooks (None: its own) handing the MoE blocks their loss-free bias."""
        if not self.bias.arrays:
            return hooks
        if hooks is None:
            st = self.states
            hooks = StageHooks(st.param_views(), st.layout.unflatten(st.grads))
        return BiasHooks(hooks, self.bias.views())

    def _rows(self, batch: Batch) -> tuple[Any, Any]:
        """My replica's rows of ``batch`` (tokens, targets): at least one per micro-batch."""
        x, y = self.stage_model.local_batch(batch)
        if len(x) < self.m:
            raise ValueError(f"m={self.m} micro-batches but this replica has only {len(x)} "
                             f"rows of the batch of {batch.size}: each needs at least one row")
        return x, y

    def _global(self, loss: float) -> float:
        """The global loss from every rank's part (one number: MPI's own sum)."""
        with self.world.operation(OP_LOSS):
            return float(self.world.comm.allreduce(loss if self.reports_loss else 0.0))

    # -- evidence -----------------------------------------------------------------
    def gather_records(self, step: int = -1, clock: str = "wall") -> list[Record]:
        """Every stage's records of ``step`` in dp replica 0, on every rank (collective);
        ``clock="cpu"``: the CPU-time records (durations free of waiting for a core)."""
        records = self.cpu_records if clock == "cpu" else self.records
        mine = records[step] if self.replica == 0 else []
        everyone = self.world.comm.allgather([tuple(r) for r in mine])
        return sorted((Record(*r) for rs in everyone for r in rs),
                      key=lambda r: (r.start, r.stage))


def build(spec: Any, grid: Any, **options: Any) -> PipelineParallel:
    """The pipeline engine of ``spec`` on ``grid`` (:mod:`minipar.parallel.strategies`'
    row "pp"): ``options`` are :data:`OPTIONS`; an unknown one is a ValueError."""
    checks.known("the pipeline engine", options, OPTIONS)
    if grid is None:
        raise ValueError("the pipeline engine needs a grid (minipar.comm.topology.Grid)")
    return PipelineParallel(grid, spec, **options)
