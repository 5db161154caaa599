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
    carved out of the data-parallel ones, :class:`~minipar.parallel.expert_layer.EPMoE`);
* between stages (the executor's wire hooks, :mod:`minipar.parallel.pipeline.p2p`),
  with tp > 1, PTD-P's scatter/gather (§4.1): the t ranks of a tensor
  group hold the same activation, so each sends 1/t of it and the next stage's group
  all-gathers the pieces (``scatter_gather=False``: every rank sends all of it);
* after the flush the stage's gradients (its tensor shard's, under their serial names)
  are summed over the ranks that hold the same shard: the dp·cp ranks (one ring
  all-reduce on ``dp``, or on ``edp`` = dp·cp when cp > 1), dense and expert gradients
  apart with ep (``dp`` and ``edp``); or ZeRO (Rajbhandari et al. 2019, arXiv
  1910.02054) over those N = dp·cp ranks, on the stage's Ψ_p parameters (its tensor shard)
  (:mod:`minipar.parallel.hybrid_zero`: ZeRO-1, 2 and 3 inside a pipeline).

Micro-batch i of replica d carries the weight w_i = b_i/B (times s_c/s under cp), so
Σ_d Σ_i w_i ∇ℓ_i is the serial gradient; AdamW is element-wise, so every rank stepping
its shard of its stage is the serial step: float64 parity with the serial GPT
(tests/test_hybrid.py).  Bytes per axis: :mod:`minipar.parallel.hybrid_config`.
"""

from __future__ import annotations

from typing import Any

import numpy as np
from mpi4py import MPI

from minipar.collectives import all_gather, allreduce, reduce_scatter
from minipar.nn.gpt import BlockUnit, EmbedUnit, HeadUnit
from minipar.optim import FlatParams
from minipar.parallel.hybrid_config import bytes_formula, check_hybrid, micro_rows
from minipar.parallel.hybrid_zero import HybridZero
from minipar.parallel.pipeline.engine import PipelineParallel

__all__ = ["HybridParallel"]

OP_GRADS, OP_EXPERT_GRADS = "hybrid_grad_allreduce", "hybrid_expert_allreduce"
OP_ZERO_RS, OP_ZERO_AG = "hybrid_zero_reduce_scatter", "hybrid_zero_all_gather"
OP_GATHER = "pp_tp_gather"


class HybridParallel(HybridZero, PipelineParallel):
    """This rank's part of a dp × pp × cp × tp (× ep) run of ``spec``'s GPT on ``grid``.

    The pipeline arguments are :class:`PipelineParallel`'s; ``zero``: 0 (all-reduce) or
    1-3 (ZeRO over the dp·cp ranks); ``cp_kind``: "ring" (zigzag) or "ulysses";
    ``scatter_gather`` (PTD-P §4.1, tp > 1) and ``sequence_parallel`` (tp > 1).  Bad sizes
    raise ``ValueError`` on every rank before any message (:func:`check_hybrid`).
    ``train()``, ``train_step(step)`` -> the global loss; ``full_params()`` -> the whole
    model, flat, serial order (every rank); ``bytes_formula()`` / ``model_state_bytes()``.
    """

    AXES = ("dp", "pp", "cp", "tp")

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

    def local_batch(self, step: int) -> tuple[Any, Any]:
        x, y = super().local_batch(step)
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

    def step_stage(self) -> None:
        """Sum the stage's gradients over the ranks holding the same shard, then step."""
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
        st.step(found_inf=found_inf)
        if self.zero in (1, 2):
            full = st.params if self.zero == 1 else self.full_buf
            with comm.operation(OP_ZERO_AG):
                full[...] = all_gather(comm, st.params[st.lo:st.hi])

    # -- evidence ------------------------------------------------------------------------
    def full_params(self) -> Any:
        """The whole model, flat in the serial order, on every rank (a report: the pickled
        all-gather on the world's own communicator is not counted)."""
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
        layout = FlatParams.from_shapes(self.model.param_shapes())
        return layout.flatten({n: full[n] for n in layout.names}, self.states.params.dtype)

    def rows(self) -> list[int]:
        """b_i: rows of each of my replica's micro-batches."""
        return micro_rows(self.spec, self.dp, self.replica, self.m)

    def bytes_formula(self) -> dict[str, int]:
        """Exact bytes per step this rank sends on each axis (dense GPT; module
        :mod:`minipar.parallel.hybrid_config`)."""
        from minipar.parallel.pipeline.schedule import RecvAct, RecvGrad, SendAct, SendGrad

        blocks = sum(u.name.startswith("block") for units in self.chunk_units for u in units)
        sends, recvs = ((sum(isinstance(i, k) for i in self.instructions) // self.m
                         if self.p > 1 else 0) for k in ((SendAct, SendGrad), (RecvAct, RecvGrad)))
        return bytes_formula(self.spec, self.grid.layout, {a: self.grid.coord(a) for a in
                             ("dp", "pp", "cp", "tp")}, self.m, blocks, sends,
                             self.stage_layout.size, self.states.params.itemsize, self.zero,
                             self.cp_kind, recvs if self.scatter_gather else 0, self.sp,
                             self.recomputed_blocks(), self.unit_spans())
