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
the gradients *added* to the stage's flat buffer; ``SendAct``/``SendGrad`` a
non-blocking ``Isend`` (Megatron's ``batch_isend_irecv``: every schedule
that passes :func:`~.check.check_schedules` runs without deadlock);
``OptimizerStep`` waits for the sends, all-reduces the gradients over the
``dp`` axis (pipeline replicas) and steps the stage's slice.  The messages — where they go, their tags, the
local hand-off of interleaving, and what travels — are :mod:`.p2p`.

**A composed strategy** (:class:`minipar.parallel.hybrid.HybridParallel`)
subclasses the executor and replaces its hooks (the template-method pattern):
the units, the stage's parameters, the batch, the loss, what travels between
stages (:class:`~.p2p.StageMessages`) and the step after the flush; the
schedule, its dispatch and the bookkeeping stay here, written once.

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
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any

import numpy as np
from mpi4py import MPI

from minipar import spans
from minipar.nn import executor
from minipar.nn.dtypes import check_model_dtype
from minipar.nn.loss import cross_entropy_backward, cross_entropy_forward
from minipar.parallel.common import check_world
from minipar.parallel.pipeline.p2p import OP_ACT, OP_GRAD, StageMessages
from minipar.parallel.pipeline.partition import check_pipeline, stage_units
from minipar.parallel.pipeline.schedule import (
    Backward,
    Forward,
    Instruction,
    OptimizerStep,
    RecvAct,
    RecvGrad,
    SendAct,
    SendGrad,
    stage_schedule,
    virtual_stage,
)
from minipar.parallel.pipeline.simulate import WHAT, Record
from minipar.parallel.pipeline.stage import StageMemory
from minipar.precision import ModelStates

__all__ = ["OP_ACT", "OP_GRAD", "PipelineParallel"]

OP_DP, OP_LOSS = "pp_dp_grad_allreduce", "pp_loss_allreduce"


class PipelineParallel(StageMessages):
    """Stage ``grid.coord("pp")`` of a pipeline replica ``grid.coord("dp")``.

    ``schedule``: naive, gpipe, 1f1b or interleaved (``chunks`` v > 1);
    ``micro_batches`` m; ``balance``: blocks per virtual stage (default even);
    ``remat``: None, True (GPipe's: keep each chunk's input per micro-batch,
    recompute the chunk in backward) or k units per segment; ``offload``: None,
    "host" or "disk" (:class:`minipar.parallel.offload.activations.Offload` around each chunk's
    checkpointing: the kept activations move out between forward and backward;
    ``offload_dir`` for disk); ``instructions``: run this list instead of the
    schedule's (a learner's schedule).  Every argument is checked on every rank before any message.
    A composed strategy subclasses it (:class:`minipar.parallel.hybrid.HybridParallel`) and
    replaces the units, the stage's parameters, the batch, the loss, what travels between
    stages (:mod:`.p2p`) and the step after the flush (the methods below ``AXES``).
    """

    def __init__(self, grid: Any, spec: Any, schedule: str = "1f1b", micro_batches: int = 1,
                 chunks: int = 1, balance: Sequence[int] | None = None, remat: Any = None,
                 offload: str | None = None, offload_dir: str | None = None,
                 instructions: Sequence[Instruction] | None = None) -> None:
        if any(grid.size(a) != 1 for a in ("tp", "cp") if a not in self.AXES):
            raise ValueError("the pipeline executor runs on a dp x pp grid (tp = cp = 1)")
        self.grid, self.spec, self.kind = grid, spec, schedule
        self.p, self.dp = grid.size("pp"), grid.size("dp")
        self.stage, self.replica = grid.coord("pp"), grid.coord("dp")
        self.m, self.v = micro_batches, chunks
        check_world(spec.batch, self.dp)
        rows = spans.counts(spec.batch, self.dp)[-1]
        self.balance = check_pipeline(spec.layers, self.p, micro_batches, schedule, chunks,
                                      balance, rows, remat)
        self.instructions = (list(instructions) if instructions is not None else
                             stage_schedule(schedule, self.stage, self.p, micro_batches,
                                            chunks))
        self.model = spec.model()
        self.chunk_units = stage_units(self.units(), self.balance, self.stage, self.p, chunks)
        self.states = ModelStates(spec.precision, self.stage_params(), spec.optimizer,
                                  **spec.opt_kwargs())
        self.act_dtype = check_model_dtype(self.model.cfg.dtype)
        self.p2p, self.dp_comm, self.world = grid.p2p, grid.comm("dp"), grid.world
        self.memory = StageMemory(self.chunk_units, remat, offload, offload_dir)
        self.records: list[list[Record]] = []  # per step: wall-clock seconds from its start
        self.cpu_records: list[list[Record]] = []  # per step: CPU seconds (process_time)

    # -- what a composed strategy (minipar.parallel.hybrid) replaces ----------------------
    AXES: tuple[str, ...] = ("dp", "pp")  #: the grid axes this executor handles

    def units(self) -> Any:  # the whole model's units (embed, blocks, head), cut into stages
        return self.model.units()

    def stage_params(self) -> dict[str, Any]:  # this stage's initial params, by full name
        init = self.spec.initial_params()
        return {n: init[n] for units in self.chunk_units for u in units for n in u.full_names}

    def local_batch(self, step: int) -> tuple[Any, Any]:  # this replica's (tokens, targets)
        return self.spec.local_batch(step, self.replica, self.dp)

    def loss_forward(self, logits: Any, targets: Any) -> tuple[float, Any]:
        return cross_entropy_forward(logits, targets)

    def loss_backward(self, saved: Any, scale: float) -> Any:
        return cross_entropy_backward(saved, scale)

    def loss_share(self) -> float:  # this rank's part of the global loss (summed over ranks)
        return self._loss

    def stage_hooks(self) -> Any:  # the chunks' innermost hooks; None: StageHooks on states
        return None

    # what travels to the neighbour stage: to_wire, wire_shape, from_wire (.p2p)

    def step_stage(self) -> None:
        """After the flush: all-reduce the gradients over ``dp``, step the stage's slice."""
        st = self.states
        if self.dp > 1:  # data parallelism across pipeline replicas (imported only then)
            from minipar.collectives import allreduce

            with self.dp_comm.operation(OP_DP):
                st.grads[...] = allreduce(self.dp_comm, st.grads)
        found_inf = None
        if st.scaler is not None:  # every stage skips together (one flag: MPI's own max)
            found_inf = bool(self.world.comm.allreduce(st.local_found_inf(), op=MPI.LOR))
        st.step(found_inf=found_inf)

    @property
    def activation_peak_bytes(self) -> int:
        """The most activation bytes this stage held at once (all chunks, every step)."""
        return self.memory.activation_peak_bytes

    @property
    def offload_stats(self) -> dict[str, Any]:
        """Bytes moved out and back, the most held out at once, seconds spent moving."""
        return self.memory.offload_stats

    # -- one step -----------------------------------------------------------------
    def train_step(self, step: int) -> float:
        """Run this stage's instruction list once; the global loss (same on every rank)."""
        st = self.states
        self.world.Barrier()  # align the ranks' clocks: records are seconds from here
        t0 = time.perf_counter()
        x, y = self.local_batch(step)
        cuts = [spans.span(len(x), self.m, i) for i in range(self.m)]
        st.grads[...] = 0
        self.memory.start_step(st, self.stage_hooks())
        self._x, self._y, self._cuts = x, y, cuts
        self._held: dict[tuple[int, int], Any] = {}  # (mb, chunk) -> (kept, loss state)
        self._box: dict[tuple[str, int, int], Any] = {}  # outputs, inputs, grads by (what, mb, c)
        self._local: dict[tuple[str, int, int], Any] = {}  # self-sends: (kind, mb, to vs)
        self._sends: list[tuple[Any, Any]] = []
        self._loss = 0.0
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
        self.memory.end_step()
        if self._held or self._box or self._local:
            raise ValueError(f"stage {self.stage}: the step ended with work left: micro-batches "
                             f"without backward {sorted(self._held)}, unsent or unused messages "
                             f"{sorted(self._box) + sorted(self._local)}")
        with self.world.operation(OP_LOSS):  # one number to report: MPI's own sum
            return float(self.world.comm.allreduce(self.loss_share()))

    def train(self) -> list[float]:
        """``spec.steps`` steps; the global losses."""
        return [self.train_step(s) for s in range(self.spec.steps)]

    # -- the instructions ---------------------------------------------------------
    def _weight(self, mb: int) -> float:
        lo, hi = self._cuts[mb]
        return (hi - lo) / self.spec.batch

    def _run(self, ins: Instruction) -> None:
        """Dispatch one instruction from the table (DeepSpeed's ``_INSTRUCTION_MAP``)."""
        if isinstance(ins, OptimizerStep):
            return self._optimizer_step()
        table = {Forward: (self._forward,), Backward: (self._backward,),
                 SendAct: (self._send, "act", +1), SendGrad: (self._send, "grad", -1),
                 RecvAct: (self._recv, "act", -1), RecvGrad: (self._recv, "grad", +1)}
        if type(ins) not in table:
            raise ValueError(f"stage {self.stage}: unknown pipeline instruction {ins!r}")
        fn, *how = table[type(ins)]
        return fn(ins.mb, ins.chunk, *how)

    def _vs(self, chunk: int) -> int:
        if not 0 <= chunk < self.v:
            raise ValueError(f"stage {self.stage}: chunk {chunk} outside 0..{self.v - 1}")
        return virtual_stage(self.stage, chunk, self.p)

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
        out, kept = self.memory.measured(chunk, lambda: executor.forward(
            self.chunk_units[chunk], self.memory.hooks[chunk], inp, aux=aux))
        w = self._weight(mb)
        self._loss += w * sum(aux)
        if vs == last:
            ce, s_ce = self.loss_forward(out, self._y[lo:hi])
            self._loss += w * ce
            self._held[(mb, chunk)] = (kept, s_ce)
        else:
            self._box[("out", mb, chunk)] = out
            self._held[(mb, chunk)] = (kept, None)

    def _backward(self, mb: int, chunk: int) -> None:
        vs, last = self._vs(chunk), self.p * self.v - 1
        if (mb, chunk) not in self._held:
            raise ValueError(f"stage {self.stage}: Backward({mb}, {chunk}) before its Forward")
        kept, s_ce = self._held.pop((mb, chunk))
        scale = self._weight(mb) * self.states.loss_scale
        if vs == last:
            dy = self.loss_backward(s_ce, scale)
        else:
            dy = self._box.pop(("dout", mb, chunk), None)
            if dy is None:
                raise ValueError(f"stage {self.stage}: Backward({mb}, {chunk}) before its "
                                 f"RecvGrad({mb}, {chunk})")
        dx = self.memory.measured(chunk, lambda: executor.backward(
            self.chunk_units[chunk], self.memory.hooks[chunk], kept, dy, scale))
        if vs > 0:
            self._box[("din", mb, chunk)] = dx

    def _optimizer_step(self) -> None:
        self._wait_sends()
        self.step_stage()

    # -- evidence -----------------------------------------------------------------
    def gather_records(self, step: int = -1, clock: str = "wall") -> list[Record]:
        """Every stage's records of ``step`` in dp replica 0, on every rank (collective);
        ``clock="cpu"``: the CPU-time records (durations free of waiting for a core)."""
        records = self.cpu_records if clock == "cpu" else self.records
        mine = records[step] if self.replica == 0 else []
        everyone = self.world.comm.allgather([tuple(r) for r in mine])
        return sorted((Record(*r) for rs in everyone for r in rs),
                      key=lambda r: (r.start, r.stage))

    def full_params(self) -> Any:
        """The whole model's flat parameters (model order) on every rank (collective)."""
        from minipar.optim import FlatParams

        mine = self.states.layout.unflatten(self.states.params) if self.replica == 0 else {}
        everyone = self.world.comm.allgather({k: np.asarray(v) for k, v in mine.items()})
        layout = FlatParams.from_shapes(self.model.param_shapes())
        merged = {k: v for d in everyone for k, v in d.items()}
        return layout.flatten({n: merged[n] for n in layout.names})
