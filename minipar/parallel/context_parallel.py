"""Context parallelism — контекстный параллелизм — 上下文并行.

EN context parallelism (CP) · RU контекстный параллелизм · ZH 上下文并行

The whole sequence — every layer's activations, attention included — is cut
over the P ranks of the grid's ``cp`` axis (:class:`minipar.comm.topology.Grid`),
for contexts too long for one device.  Everything in a GPT but attention
works token by token, so on a sequence shard it runs unchanged (embedding,
LayerNorms, projections, MLP, head, the loss); attention needs the other
ranks' keys and values, by one of two routes:

* **DeepSpeed-Ulysses** (Jacobs et al. 2023, arXiv 2309.14509;
  :mod:`minipar.parallel.ulysses`): all-to-all from sequence-sharded to
  head-sharded, full-sequence attention of H/P heads, all-to-all back.
  4·b·s·d·(P−1)/P² elements per rank per layer each way (paper: 4Nh/P per
  link); attention activations 1/P of the serial layer's, s² term included.
* **Ring attention** (Liu et al. 2023, arXiv 2310.01889;
  :mod:`minipar.parallel.ring_attention`): K/V blocks travel around the ring,
  each rank folds them into its queries' output with the online softmax
  (:mod:`minipar.nn.blockwise_attention`); zigzag chunks balance causal work.
  2(P−1)·b·s·d/P elements per rank per layer forward; attention activations
  (4·b·s·d + b·H·s)/P: no s² term at all.

**The loss over shards.**  Rank r holds t_r = s/P of every row's tokens.
Its mean cross-entropy ℓ_r over its b·t_r tokens, weighted by w_r = t_r / s,
sums over ranks to the serial mean:  ℓ = Σ_r w_r·ℓ_r  (an all-reduce of one
number).  Gradients: each rank's backward gives the gradient of w_r·ℓ_r with
respect to every (replicated) parameter — through its own tokens and, via the
attention exchange's backward, through the keys and values it lent the others —
so the full gradient is their sum: one all-reduce over ``cp`` (the ring,
2(P−1)/P·Ψ elements per rank), then every rank takes the same AdamW step.
The embedding looks up each rank's own positions in ``pos_emb``.

The CP GPT is the serial model's units with the attention core swapped
(:func:`cp_units`): :class:`minipar.nn.executor` walks them unchanged.
Parity with the serial GPT (float64: outputs, loss, gradients, AdamW steps)
is tested for both kinds on 2 and 4 ranks (tests/test_context_parallel.py);
the measurements and the formulas they are checked against are in
:mod:`minipar.parallel.cp_measure`.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from minipar.backend import xp
from minipar.collectives import allreduce
from minipar.comm.topology import Grid
from minipar.comm.traced import traced
from minipar.nn import executor
from minipar.nn._dtype import up
from minipar.nn.attention import merge_heads, split_heads
from minipar.nn.gpt import block_backward, block_forward
from minipar.nn.gpt_config import GPTConfig
from minipar.nn.layers import (
    bias_backward,
    bias_forward,
    embedding_backward,
    embedding_forward,
    linear_backward,
    linear_forward,
)
from minipar.nn.units import BlockUnit, HeadUnit, Unit
from minipar.parallel import ulysses
from minipar.parallel.common import RunSpec
from minipar.parallel.cp_layout import KINDS, Sharding, check, sharding
from minipar.parallel.ring_attention import ring_attention_backward, ring_attention_forward
from minipar.precision import ModelStates
from minipar.precision import get as get_policy

__all__ = ["KINDS", "OP_GRADS", "OP_LOSS", "CPAttention", "ContextParallel", "check", "cp_units",
           "sharding"]

OP_GRADS, OP_LOSS = "cp_grad_allreduce", "cp_loss_allreduce"


class CPAttention:
    """The attention core over a sequence shard: fused ``qkv`` (b, t, 3d) in, o (b, t, d) out."""

    def __init__(self, comm: Any, kind: str, layout: Sharding, n_head: int) -> None:
        self.comm, self.kind, self.layout, self.n_head = comm, kind, layout, n_head

    def forward(self, qkv: Any) -> tuple[Any, Any]:
        if self.kind == "ulysses":
            return ulysses.ulysses_attention_forward(self.comm, qkv, self.n_head)
        q, k, v = (split_heads(a, self.n_head) for a in xp.split(qkv, 3, axis=-1))
        o, saved = ring_attention_forward(self.comm, q, k, v, self.layout)
        o = merge_heads(o)
        return o, (*saved[:3], split_heads(o, self.n_head), *saved[4:])  # o saved as a view

    def backward(self, saved: Any, do: Any) -> Any:
        if self.kind == "ulysses":
            return ulysses.ulysses_attention_backward(self.comm, saved, do)
        dq, dk, dv = ring_attention_backward(self.comm, saved, split_heads(do, self.n_head))
        return xp.concatenate([merge_heads(dq), merge_heads(dk), merge_heads(dv)], axis=-1)


def attention_forward(p: dict[str, Any], x: Any, core: CPAttention) -> tuple[Any, tuple]:
    """:func:`minipar.nn.attention.attention_forward` on a shard, with the CP core."""
    qkv, s_qkv = linear_forward(x, p["w_qkv"])
    qkv = bias_forward(qkv, p["b_qkv"])
    o, s_core = core.forward(qkv)
    y, s_out = linear_forward(o, p["w_out"])
    return bias_forward(y, p["b_out"]), (s_qkv, s_core, s_out)


def attention_backward(p: dict[str, Any], saved: tuple, dy: Any,
                       core: CPAttention) -> tuple[Any, dict[str, Any]]:
    s_qkv, s_core, s_out = saved
    db_out = bias_backward(dy)
    do, dw_out = linear_backward(p["w_out"], s_out, dy)
    dqkv = core.backward(s_core, do)
    db_qkv = bias_backward(dqkv)
    dx, dw_qkv = linear_backward(p["w_qkv"], s_qkv, dqkv)
    return dx, {"w_qkv": dw_qkv, "b_qkv": db_qkv, "w_out": dw_out, "b_out": db_out}


class CPEmbedUnit(Unit):
    """x = tok_emb[tokens] + pos_emb[my positions] (zigzag positions are not contiguous)."""

    def __init__(self, cfg: GPTConfig, positions: np.ndarray) -> None:
        self.cfg, self.name, self.names = cfg, "embed", ("tok_emb", "pos_emb")
        self.positions = positions

    def forward(self, p: dict[str, Any], tokens: Any) -> tuple[Any, Any]:
        self.cfg.check_tokens(tokens)
        if tokens.shape[1] != len(self.positions):
            raise ValueError(f"this rank holds {len(self.positions)} positions, got "
                             f"{tokens.shape[1]} tokens per row")
        x, s_tok = embedding_forward(p["tok_emb"], tokens)
        x += p["pos_emb"][self.positions]
        return x, (s_tok, p["pos_emb"].shape)

    def backward(self, p: dict[str, Any], saved: Any, dx: Any,
                 daux: float = 1.0) -> tuple[None, dict[str, Any]]:
        s_tok, shape = saved
        dpos = xp.zeros(shape, dtype=dx.dtype)
        dpos[self.positions] = up(dx).sum(axis=0)  # positions are distinct: no add.at needed
        return None, {"tok_emb": embedding_backward(s_tok, dx), "pos_emb": dpos}


class CPBlockUnit(BlockUnit):
    """Block i on a shard: the serial block walk (:func:`minipar.nn.gpt.block_forward`:
    LayerNorms, MLP and residuals per token) with attention through ``core``."""

    def __init__(self, cfg: GPTConfig, i: int, core: CPAttention) -> None:
        super().__init__(cfg, i)
        self.core = core
        self.attn = (lambda q, a: attention_forward(q, a, core),
                     lambda q, saved, dy: attention_backward(q, saved, dy, core))

    def forward(self, p: dict[str, Any], x: Any) -> tuple[Any, Any]:
        return block_forward(p, x, self.cfg, attn=self.attn)

    def backward(self, p: dict[str, Any], saved: Any, dy: Any,
                 daux: float = 1.0) -> tuple[Any, dict[str, Any]]:
        return block_backward(p, saved, dy, daux, attn=self.attn)


def cp_units(cfg: GPTConfig, comm: Any, kind: str, layout: Sharding) -> tuple[Unit, ...]:
    """embed, block 0 … L-1, head of the CP GPT for this rank (of ``comm``, the cp group)."""
    core = CPAttention(comm, kind, layout, cfg.n_head)
    rank = traced(comm).rank
    return (CPEmbedUnit(cfg, layout.positions(rank)),
            *(CPBlockUnit(cfg, i, core) for i in range(cfg.n_layer)), HeadUnit(cfg))


class ContextParallel:
    """One rank of a context-parallel run of ``spec``'s GPT over all of ``comm``'s ranks.

    ``kind``: "ulysses" or "ring"; ``zigzag`` (ring only; default on for the ring).
    Bad sizes raise ValueError on every rank before any message."""

    def __init__(self, comm: Any, spec: RunSpec, kind: str = "ring",
                 zigzag: bool | None = None) -> None:
        zigzag = (kind == "ring") if zigzag is None else bool(zigzag)
        P = comm.Get_size()
        check(spec.seq, spec.heads, P, kind, zigzag, spec.experts)  # before Grid's Split
        self.spec, self.kind, self.zigzag = spec, kind, zigzag
        self.grid = Grid(comm, cp=P)
        self.comm = self.grid.comm("cp")
        self.rank, self.world = self.comm.rank, P
        self.layout = sharding(spec.seq, P, kind, zigzag)
        self.positions = self.layout.positions(self.rank)
        self.cfg = spec.config()
        self.units = cp_units(self.cfg, self.comm, kind, self.layout)
        self.states = ModelStates(get_policy(spec.precision), spec.initial_params(),
                                  spec.optimizer, **spec.opt_kwargs())
        self.weight = len(self.positions) / spec.seq  # w_r = t_r / s

    def shard(self, a: Any) -> Any:
        """My columns (positions) of a (batch, seq) array."""
        return a[:, self.positions]

    def forward(self, params: dict[str, Any], tokens: Any) -> tuple[Any, list[Any]]:
        """Local logits (b, t_r, V) of the full ``tokens`` and the units' saved activations."""
        return executor.forward(self.units, executor.Hooks(params), self.shard(tokens))

    def loss_and_grads(self, params: dict[str, Any], tokens: Any, targets: Any,
                       loss_scale: float = 1.0) -> tuple[float, dict[str, Any]]:
        """The serial (loss, grads) of the full batch, computed over the cp shards: the
        loss and the gradients all-reduced over ``cp`` (the same on every rank)."""
        hooks = executor.Hooks(params)
        local = executor.loss_and_grads(self.units, hooks, self.shard(tokens),
                                        self.shard(targets), self.weight * loss_scale)
        with self.comm.operation(OP_LOSS):
            loss = allreduce(self.comm, np.array([self.weight * local]), "sum", "ring")
        layout = self.states.layout
        flat = layout.flatten({k: hooks.grads[k] for k in params}, self.states.grads.dtype)
        with self.comm.operation(OP_GRADS):
            flat = allreduce(self.comm, flat, "sum", "ring")
        return float(loss[0]), layout.unflatten(flat)

    def step(self, step: int) -> float:
        """One AdamW (or SGD) step on the global batch of ``step``; its loss."""
        tokens, targets = self.spec.global_batch(step)
        loss, grads = self.loss_and_grads(self.states.param_views(), tokens, targets,
                                          self.states.loss_scale)
        self.states.set_grads(grads)
        self.states.step()
        return loss

    def train(self) -> list[float]:
        """``spec.steps`` steps; the losses (the same on every rank)."""
        return [self.step(s) for s in range(self.spec.steps)]
