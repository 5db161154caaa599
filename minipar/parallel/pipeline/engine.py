"""The pipeline executor: one stage's instruction list, run over MPI.

EN pipeline parallelism (executor) · RU конвейерный параллелизм (исполнитель) · ZH 流水线并行（执行器）

GPipe (Huang et al. 2018, arXiv 1811.06965), 1F1B and interleaved 1F1B
(Narayanan et al. 2021, arXiv 2104.04473).  Rank s of the grid's ``pp`` axis
holds stage s — its chunks of units (:mod:`.partition`), their parameters,
gradients and AdamW states only — and runs ``stage_schedule(kind, s, p, m, v)``
(:mod:`.schedule`) as written, each instruction dispatched from one table
(DeepSpeed's ``_INSTRUCTION_MAP``): ``RecvAct``/``RecvGrad`` a blocking receive;
``Forward`` the units executor's forward over the chunk (one ``kept`` per
micro-batch; the last virtual stage adds the loss); ``Backward`` its backward,
the gradients *added* to the stage's flat buffer — or, split (zero bubble, Qi et al.
2023), ``BackwardInput`` (B: the input's gradient, the linears' inputs and output
gradients kept in ``_pending``) and later ``BackwardWeight`` (W: the weight
gradients from them, into the buffer); ``SendAct``/``SendGrad`` a
non-blocking ``Isend`` (Megatron's ``batch_isend_irecv``: every schedule
that passes :func:`~.check.check_schedules` runs without deadlock);
``OptimizerStep`` waits for the sends and hands the gradients to the sync (the
pipeline's: all-reduce them over the ``dp`` axis, the pipeline replicas, and step the
stage's slice).  The messages — where they go, their tags, the local hand-off of
interleaving — are a :class:`~.p2p.StageLink` the engine holds.

**Composition, not inheritance.**  The engine is *given* three parts (:mod:`.parts`):
a stage model (the units, the stage's parameters and their placement, the batch, the
loss: :class:`~.parts.SerialStage` by default), a wire (what travels between stages:
:class:`~.p2p.Whole`) and a gradient sync (the model states and the step after the
flush: :class:`~.parts.AllReduceSync` over dp).  The hybrid engine
(:func:`minipar.parallel.hybrid.engine.build`) is this class given tensor-, context- or
expert-parallel stage models, PTD-P's scatter/gather and ZeRO; the schedule, its
dispatch and the bookkeeping stay here, written once.

**Why it equals the serial run.**  Micro-batch i holds rows ``[lo_i, hi_i)``
of the replica's rows (the ``array_split`` rule); its loss and gradients are
weighted by w_i = (hi_i − lo_i)/B, B the global batch, so

    Σ_replicas Σ_i w_i ∇ℓ_i  =  ∇ℓ   (the serial mean over the global batch)

— gradient accumulation, then DP's sum.  AdamW is element-wise: each stage
stepping its slice is the serial step.  An MoE block's auxiliary loss gets the
gradient w_i, as in ``train(micro_batches=m)``, which routes the same groups.

Each instruction's start and end (``perf_counter``, seconds from the step's
start, after a barrier; and in CPU seconds, ``process_time``) become a
:class:`~.simulate.Record`, so the bubble functions and charts of
:mod:`.measure` read the measured timeline as they read a simulated one.  A
chunk's hooks (:mod:`.stage`) accumulate the gradients, keep or recompute
(``remat``) and offload its activations, and count the bytes held.

**The engine interface** (:class:`minipar.parallel.engine.Engine`, built by
``strategies.build("pp", spec, grid, **options)``): ``step(batch)`` cuts this replica's
rows of the GLOBAL batch (the ``array_split`` rule) and its micro-batches, runs the
instruction list and returns the global loss; ``evaluate(batch)`` runs every
micro-batch's forward through the stages (:func:`~.schedule.forward_schedule`), no
backward; ``state_dict()``: the stage's tensors whole, under their serial names (replica:
the dp coordinate); ``full_params()``: every stage's tensors on every rank.
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Sequence
from dataclasses import replace
from typing import Any

from minipar import checks, spans
from minipar.comm.topology import require_grid
from minipar.nn import executor, weight_grad
from minipar.nn.dtypes import check_model_dtype
from minipar.parallel.common import check_world
from minipar.parallel.engine import AxisTraffic, Batch, State, StepResult, saved_step, sources_of
from minipar.parallel.pipeline.p2p import OP_ACT, OP_GRAD, StageLink, Whole
from minipar.parallel.pipeline.partition import check_pipeline, stage_units
from minipar.parallel.pipeline.parts import AllReduceSync, SerialStage, all_reduce
from minipar.parallel.pipeline.schedule import (
    Backward,
    BackwardInput,
    BackwardWeight,
    Forward,
    Instruction,
    OptimizerStep,
    RecvAct,
    RecvGrad,
    SendAct,
    SendGrad,
    forward_schedule,
    placement,
    stage_schedule,
    virtual_stage,
)
from minipar.parallel.pipeline.simulate import WHAT, Record
from minipar.parallel.pipeline.stage import StageMemory

__all__ = ["OPTIONS", "OP_ACT", "OP_GRAD", "PipelineParallel", "build"]

OP_DP, OP_LOSS = "pp_dp_grad_allreduce", "pp_loss_allreduce"

#: the keyword options of :func:`build` (``PipelineParallel``'s arguments after grid, spec)
OPTIONS = ("schedule", "micro_batches", "chunks", "balance", "remat", "offload",
           "offload_dir", "instructions")


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
    Keyword only, the parts (:mod:`.parts`): ``stage_model`` (default
    :class:`~.parts.SerialStage`), ``wire`` (default :class:`~.p2p.Whole`), ``sync``
    (default :class:`~.parts.AllReduceSync` over dp) — the hybrid engine gives its own.
    """

    def __init__(self, grid: Any, spec: Any, schedule: str = "1f1b", micro_batches: int = 1,
                 chunks: int = 1, balance: Sequence[int] | None = None, remat: Any = None,
                 offload: str | None = None, offload_dir: str | None = None,
                 instructions: Sequence[Instruction] | None = None, *,
                 stage_model: Any = None, wire: Any = None, sync: Any = None) -> None:
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
        self.model = self.stage_model.model
        self.chunk_units = stage_units(self.stage_model.units(), self.balance, self.stage,
                                       self.p, chunks, self.place)
        units = [u for us in self.chunk_units for u in us]
        params = self.stage_model.params([n for u in units for n in u.full_names])
        self.states = self.sync.build(spec, params, units)
        self.stage_layout = self.sync.layout  # the stage's Ψ_p parameters, flat
        self.act_dtype = check_model_dtype(self.model.cfg.dtype)
        self.wire = Whole() if wire is None else wire
        self.link = StageLink(grid.p2p, self.stage, self.p, self.v, self.act_dtype,
                              spec.d_model, self.wire, self.place)
        self.stage_memory = StageMemory(self.chunk_units, remat, offload, offload_dir)
        self.records: list[list[Record]] = []  # per step: wall-clock seconds from its start
        self.cpu_records: list[list[Record]] = []  # per step: CPU seconds (process_time)
        self.steps_done = 0
        #: the most bytes this stage kept only for W at once (B done, W not: the linears'
        #: inputs and output gradients, Qi et al. 2023), over every step; 0 unsplit
        self.w_peak_bytes = 0
        self._eval_hooks: Any = None  # evaluate(): the hooks of a forward-only pass
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
        st = self.states
        self.world.Barrier()  # align the ranks' clocks: records are seconds from here
        t0 = time.perf_counter()
        self._begin(batch)
        st.grads[...] = 0
        self.stage_memory.start_step(st, self.sync.step_hooks())
        self._done = True
        wall: list[Record] = []
        cpu: list[Record] = []  # the same instructions timed in this process's CPU seconds
        c0 = time.process_time()
        for ins in self.instructions:
            a, ca = time.perf_counter(), time.process_time()
            self._run(ins)
            b, cb = time.perf_counter(), time.process_time()
            what = (self.stage, WHAT[type(ins)], getattr(ins, "mb", None),
                    getattr(ins, "chunk", None))
            wall.append(Record(*what, a - t0, b - t0))
            cpu.append(Record(*what, ca - c0, cb - c0))
        self.records.append(wall)
        self.cpu_records.append(cpu)
        self.stage_memory.end_step()
        loss = self._finish("step")
        self.steps_done += 1
        return StepResult(loss, skipped=not self._done, records=tuple(wall))

    def evaluate(self, batch: Batch) -> float:
        """Forward only: every micro-batch through the stages (no backward, nothing kept);
        the global mean loss, the same on every rank."""
        self._begin(batch)
        self._eval_hooks = self.sync.eval_hooks()
        try:
            for ins in forward_schedule(self.stage, self.p, self.m, self.v, self.place):
                self._run(ins)
            self.link.wait()
        finally:
            self._eval_hooks = None
        return self._finish("evaluate")

    def state_dict(self) -> State:
        """The stage's params and optimizer states under their serial names, each with the
        pieces of the serial tensor it holds (the stage model's placements; the sync's
        ranges) and its replica (the pipeline's: whole tensors, my dp coordinate); scalars:
        ``step`` and the optimizer's."""
        st = self.sync.state(self.stage_model.placements(self.stage_layout.names))
        for key, (shard, arr) in st.arrays.items():
            replica = self.stage_model.replica(key[1], self.sync.ranged(key[0]))
            st.arrays[key] = (replace(shard, replica=replica), arr)
        st.scalars["step"] = self.steps_done
        return st

    def load_state_dict(self, state: State | Iterable[State]) -> None:
        """Read my stage's tensors from the overlapping pieces of ``state`` (any layout)."""
        sources = sources_of(state)
        self.sync.load(sources, self.stage_model.placements(self.stage_layout.names))
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

    # -- one pass over the instructions -------------------------------------------
    def _begin(self, batch: Batch) -> None:
        """My replica's rows of ``batch``, cut into m micro-batches; the step's boxes."""
        x, y = self.stage_model.local_batch(batch)
        if len(x) < self.m:
            raise ValueError(f"m={self.m} micro-batches but this replica has only {len(x)} "
                             f"rows of the batch of {batch.size}: each needs at least one row")
        self._rows = batch.size
        self._x, self._y = x, y
        self._cuts = [spans.span(len(x), self.m, i) for i in range(self.m)]
        self._held: dict[tuple[int, int], Any] = {}  # (mb, chunk) -> (kept, loss state)
        self._pending: dict[tuple[int, int], Any] = {}  # (mb, chunk) -> what W needs
        self._box: dict[tuple[str, int, int], Any] = {}  # outputs, inputs, grads by (what, mb, c)
        self.link.begin()
        self._loss = 0.0

    def _finish(self, what: str) -> float:
        """Nothing may be left over; the global loss (one number: MPI's own sum)."""
        left = self.link.unreceived()
        if self._held or self._box or left or self._pending:
            raise ValueError(f"stage {self.stage}: the {what} ended with work left: "
                             f"micro-batches without backward {sorted(self._held)}, without "
                             f"W {sorted(self._pending)}, unsent or "
                             f"unused messages {sorted(self._box) + left}")
        with self.world.operation(OP_LOSS):
            return float(self.world.comm.allreduce(self.stage_model.loss_share(self._loss)))

    # -- the instructions ---------------------------------------------------------
    def _weight(self, mb: int) -> float:
        lo, hi = self._cuts[mb]
        return self.stage_model.weight((hi - lo) / self._rows)

    def _run(self, ins: Instruction) -> None:
        """Dispatch one instruction from the table (DeepSpeed's ``_INSTRUCTION_MAP``)."""
        if isinstance(ins, OptimizerStep):
            return self._optimizer_step()
        table = {Forward: (self._forward,), Backward: (self._backward,),
                 BackwardInput: (self._backward_input,),
                 BackwardWeight: (self._backward_weight,),
                 SendAct: (self._send, "act", +1), SendGrad: (self._send, "grad", -1),
                 RecvAct: (self._recv, "act", -1), RecvGrad: (self._recv, "grad", +1)}
        if type(ins) not in table:
            raise ValueError(f"stage {self.stage}: unknown pipeline instruction {ins!r}")
        fn, *how = table[type(ins)]
        return fn(ins.mb, ins.chunk, *how)

    def _vs(self, chunk: int) -> int:
        if not 0 <= chunk < self.v:
            raise ValueError(f"stage {self.stage}: chunk {chunk} outside 0..{self.v - 1}")
        return virtual_stage(self.stage, chunk, self.p, self.place)

    def _forward(self, mb: int, chunk: int) -> None:
        vs, last = self._vs(chunk), self.p * self.v - 1
        lo, hi = self._cuts[mb]
        if (mb, chunk) in self._held:
            raise ValueError(f"stage {self.stage}: Forward({mb}, {chunk}) runs twice")
        if vs == 0:
            inp = self._x[lo:hi]
        else:
            inp = self._box.pop(("in", mb, chunk), None)
            if inp is None:
                raise ValueError(f"stage {self.stage}: Forward({mb}, {chunk}) before its "
                                 f"RecvAct({mb}, {chunk})")
        aux: list[float] = []
        if self._eval_hooks is not None:  # evaluate: forward only, nothing kept
            out, _ = executor.forward(self.chunk_units[chunk], self._eval_hooks, inp, aux=aux)
            kept = None
        else:
            mem = self.stage_memory
            out, kept = mem.measured(chunk, lambda: executor.forward(
                self.chunk_units[chunk], mem.hooks[chunk], inp, aux=aux))
        w = self._weight(mb)
        self._loss += w * sum(aux)
        if vs == last:
            ce, s_ce = self.stage_model.loss_forward(out, self._y[lo:hi])
            self._loss += w * ce
            if kept is not None:
                self._held[(mb, chunk)] = (kept, s_ce)
        else:
            self._box[("out", mb, chunk)] = out
            if kept is not None:
                self._held[(mb, chunk)] = (kept, None)

    def _output_grad(self, mb: int, chunk: int, name: str) -> tuple[Any, Any, float]:
        """(kept, dy, scale) of a backward: the loss's gradient on the last virtual stage,
        else the received one."""
        vs, last = self._vs(chunk), self.p * self.v - 1
        if (mb, chunk) not in self._held:
            raise ValueError(f"stage {self.stage}: {name}({mb}, {chunk}) before its Forward")
        kept, s_ce = self._held.pop((mb, chunk))
        scale = self._weight(mb) * self.states.loss_scale
        if vs == last:
            dy = self.stage_model.loss_backward(s_ce, scale)
        else:
            dy = self._box.pop(("dout", mb, chunk), None)
            if dy is None:
                raise ValueError(f"stage {self.stage}: {name}({mb}, {chunk}) before its "
                                 f"RecvGrad({mb}, {chunk})")
        return kept, dy, scale

    def _backward(self, mb: int, chunk: int) -> None:
        kept, dy, scale = self._output_grad(mb, chunk, "Backward")
        mem = self.stage_memory
        dx = mem.measured(chunk, lambda: executor.backward(
            self.chunk_units[chunk], mem.hooks[chunk], kept, dy, scale))
        if self._vs(chunk) > 0:
            self._box[("din", mb, chunk)] = dx

    def _backward_input(self, mb: int, chunk: int) -> None:
        """B: the chunk's input gradient (sent by the next instruction); the activations
        the weight gradients need stay in ``_pending`` until this micro-batch's W."""
        kept, dy, scale = self._output_grad(mb, chunk, "BackwardInput")
        mem = self.stage_memory
        dx, pending = mem.measured(chunk, lambda: executor.backward_input(
            self.chunk_units[chunk], mem.hooks[chunk], kept, dy, scale))
        self._pending[(mb, chunk)] = pending
        self.w_peak_bytes = max(self.w_peak_bytes,
                                weight_grad.kept_bytes([p for ps in self._pending.values()
                                                        for p in ps]))
        if self._vs(chunk) > 0:
            self._box[("din", mb, chunk)] = dx

    def _backward_weight(self, mb: int, chunk: int) -> None:
        """W: the chunk's parameter gradients from what its B kept, added to the stage's
        gradient buffer (no message: with sequence parallelism, the tensor-parallel
        re-gather of the inputs, inside the stage's own group)."""
        if (mb, chunk) not in self._pending:
            raise ValueError(f"stage {self.stage}: BackwardWeight({mb}, {chunk}) before its "
                             f"BackwardInput")
        pending = self._pending.pop((mb, chunk))
        executor.backward_weight(self.chunk_units[chunk], self.stage_memory.hooks[chunk],
                                 pending)

    def _send(self, mb: int, chunk: int, kind: str, step: int) -> None:
        """``SendAct`` ("act": the chunk's output, to vs + 1) or ``SendGrad`` ("grad": its
        input's gradient, to vs − 1)."""
        vs = self._vs(chunk)
        data = self._box.pop(("out" if kind == "act" else "din", mb, chunk), None)
        self.link.send(mb, chunk, vs, kind, step, data)

    def _recv(self, mb: int, chunk: int, kind: str, step: int) -> None:
        """``RecvAct`` ("act", from vs − 1) or ``RecvGrad`` ("grad", from vs + 1)."""
        lo, hi = self._cuts[mb]
        buf = self.link.recv(mb, chunk, self._vs(chunk), kind, step, hi - lo, self._x.shape[1])
        self._box[("in" if kind == "act" else "dout", mb, chunk)] = buf

    def _optimizer_step(self) -> None:
        self.link.wait()
        self._done = self.sync.step()

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
