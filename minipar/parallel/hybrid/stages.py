"""The hybrid's stage model: tensor-, context- or expert-parallel units in a pipeline stage —
модель стадии гибрида — 混合并行的阶段模型.

EN 3D parallelism (stage model) · RU трёхмерный параллелизм: модель стадии ·
ZH 3D 并行（阶段模型）

What one rank of a dp × pp × cp × tp (× ep) grid runs inside its pipeline stage
(Narayanan et al. 2021, PTD-P, arXiv 2104.04473), handed to the pipeline engine as its
stage model (:mod:`minipar.parallel.pipeline.parts`):

* **units** (:func:`grid_units`): tensor-parallel ones over ``tp`` (Megatron's f/g,
  :func:`~minipar.parallel.tensor_parallel.model.tp_gpt_units`; with sequence
  parallelism, Korthikanti et al. 2022, arXiv 2205.05198); context-parallel ones over
  ``cp`` (ring attention or Ulysses, :func:`~minipar.parallel.context_parallel.model.cp_units`);
  both (Megatron's CP × TP: the TP block whose attention core over the local n_head/t
  heads is the CP core); expert-parallel MoE blocks over ``ep``
  (:func:`~minipar.parallel.expert_parallel.model.ep_units`); else the serial GPT's;
* **parameters**: my tp rank's shard of each tensor of my stage, the experts after the
  dense tensors (so each gradient all-reduce is one span), and where each sits in the
  serial tensor (:func:`tp_placement`: rows, columns, or ``w_qkv``'s three column groups);
* **the batch**: my replica's rows, at my cp rank's positions; a micro-batch's loss
  weight w_i·s_c/s (s_c of the s positions: ``loss_weight``); the loss the
  vocabulary-parallel cross-entropy with tp > 1, reported once per tensor group
  (``reports_loss``); which copy of a tensor I hold (:meth:`HybridStage.replica`) —
  the values the hybrid hands the pipeline engine beside the stage model.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import numpy as np

from minipar.backend import to_device, to_host, xp
from minipar.nn.loss import cross_entropy_backward, cross_entropy_forward
from minipar.parallel.engine import Shard, whole
from minipar.parallel.pipeline.parts import replica_rows

__all__ = ["HybridStage", "grid_units", "tp_placement"]


def grid_units(cfg: Any, grid: Any, model: Any, sequence_parallel: bool, cp_kind: str,
               cp_layout: Any, tokens: int) -> tuple[Any, ...]:
    """The whole model's units for this rank of ``grid`` (to be cut into stages): TP × CP,
    TP (``sequence_parallel``), CP (``cp_kind``, ``cp_layout``), EP (``tokens`` routed per
    forward call), or ``model``'s own."""
    t, cp, ep = grid.size("tp"), grid.size("cp"), grid.size("ep")
    if t > 1 and cp > 1:  # the TP block's attention core: the CP core
        from minipar.parallel.context_parallel.model import CPAttention
        from minipar.parallel.tensor_parallel.model import tp_gpt_units

        core = CPAttention(grid.comm("cp"), cp_kind, cp_layout, cfg.n_head // t,
                           max(cfg.n_kv_head // t, 1))  # my tensor slice's heads
        return tp_gpt_units(cfg, grid.comm("tp"), core=core,
                            positions=cp_layout.positions(grid.coord("cp")))
    if t > 1:
        from minipar.parallel.tensor_parallel.model import tp_gpt_units

        return tp_gpt_units(cfg, grid.comm("tp"), sequence_parallel)
    if cp > 1:
        from minipar.parallel.context_parallel.model import cp_units

        return cp_units(cfg, grid.comm("cp"), cp_kind, cp_layout)
    if ep > 1:
        from minipar.parallel.expert_parallel.layout import capacities
        from minipar.parallel.expert_parallel.model import ep_units

        caps = capacities(cfg.n_experts, cfg.capacity_factor, [tokens] * ep, cfg.top_k)
        return ep_units(cfg, grid.comm("ep"), caps, tokens)
    return model.units()


class HybridStage:
    """The stage model of this rank of ``grid`` for ``spec``'s GPT, ``micro_batches`` m a
    step (EP's capacities), ``cp_kind`` "ring", "allgather" (zigzag), "ulysses" or "usp"
    (``cp_ulysses``), ``sequence_parallel`` (with tp > 1), ``tp_overlap`` (with tp > 1:
    the layers of :mod:`minipar.parallel.tensor_parallel.overlap`)."""

    axes = ("dp", "pp", "cp", "tp", "ep")  #: the grid axes it handles

    def __init__(self, grid: Any, spec: Any, micro_batches: int, cp_kind: str = "ring",
                 sequence_parallel: bool = False, cp_ulysses: int = 0,
                 tp_overlap: bool = False) -> None:
        lay = grid.layout
        self.tp_overlap = bool(tp_overlap)  # the TP layers overlapped with their GEMMs
        self.grid, self.spec, self.m, self.cp_kind = grid, spec, micro_batches, cp_kind
        self.cp_ulysses = cp_ulysses
        self.t, self.cp, self.ep = lay.tp, lay.cp, lay.ep
        self.sp = bool(sequence_parallel) and self.t > 1
        self.cfg, self.model = spec.config(), spec.model()
        self.positions = np.arange(spec.seq)  # my positions of each sequence
        self.cp_layout = None
        if self.cp > 1:
            from minipar.parallel.context_parallel.options import sharding

            self.cp_layout = sharding(spec.seq, self.cp, cp_kind, cp_kind != "ulysses",
                                      cp_ulysses or None)
            self.positions = self.cp_layout.positions(grid.coord("cp"))
            self._columns = to_device(self.positions)  # indexes the batch: moved once
        #: each micro-batch's loss weight is w_i·s_c/s (the pipeline engine's ``loss_weight``)
        self.loss_weight = len(self.positions) / spec.seq
        #: the tp ranks of a group compute the same loss: the first one reports it
        self.reports_loss = grid.coord("tp") == 0

    def units(self) -> Any:
        """The whole model's units (:func:`grid_units`)."""
        tokens = self.spec.batch // (self.grid.size("dp") * self.m) * self.spec.seq
        units = grid_units(self.cfg, self.grid, self.model, self.sp, self.cp_kind,
                           self.cp_layout, tokens)
        if self.tp_overlap:  # --tp-overlap: the async forms of the TP layers
            from minipar.parallel.tensor_parallel.engine import overlap_layers

            overlap_layers(units)
        return units

    def params(self, names: list[str]) -> dict[str, Any]:
        """My tp rank's shard of the initial tensors ``names``; with ep, the experts' after
        the dense ones (their gradients then one span each)."""
        full = self.spec.initial_params()
        if self.t > 1:
            from minipar.parallel.tensor_parallel.shards import shard_params

            full = shard_params(full, self.cfg, self.t, self.grid.coord("tp"))
        if self.ep > 1:
            from minipar.parallel.expert_parallel.engine import dense_then_experts

            dense, experts = dense_then_experts(names)
            names = dense + experts
        return {n: full[n] for n in names}

    def local_batch(self, batch: Any) -> tuple[Any, Any]:
        """My replica's rows of the global batch, at my cp rank's positions."""
        x, y = replica_rows(batch, self.grid.coord("dp"), self.grid.size("dp"))
        return (x[:, self._columns], y[:, self._columns]) if self.cp > 1 else (x, y)

    def loss_forward(self, logits: Any, targets: Any) -> tuple[float, Any]:
        if self.t == 1:
            return cross_entropy_forward(logits, targets)
        from minipar.parallel.tensor_parallel.layers import vocab_parallel_cross_entropy_forward

        return vocab_parallel_cross_entropy_forward(self.grid.comm("tp"), logits, targets)

    def loss_backward(self, saved: Any, scale: float) -> Any:
        if self.t == 1:
            return cross_entropy_backward(saved, scale)
        from minipar.parallel.tensor_parallel.layers import vocab_parallel_cross_entropy_backward

        return vocab_parallel_cross_entropy_backward(saved, scale)

    def placements(self, names: Iterable[str]) -> dict[str, Shard]:
        """Where each tensor of my stage sits in the serial one (:func:`tp_placement`)."""
        shapes, r = self.model.param_shapes(), self.grid.coord("tp")
        heads = (self.cfg.n_head, self.cfg.n_kv_head)
        return {n: tp_placement(n, shapes[n], self.t, r, heads) for n in names}

    def replica(self, name: str, ranged: bool) -> int:
        """My copy's index among the ranks holding the same piece of ``name``: the
        dp·cp ranks (e = d·cp + c; ``ranged``: ZeRO's range, each of them holds its own, so
        none), times the tp ranks for a tensor every tp rank holds whole; an expert under
        ep: its edp coordinate (the ranks holding the same experts)."""
        from minipar.parallel.expert_parallel.engine import is_expert
        from minipar.parallel.tensor_parallel.shards import kind_of

        g = self.grid
        tp = g.coord("tp") if self.t == 1 or kind_of(name) == "replicated" else 0
        if self.ep > 1 and is_expert(name):
            return g.coord("edp") * self.t + tp
        e = 0 if ranged else g.coord("dp") * self.cp + g.coord("cp")
        return e * self.t + tp

    def gather(self, world: Any, mine: dict[str, Any]) -> dict[str, Any]:
        """The whole model from every rank's ``mine`` (its tensor shard of its stage, whole
        tensors), serial names and order, on every rank (a report: the pickled all-gather
        on the world's own communicator is not counted); the dtype of ``mine``'s."""
        from minipar.parallel.tensor_parallel.shards import unshard_params

        mine = {k: to_host(v) for k, v in mine.items()}
        dtype = next(iter(mine.values())).dtype
        g = self.grid
        everyone = world.comm.allgather((g.coord("dp"), g.coord("cp"), g.coord("tp"), mine))
        shards: list[dict[str, Any]] = [{} for _ in range(self.t)]
        for _, _, t, part in sorted(everyone, key=lambda e: (e[0], e[1], e[2])):
            for k, v in part.items():
                if k not in shards[t]:
                    shards[t][k] = to_device(v)
        full = unshard_params(shards, self.cfg)
        return {n: xp.asarray(full[n], dtype=dtype) for n in self.model.param_shapes()}


def tp_placement(name: str, shape: tuple[int, ...], t: int, r: int,
                 heads: tuple[int, int] | None = None) -> Shard:
    """Where tp rank ``r`` of ``t``'s shard of the serial tensor ``name`` (global ``shape``)
    sits in it: tensor parallelism's own rule
    (:func:`minipar.parallel.tensor_parallel.shards.placement`), or the whole tensor when
    t = 1 (one piece, even for ``w_qkv``); ``heads`` = (H, K) for ``w_qkv``'s columns."""
    from minipar.parallel.tensor_parallel.shards import placement

    return whole(name, shape) if t == 1 else placement(name, tuple(shape), t, r, heads)
