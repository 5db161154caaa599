"""Hybrid (3D/4D) parallelism: one training step over the whole grid — гибридный
параллелизм — 混合并行.

EN 3D parallelism (hybrid parallelism, PTD-P) · RU трёхмерный (гибридный) параллелизм ·
ZH 3D 并行（混合并行）

Narayanan et al. 2021, "Efficient Large-Scale Language Model Training on GPU
Clusters Using Megatron-LM" (PTD-P), arXiv 2104.04473, §3: n = p·t·d ranks.
The grid (:class:`minipar.comm.topology.Grid`, axes dp × pp × cp × tp, tp
innermost) gives every rank one tensor-parallel shard of one pipeline stage of
one context slice of one data-parallel replica.  The step is the pieces that
exist, composed — none of their code is repeated here:

* the pipeline executor (:class:`~minipar.parallel.pipeline.engine.PipelineParallel`,
  GPipe / 1F1B / interleaved, remat and offload) runs this rank's stage, and its
  units are not the serial ones but
  - tensor-parallel units over ``grid.comm("tp")`` (Megatron's f/g,
    :func:`~minipar.parallel.tensor_parallel.model.tp_gpt_units`), the loss the
    vocabulary-parallel cross-entropy; ``sequence_parallel=True`` (Korthikanti et al.
    2022, arXiv 2205.05198): the blocks' input is a sequence shard, so that is also what
    travels between stages; or
  - context-parallel units over ``grid.comm("cp")`` (ring attention or Ulysses,
    :func:`~minipar.parallel.context_parallel.cp_units`), each rank its positions, its
    loss weighted by s_c/s; with tp > 1 too (Megatron's CP × TP), the tensor-parallel
    units whose attention core over the local n_head/t heads is the CP core
    (:class:`~minipar.parallel.context_parallel.CPAttention`), the embedding at the cp
    rank's positions; or
  - expert-parallel MoE blocks over ``grid.comm("ep")`` (DeepSpeed-MoE, the ep ranks
    carved out of the data-parallel ones, :class:`~minipar.parallel.expert_parallel.layer.EPMoE`);
* between stages (the executor's wire hooks, :mod:`minipar.parallel.pipeline.p2p`),
  with tp > 1, PTD-P's scatter/gather (§4.1): the t ranks of a tensor
  group hold the same activation, so each sends 1/t of it and the next stage's group
  all-gathers the pieces (``scatter_gather=False``: every rank sends all of it);
* after the flush the stage's gradients (its tensor shard's, under their serial names)
  are summed over the ranks that hold the same shard: the dp·cp ranks (one ring
  all-reduce on ``dp``, or on ``edp`` = dp·cp when cp > 1), dense and expert gradients
  apart with ep (``dp`` and ``edp``); or ZeRO (Rajbhandari et al. 2019, arXiv
  1910.02054) over those N = dp·cp ranks, on the stage's Ψ_p parameters (its tensor shard)
  (:mod:`minipar.parallel.hybrid.zero`: ZeRO-1, 2 and 3 inside a pipeline).

Micro-batch i of replica d carries the weight w_i = b_i/B (times s_c/s under cp), so
Σ_d Σ_i w_i ∇ℓ_i is the serial gradient; AdamW is element-wise, so every rank stepping
its shard of its stage is the serial step: float64 parity with the serial GPT
(tests/test_hybrid.py).  Bytes per axis: :mod:`minipar.parallel.hybrid.measure`.

**The engine interface** (``strategies.build("hybrid", spec, grid, **options)``): the
pipeline engine's ``step``, ``evaluate``, ``traffic``; ``state_dict()`` holds every tensor
of my stage under its serial name and global shape, a tensor-parallel shard as its column
or row groups (``w_qkv``: three pieces), ZeRO's range per tensor; replica = the index of
my copy among the ranks that hold the same piece (dp·cp, and tp for a tensor every tp rank
holds whole; an expert: its edp coordinate).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import replace
from typing import Any

import numpy as np
from mpi4py import MPI

from minipar.collectives import all_gather, allreduce, reduce_scatter
from minipar.nn import executor
from minipar.nn.gpt import BlockUnit, EmbedUnit, HeadUnit
from minipar.parallel.engine import (
    Piece,
    Shard,
    State,
    load_model_states,
    model_states,
    sources_of,
    whole,
)
from minipar.parallel.hybrid.layout import check_hybrid, micro_rows
from minipar.parallel.hybrid.measure import bytes_formula
from minipar.parallel.hybrid.zero import HybridZero
from minipar.parallel.pipeline.engine import OPTIONS as PIPELINE_OPTIONS
from minipar.parallel.pipeline.engine import PipelineParallel

__all__ = ["OPTIONS", "HybridParallel", "build", "tp_placement"]

#: the keyword options of :func:`build`: the pipeline's (but a learner's instruction list)
#: and the hybrid's own
OPTIONS = tuple(o for o in PIPELINE_OPTIONS if o != "instructions") + (
    "zero", "cp_kind", "scatter_gather", "sequence_parallel")

OP_GRADS, OP_EXPERT_GRADS = "hybrid_grad_allreduce", "hybrid_expert_allreduce"
OP_ZERO_RS, OP_ZERO_AG = "hybrid_zero_reduce_scatter", "hybrid_zero_all_gather"
OP_GATHER = "pp_tp_gather"


class HybridParallel(HybridZero, PipelineParallel):
    """This rank's part of a dp × pp × cp × tp (× ep) run of ``spec``'s GPT on ``grid``.

    The pipeline arguments are :class:`PipelineParallel`'s; ``zero``: 0 (all-reduce) or
    1-3 (ZeRO over the dp·cp ranks); ``cp_kind``: "ring" (zigzag) or "ulysses";
    ``scatter_gather`` (PTD-P §4.1, tp > 1) and ``sequence_parallel`` (tp > 1).  Bad sizes
    raise ``ValueError`` on every rank before any message (:func:`check_hybrid`).
    The engine interface is the pipeline engine's (``step``, ``evaluate``, ...);
    ``bytes_formula()`` / ``model_state_bytes()`` are the evidence.
    """

    AXES = ("dp", "pp", "cp", "tp", "ep")

    def __init__(self, grid: Any, spec: Any, schedule: str = "1f1b", micro_batches: int = 1,
                 chunks: int = 1, balance: Any = None, remat: Any = None,
                 offload: str | None = None, offload_dir: str | None = None, zero: int = 0,
                 cp_kind: str = "ring", scatter_gather: bool = True,
                 sequence_parallel: bool = False) -> None:
        lay = grid.layout
        check_hybrid(grid.world.size, spec, lay.dp, lay.pp, lay.tp, lay.cp, lay.ep, zero,
                     schedule, micro_batches, chunks, balance, remat, cp_kind,
                     sequence_parallel)
        self.sp = bool(sequence_parallel) and lay.tp > 1
        self.grid, self.zero, self.cp_kind = grid, zero, cp_kind
        self.scatter_gather = bool(scatter_gather) and lay.tp > 1 and not self.sp
        self.t, self.cp, self.ep = lay.tp, lay.cp, lay.ep
        self.cfg = spec.config()
        self.positions = np.arange(spec.seq)
        if self.cp > 1:
            from minipar.parallel.context_parallel.layout import sharding

            self.cp_layout = sharding(spec.seq, self.cp, cp_kind, cp_kind == "ring")
            self.positions = self.cp_layout.positions(grid.coord("cp"))
        self._m = micro_batches
        super().__init__(grid, spec, schedule, micro_batches, chunks, balance, remat, offload,
                         offload_dir)
        # the ranks that hold the same shard of the same stage: dp·cp of them
        self.shard_comm = grid.comm("dp" if self.cp == 1 else "edp")
        self.stage_layout = self.states.layout  # the stage's Ψ_p parameters, flat
        self.grad_accumulation_bytes = 0  # ZeRO-2: the full buffer held during the step
        if zero:
            self._shard_states(spec)

    # -- the pieces the pipeline executor runs -------------------------------------------
    def units(self) -> Any:
        cfg, grid = self.cfg, self.grid
        if self.t > 1 and self.cp > 1:  # the TP block's attention core: the CP core
            from minipar.parallel.context_parallel.model import CPAttention
            from minipar.parallel.tensor_parallel.model import TPBlockUnit, TPEmbedUnit, TPHeadUnit

            tp = grid.comm("tp")
            core = CPAttention(grid.comm("cp"), self.cp_kind, self.cp_layout,
                               cfg.n_head // self.t)
            return (TPEmbedUnit(cfg, tp, positions=self.positions),
                    *(TPBlockUnit(cfg, tp, i, core=core) for i in range(cfg.n_layer)),
                    TPHeadUnit(cfg, tp))
        if self.t > 1:
            from minipar.parallel.tensor_parallel.model import tp_gpt_units

            return tp_gpt_units(cfg, grid.comm("tp"), self.sp)
        if self.cp > 1:
            from minipar.parallel.context_parallel.model import cp_units

            return cp_units(cfg, grid.comm("cp"), self.cp_kind, self.cp_layout)
        if self.ep > 1:
            from minipar.parallel.expert_parallel.layer import EPBlockUnit, EPMoE
            from minipar.parallel.expert_parallel.layout import capacities

            tokens = self.spec.batch // (grid.size("dp") * self._m) * self.spec.seq
            caps = capacities(cfg.n_experts, cfg.capacity_factor, [tokens] * self.ep, cfg.top_k)
            blocks = [EPBlockUnit(cfg, i, EPMoE(grid.comm("ep"), cfg, caps, tokens))
                      if cfg.is_moe_block(i) else BlockUnit(cfg, i) for i in range(cfg.n_layer)]
            return (EmbedUnit(cfg), *blocks, HeadUnit(cfg))
        return self.model.units()

    def stage_params(self) -> dict[str, Any]:
        full = self.spec.initial_params()
        if self.t > 1:
            from minipar.parallel.tensor_parallel.layers import shard_params

            full = shard_params(full, self.cfg, self.t, self.grid.coord("tp"))
        names = [n for units in self.chunk_units for u in units for n in u.full_names]
        if self.ep == 1:  # the units' order: ZeRO-3 gathers each unit's span
            self.n_dense = sum(full[n].size for n in names)
            return {n: full[n] for n in names}
        dense = [n for n in names if ".moe.experts." not in n]
        experts = [n for n in names if ".moe.experts." in n]
        self.n_dense = sum(full[n].size for n in dense)  # experts after: one span each
        return {n: full[n] for n in dense + experts}

    def local_batch(self, batch: Any) -> tuple[Any, Any]:
        x, y = super().local_batch(batch)
        return (x[:, self.positions], y[:, self.positions]) if self.cp > 1 else (x, y)

    def _weight(self, mb: int) -> float:
        return super()._weight(mb) * len(self.positions) / self.spec.seq

    def loss_forward(self, logits: Any, targets: Any) -> tuple[float, Any]:
        if self.t == 1:
            return super().loss_forward(logits, targets)
        from minipar.parallel.tensor_parallel.layers import vocab_parallel_cross_entropy_forward

        return vocab_parallel_cross_entropy_forward(self.grid.comm("tp"), logits, targets)

    def loss_backward(self, saved: Any, scale: float) -> Any:
        if self.t == 1:
            return super().loss_backward(saved, scale)
        from minipar.parallel.tensor_parallel.layers import vocab_parallel_cross_entropy_backward

        return vocab_parallel_cross_entropy_backward(saved, scale)

    def to_wire(self, buf: Any) -> Any:
        """PTD-P §4.1: the tp ranks hold the same activation; each sends its 1/t of it."""
        if not self.scatter_gather:
            return buf
        k, r = buf.size // self.t, self.grid.coord("tp")
        return np.ascontiguousarray(buf.reshape(-1)[r * k:(r + 1) * k])

    def wire_shape(self, shape: tuple[int, ...]) -> tuple[int, ...]:
        """Sequence parallelism: the blocks' input is my sequence shard (nothing to gather)."""
        if self.sp:
            return (shape[0], shape[1] // self.t, *shape[2:])
        return (int(np.prod(shape)) // self.t,) if self.scatter_gather else shape

    def from_wire(self, buf: Any, shape: tuple[int, ...]) -> Any:
        """...and the receiving tp ranks all-gather the pieces (op ``pp_tp_gather``)."""
        if not self.scatter_gather:
            return buf
        tp = self.grid.comm("tp")
        with tp.operation(OP_GATHER):
            return all_gather(tp, buf).reshape(shape)

    def loss_share(self) -> float:
        """The tp ranks of a group computed the same loss: the first one reports it."""
        return self._loss if self.grid.coord("tp") == 0 else 0.0

    def eval_hooks(self) -> Any:
        """ZeRO-2: views of the full parameters; ZeRO-3: ZeRO's all-gathering hooks."""
        if self.zero == 2:
            return executor.Hooks(self.stage_layout.unflatten(self.full_buf))
        return self.zero_hooks if self.zero == 3 else super().eval_hooks()

    def step_stage(self) -> bool:
        """Sum the stage's gradients over the ranks holding the same shard, then step;
        False when a 16-bit overflow skipped the update."""
        st, comm, nd = self.states, self.shard_comm, self.n_dense
        if self.ep > 1:  # dense over dp, experts over their replicas (edp)
            dp, edp = self.grid.comm("dp"), self.grid.comm("edp")
            with dp.operation(OP_GRADS):
                st.grads[:nd] = allreduce(dp, st.grads[:nd], "sum", "ring")
            with edp.operation(OP_EXPERT_GRADS):
                st.grads[nd:] = allreduce(edp, st.grads[nd:], "sum", "ring")
        elif self.zero in (1, 2):  # ZeRO-3 reduce-scattered each unit after its backward
            with comm.operation(OP_ZERO_RS):
                if self.zero == 1:
                    st.grads[st.lo:st.hi] = reduce_scatter(comm, st.grads)
                else:
                    st.grads[...] = reduce_scatter(comm, self._acc)
                    self._acc = None  # ZeRO-2 keeps only its shard of the gradients
        elif comm.size > 1 and not self.zero:
            with comm.operation(OP_GRADS):
                st.grads[...] = allreduce(comm, st.grads, "sum", "ring")
        found_inf = None
        if st.scaler is not None:  # every rank skips together (one flag: MPI's own max)
            found_inf = bool(self.world.comm.allreduce(st.local_found_inf(), op=MPI.LOR))
        done = st.step(found_inf=found_inf)
        if self.zero in (1, 2):
            full = st.params if self.zero == 1 else self.full_buf
            with comm.operation(OP_ZERO_AG):
                full[...] = all_gather(comm, st.params[st.lo:st.hi])
        return done

    # -- the engine interface (the rest is the pipeline engine's) -------------------------
    def placements(self) -> dict[str, Shard]:
        """Where each tensor of my stage sits in the serial one (:func:`tp_placement`)."""
        shapes, r = self.model.param_shapes(), self.grid.coord("tp")
        return {n: tp_placement(n, shapes[n], self.t, r) for n in self.stage_layout.names}

    def replica_of(self, name: str, ranged: bool) -> int:
        """My copy's index among the ranks holding the same piece of ``name``: the
        dp·cp ranks (e = d·cp + c; ``ranged``: ZeRO's range, each of them holds its own, so
        none), times the tp ranks for a tensor every tp rank holds whole; an expert under
        ep: its edp coordinate (the ranks holding the same experts)."""
        from minipar.parallel.tensor_parallel.layers import kind_of

        g = self.grid
        tp = g.coord("tp") if self.t == 1 or kind_of(name) == "replicated" else 0
        if self.ep > 1 and ".moe.experts." in name:
            return g.coord("edp") * self.t + tp
        e = 0 if ranged else g.coord("dp") * self.cp + g.coord("cp")
        return e * self.t + tp

    def state_dict(self) -> State:
        """My stage's tensors under their serial names and global shapes (tensor-parallel
        shards as their pieces; ZeRO: my range per tensor), each with its replica."""
        place = self.placements()
        st = (self.zero_state(place) if self.zero in (2, 3) else
              model_states(self.states, place))
        for key, (shard, arr) in st.arrays.items():
            ranged = self.zero == 3 or (self.zero > 0 and key[0] != "param")
            st.arrays[key] = (replace(shard, replica=self.replica_of(key[1], ranged)), arr)
        st.scalars["step"] = self.steps_done
        return st

    def load_state_dict(self, state: State | Iterable[State]) -> None:
        """Read my pieces from the overlapping pieces of ``state`` (any layout's)."""
        sources = sources_of(state)
        if self.zero in (2, 3):
            self.load_zero_state(sources, self.placements())
        else:
            load_model_states(self.states, sources, self.placements())
        self.steps_done = max(int(s.scalars.get("step", 0)) for s in sources)

    def memory(self) -> dict[str, int]:
        """Model-state bytes by kind (ZeRO-2: its full parameters) and the activation peak."""
        return {**self.model_state_bytes(), "activations_peak": int(self.activation_peak_bytes)}

    # -- evidence ------------------------------------------------------------------------
    def full_params(self) -> dict[str, Any]:
        """The whole model under its serial names, serial order, on every rank (a report:
        the pickled all-gather on the world's own communicator is not counted)."""
        from minipar.parallel.tensor_parallel.layers import unshard_params

        flat = self.states.params
        if self.zero == 2:
            flat = self.full_buf
        elif self.zero == 3:  # the shards of my stage, in order (pickled, not counted)
            flat = np.concatenate(self.shard_comm.comm.allgather(np.asarray(flat)))
        mine = {k: np.asarray(v) for k, v in self.stage_layout.unflatten(flat).items()}
        everyone = self.world.comm.allgather((self.grid.coord("dp"), self.grid.coord("cp"),
                                              self.grid.coord("tp"), mine))
        shards: list[dict[str, Any]] = [{} for _ in range(self.t)]
        for _, _, t, part in sorted(everyone, key=lambda e: (e[0], e[1], e[2])):
            for k, v in part.items():
                shards[t].setdefault(k, v)
        full = unshard_params(shards, self.cfg)
        dtype = self.states.params.dtype
        return {n: np.asarray(full[n], dtype=dtype) for n in self.model.param_shapes()}

    def rows(self) -> list[int]:
        """b_i: rows of each of my replica's micro-batches."""
        return micro_rows(self.spec, self.dp, self.replica, self.m)

    def bytes_formula(self) -> dict[str, int]:
        """Exact bytes per step this rank sends on each axis (dense GPT; module
        :mod:`minipar.parallel.hybrid.measure`)."""
        from minipar.parallel.pipeline.schedule import RecvAct, RecvGrad, SendAct, SendGrad

        blocks = sum(u.name.startswith("block") for units in self.chunk_units for u in units)
        sends, recvs = ((sum(isinstance(i, k) for i in self.instructions) // self.m
                         if self.p > 1 else 0) for k in ((SendAct, SendGrad), (RecvAct, RecvGrad)))
        return bytes_formula(self.spec, self.grid.layout, {a: self.grid.coord(a) for a in
                             ("dp", "pp", "cp", "tp")}, self.m, blocks, sends,
                             self.stage_layout.size, self.states.params.itemsize, self.zero,
                             self.cp_kind, recvs if self.scatter_gather else 0, self.sp,
                             self.recomputed_blocks(), self.unit_spans())


def tp_placement(name: str, shape: tuple[int, ...], t: int, r: int) -> Shard:
    """Where tp rank ``r`` of ``t``'s shard of the serial tensor ``name`` (global ``shape``)
    sits in it (:func:`minipar.parallel.tensor_parallel.layers.kind_of`): rows (the
    embedding's vocabulary rows, ``w_out``) one block of axis 0; columns one block of the
    last axis; ``w_qkv``/``b_qkv`` three pieces, the rank's columns of q, of k and of v;
    a replicated tensor (t = 1: every tensor) whole."""
    from minipar.parallel.tensor_parallel.layers import kind_of

    kind = "replicated" if t == 1 else kind_of(name)
    if kind == "replicated":
        return whole(name, shape)
    full = tuple(slice(0, n) for n in shape)
    if kind == "rows":
        k = shape[0] // t
        pieces = (Piece((slice(0, k), *full[1:]), (slice(r * k, (r + 1) * k), *full[1:])),)
    elif kind == "columns":
        k = shape[-1] // t
        pieces = (Piece((*full[:-1], slice(0, k)), (*full[:-1], slice(r * k, (r + 1) * k))),)
    else:  # qkv: the last axis is [q | k | v], each cut in t column blocks
        d = shape[-1] // 3
        k = d // t
        pieces = tuple(Piece((*full[:-1], slice(j * k, (j + 1) * k)),
                             (*full[:-1], slice(j * d + r * k, j * d + (r + 1) * k)))
                       for j in range(3))
    return Shard(name, tuple(shape), pieces)


def build(spec: Any, grid: Any, **options: Any) -> HybridParallel:
    """The hybrid engine of ``spec`` on ``grid`` (:mod:`minipar.parallel.strategies`' row
    "hybrid"): ``options`` are :data:`OPTIONS`; an unknown one is a ValueError."""
    unknown = sorted(set(options) - set(OPTIONS))
    if unknown:
        raise ValueError(f"the hybrid engine takes no option {', '.join(unknown)}; "
                         f"its options: {', '.join(OPTIONS)}")
    if grid is None:
        raise ValueError("the hybrid engine needs a grid (minipar.comm.topology.Grid)")
    return HybridParallel(grid, spec, **options)
