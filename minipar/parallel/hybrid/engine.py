"""Hybrid (3D/4D) parallelism: one training step over the whole grid — гибридный
параллелизм — 混合并行.

EN 3D parallelism (hybrid parallelism, PTD-P) · RU трёхмерный (гибридный) параллелизм ·
ZH 3D 并行（混合并行）

Narayanan et al. 2021, "Efficient Large-Scale Language Model Training on GPU
Clusters Using Megatron-LM" (PTD-P), arXiv 2104.04473, §3: n = p·t·d ranks.
The grid (:class:`minipar.comm.topology.Grid`, axes dp × pp × cp × tp, tp
innermost) gives every rank one tensor-parallel shard of one pipeline stage of
one context slice of one data-parallel replica.  The engine is the pipeline engine
(:class:`~minipar.parallel.pipeline.engine.PipelineParallel`, GPipe / 1F1B / interleaved /
zero bubble, remat and offload: the same stage loop, :mod:`minipar.parallel.pipeline.stage_loop`)
**given** three parts that :func:`build` makes from the grid and the options, and three
values (each micro-batch's loss weight, whether this rank reports the loss, which copy of
a tensor it holds) — composition, none of their code repeated here:

* its stage model (:class:`~minipar.parallel.hybrid.stages.HybridStage`): the units are
  not the serial ones but
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
* its wire (:mod:`minipar.parallel.hybrid.wire`): with tp > 1, PTD-P's scatter/gather
  (§4.1): the t ranks of a tensor group hold the same activation, so each sends 1/t of
  it and the next stage's group all-gathers the pieces (``scatter_gather=False``: every
  rank sends all of it); under sequence parallelism the sequence shard;
* its gradient sync (:mod:`minipar.parallel.hybrid.sync`): after the flush the stage's
  gradients (its tensor shard's, under their serial names) are summed over the ranks
  that hold the same shard: the dp·cp ranks (one ring all-reduce on ``dp``, or on
  ``edp`` = dp·cp when cp > 1), dense and expert gradients apart with ep (``dp`` and
  ``edp``); or ZeRO (Rajbhandari et al. 2019, arXiv 1910.02054) over those N = dp·cp
  ranks, on the stage's Ψ_p parameters (its tensor shard): ZeRO-1, 2 and 3 inside a
  pipeline.

Micro-batch i of replica d carries the weight w_i = b_i/B (times s_c/s under cp), so
Σ_d Σ_i w_i ∇ℓ_i is the serial gradient; AdamW is element-wise, so every rank stepping
its shard of its stage is the serial step: float64 parity with the serial GPT
(tests/test_hybrid.py).  Bytes per axis: :mod:`minipar.parallel.hybrid.measure`.

**The engine interface** (``strategies.build("hybrid", spec, grid, **options)``): the
pipeline engine's, its parts deciding what the state holds: every tensor of my stage
under its serial name and global shape, a tensor-parallel shard as its column or row
groups (``w_qkv``: three pieces), ZeRO's range per tensor; replica = the index of my copy
among the ranks that hold the same piece (dp·cp, and tp for a tensor every tp rank holds
whole; an expert: its edp coordinate).  The exact bytes per axis of a built engine:
:func:`minipar.parallel.hybrid.measure.engine_bytes`.
"""

from __future__ import annotations

from typing import Any

from minipar import checks
from minipar.parallel.common import fp8_rows
from minipar.parallel.hybrid.layout import check_hybrid
from minipar.parallel.hybrid.stages import HybridStage
from minipar.parallel.hybrid.sync import OP_GRADS, ZeroSync, expert_reduce
from minipar.parallel.hybrid.wire import ScatterGather, SequenceShard
from minipar.parallel.pipeline.engine import OPTIONS as PIPELINE_OPTIONS
from minipar.parallel.pipeline.engine import PipelineParallel
from minipar.parallel.pipeline.p2p import Whole
from minipar.parallel.pipeline.parts import AllReduceSync, all_reduce

__all__ = ["OPTIONS", "HybridEngine", "build"]

#: the keyword options of :func:`build`: the pipeline's (but a learner's instruction list)
#: and the hybrid's own
OPTIONS = tuple(o for o in PIPELINE_OPTIONS if o != "instructions") + (
    "zero", "cp_kind", "cp_ulysses", "scatter_gather", "sequence_parallel", "tp_overlap",
    "prefetch", "reshard_after_forward", "zeropp", "zeropp_block")


class HybridEngine(PipelineParallel):
    """The pipeline engine given the hybrid's parts; ``rows_comm``: the dp·cp ranks whose
    per-tensor FP8 amax is all-reduced (:func:`~minipar.parallel.common.fp8_rows`) when the
    step is one pass over the whole batch (pp 1, one micro-batch), else None: per-tensor
    current scaling would need every micro-batch's amax before the first GEMM."""

    rows_comm: Any = None

    def step(self, batch: Any) -> Any:
        with fp8_rows(self.spec, self.rows_comm):
            return super().step(batch)

    def evaluate(self, batch: Any) -> float:
        with fp8_rows(self.spec, self.rows_comm):
            return super().evaluate(batch)


def build(spec: Any, grid: Any, **options: Any) -> PipelineParallel:
    """The hybrid engine of ``spec`` on ``grid`` (:mod:`minipar.parallel.strategies`' row
    "hybrid"): ``options`` are :data:`OPTIONS`; an unknown one is a ValueError.

    The pipeline options are :class:`PipelineParallel`'s; ``zero``: 0 (all-reduce) or
    1-3 (ZeRO over the dp·cp ranks); ``cp_kind``: "ring", "allgather" (zigzag), "ulysses"
    or "usp" (``cp_ulysses`` U Ulysses ranks × cp/U ring groups);
    ``scatter_gather`` (PTD-P §4.1, tp > 1) and ``sequence_parallel`` (tp > 1);
    ``tp_overlap`` (tp > 1), ``prefetch`` K and ``reshard_after_forward`` (zero 3:
    :class:`~minipar.parallel.hybrid.sync.ZeroSync`); ``zeropp`` (zero 3: ZeRO++'s parts,
    :class:`~minipar.parallel.zero.zeropp.ZeroPPHooks` over the dp·cp ranks in the nodes
    of the grid's hosts) with its ``zeropp_block``.  Bad sizes
    raise ``ValueError`` on every rank before any message (:func:`check_hybrid`)."""
    checks.known("the hybrid engine", options, OPTIONS)
    if grid is None:
        raise ValueError("the hybrid engine needs a grid (minipar.comm.topology.Grid)")
    return _compose(grid, spec, **options)


def _compose(grid: Any, spec: Any, schedule: str = "1f1b", micro_batches: int = 1,
             chunks: int = 1, balance: Any = None, remat: Any = None,
             offload: str | None = None, offload_dir: str | None = None, zero: int = 0,
             cp_kind: str = "ring", scatter_gather: bool = True,
             sequence_parallel: bool = False, cp_ulysses: int = 0,
             tp_overlap: bool = False, prefetch: int = 0,
             reshard_after_forward: bool = True, zeropp: Any = (),
             zeropp_block: int = 256) -> PipelineParallel:
    """The checks, the three parts, the pipeline engine given them."""
    lay = grid.layout
    check_hybrid(grid.world.size, spec, lay.dp, lay.pp, lay.tp, lay.cp, lay.ep, zero,
                 schedule, micro_batches, chunks, balance, remat, cp_kind, sequence_parallel,
                 cp_ulysses)
    if tp_overlap and lay.tp == 1:
        raise ValueError("tp_overlap needs tensor parallelism: tp = 1 here; give tp >= 2")
    checks.integer("prefetch", prefetch, 0, None)
    if (prefetch or not reshard_after_forward) and zero != 3:
        raise ValueError(f"prefetch and reshard_after_forward are ZeRO-3's (parameters "
                         f"gathered unit by unit); got zero {zero}: use zero=3")
    from minipar.parallel.zero.engine import check_zeropp, node_comms

    zeropp = check_zeropp(zeropp, zero, zeropp_block, reshard_after_forward)
    stage = HybridStage(grid, spec, micro_batches, cp_kind, sequence_parallel, cp_ulysses,
                        tp_overlap)
    wire: Any = Whole()
    if stage.sp:
        wire = SequenceShard(lay.tp)
    elif scatter_gather and lay.tp > 1:
        wire = ScatterGather(grid.comm("tp"), lay.tp, grid.coord("tp"))
    # the ranks that hold the same shard of the same stage: dp·cp of them
    shard_comm = grid.comm("dp" if lay.cp == 1 else "edp")
    if zero:
        extra: dict[str, Any] = {}
        if zeropp:  # ZeRO++ over the shard group, its nodes from the grid's hosts
            node, cross = node_comms(grid, shard_comm, "dp" if lay.cp == 1 else "edp")
            extra = {"parts": zeropp, "block": int(zeropp_block), "node": node,
                     "cross": cross}
        sync: Any = ZeroSync(zero, shard_comm, grid.world, prefetch,
                             bool(reshard_after_forward), extra)
    elif lay.ep > 1:  # dense over dp, experts over their replicas (edp)
        sync = AllReduceSync(grid.world, expert_reduce(grid))
    else:
        sync = AllReduceSync(grid.world, all_reduce(shard_comm, OP_GRADS, "ring"))
    def replica_of(kind: str, name: str) -> int:  # ZeRO: each rank of dp·cp its own range
        return stage.replica(name, isinstance(sync, ZeroSync) and sync.ranged(kind))

    engine = HybridEngine(grid, spec, schedule, micro_batches, chunks, balance, remat,
                          offload, offload_dir, stage_model=stage, wire=wire, sync=sync,
                          loss_weight=stage.loss_weight, reports_loss=stage.reports_loss,
                          replica_of=replica_of)
    if lay.pp == 1 and micro_batches == 1:  # per-tensor FP8: the whole batch in one pass
        engine.rows_comm = shard_comm
    return engine
