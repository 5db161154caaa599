"""The context-parallel GPT — модель на части последовательности — 序列分片上的 GPT.

EN context-parallel GPT (units over a sequence shard) · RU GPT на части
последовательности (блоки над сегментом) · ZH 序列分片上的 GPT（计算单元）

Everything in a GPT but attention works token by token, so on a sequence
shard it runs unchanged (embedding, LayerNorms, projections, MLP, head, the
loss).  The CP GPT is therefore the serial model's units
(:mod:`minipar.nn.units`) with two things swapped, and
:mod:`minipar.nn.executor` walks them unchanged:

* the attention **core** (:class:`CPAttention`): fused ``qkv`` of my
  positions in, their output out, the other ranks' keys and values fetched
  by DeepSpeed-Ulysses (:mod:`~minipar.parallel.context_parallel.ulysses`),
  ring attention (:mod:`~minipar.parallel.context_parallel.ring_attention`) or Llama 3's
  all-gather (:mod:`~minipar.parallel.context_parallel.allgather_attention`);
  the projections around it are the serial layer's (:func:`attention_forward`);
* the **embedding** (:class:`CPEmbedUnit`) looks up my own positions in
  ``pos_emb`` (zigzag positions are not contiguous).

:func:`cp_units` builds them for one rank of the cp group; which positions
it holds is a :class:`~minipar.parallel.context_parallel.layout.Sharding`.
The hybrid engine uses the same core inside the tensor-parallel block.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from minipar.backend import to_device, xp
from minipar.comm.traced import traced
from minipar.nn.attention import merge_heads, merge_qkv, split_heads, split_qkv
from minipar.collectives import allreduce
from minipar.nn import fp8
from minipar.nn.dtypes import up
from minipar.nn.gpt import BlockUnit, HeadUnit, block_backward, block_forward
from minipar.nn.gpt_config import GPTConfig
from minipar.nn.layers import (
    bias_backward,
    bias_forward,
    embedding_backward,
    embedding_forward,
    linear_backward,
    linear_forward,
)
from minipar.nn.units import Unit
from minipar.parallel.context_parallel import ulysses, usp
from minipar.parallel.context_parallel.allgather_attention import (
    allgather_attention_backward,
    allgather_attention_forward,
)
from minipar.parallel.context_parallel.layout import Sharding
from minipar.parallel.context_parallel.ring_attention import (
    ring_attention_backward,
    ring_attention_forward,
)

__all__ = ["CPAttention", "CPBlockUnit", "CPEmbedUnit", "attention_backward",
           "attention_forward", "context_grid", "cp_units"]


class CPAttention:
    """The attention core over a sequence shard: fused ``qkv`` (b, t, (H + 2K)·d_h) in,
    o (b, t, H·d_h) out (``n_head`` H query heads, ``n_kv_head`` K key/value heads)."""

    def __init__(self, comm: Any, kind: str, layout: Sharding, n_head: int,
                 n_kv_head: int | None = None) -> None:
        if layout.P != traced(comm).size:
            raise ValueError(f"context parallelism: the sharding is for {layout.P} ranks, the "
                             f"communicator has {traced(comm).size}")
        self.comm, self.kind, self.layout, self.n_head = comm, kind, layout, n_head
        self._tokens: fp8.Split | None = None
        self.n_kv_head = n_kv_head or n_head
        if kind == "usp":  # the 2-D context grid: my Ulysses group, my ring
            self.groups = context_grid(comm, layout.U)

    def token_split(self) -> fp8.Split:
        """This rank's positions of each sequence, for FP8's 128-token tiles of the weight
        gradients (a tile the sharding cuts: its amax all-reduced, MAX, op ``fp8_amax``)."""
        if self._tokens is None:
            c = traced(self.comm)

            def reduce_max(a: Any) -> Any:
                with c.operation("fp8_amax"):
                    return allreduce(c, xp.ascontiguousarray(a), "max", "ring")
            index = xp.asarray(self.layout.positions(c.rank))
            self._tokens = fp8.Split(1, index, self.layout.s, reduce_max)
        return self._tokens

    def forward(self, qkv: Any) -> tuple[Any, Any]:
        if self.kind == "usp":
            return usp.usp_attention_forward(self.groups, qkv, self.n_head, self.n_kv_head,
                                             self.layout.ring)
        if self.kind == "ulysses":
            return ulysses.ulysses_attention_forward(self.comm, qkv, self.n_head,
                                                     self.n_kv_head)
        q, k, v = split_qkv(qkv, self.n_head, self.n_kv_head)
        if self.kind == "allgather":
            o, saved = allgather_attention_forward(self.comm, q, k, v, self.layout,
                                                   traced(self.comm).rank)
            o = merge_heads(o)
            return o, (*saved[:5], split_heads(o, self.n_head), *saved[6:])  # o: a view
        o, saved = ring_attention_forward(self.comm, q, k, v, self.layout)
        o = merge_heads(o)
        return o, (*saved[:3], split_heads(o, self.n_head), *saved[4:])  # o saved as a view

    def backward(self, saved: Any, do: Any) -> Any:
        if self.kind == "usp":
            return usp.usp_attention_backward(self.groups, saved, do)
        if self.kind == "ulysses":
            return ulysses.ulysses_attention_backward(self.comm, saved, do)
        back = (allgather_attention_backward if self.kind == "allgather"
                else ring_attention_backward)
        return merge_qkv(*back(self.comm, saved, split_heads(do, self.n_head)))


def context_grid(comm: Any, U: int) -> tuple[Any, Any]:
    """USP's 2-D grid of the cp ranks, R = P/U groups of U: rank g·U + u's Ulysses group
    (the U ranks g·U … g·U + U − 1, consecutive: inside a node when ranks fill nodes in
    order) and its ring (the R ranks u, U + u, …).  Both named like ``comm``, so their bytes
    count on its axis."""
    c = traced(comm)
    return (c.Split(c.rank // U, c.rank % U, name=c.name),
            c.Split(c.rank % U, c.rank // U, name=c.name))


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

    has_input_grad = False  # token ids in: B does nothing, the whole backward is W

    def __init__(self, cfg: GPTConfig, positions: np.ndarray) -> None:
        self.cfg, self.name, self.names = cfg, "embed", ("tok_emb", "pos_emb")
        self.positions = to_device(positions)  # an index of device arrays, moved once

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
        with fp8.tokens(self.core.token_split() if self.cfg.fp8 else None):
            return block_backward(p, saved, dy, daux, attn=self.attn)


def cp_units(cfg: GPTConfig, comm: Any, kind: str, layout: Sharding) -> tuple[Unit, ...]:
    """embed, block 0 … L-1, head of the CP GPT for this rank (of ``comm``, the cp group)."""
    core = CPAttention(comm, kind, layout, cfg.n_head, cfg.n_kv_head)
    rank = traced(comm).rank
    return (CPEmbedUnit(cfg, layout.positions(rank)),
            *(CPBlockUnit(cfg, i, core) for i in range(cfg.n_layer)), HeadUnit(cfg))
