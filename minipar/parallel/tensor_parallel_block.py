"""Megatron's MLP, attention and MoE under tensor parallelism — MLP, внимание и MoE Megatron
в тензорном параллелизме — 张量并行下的 Megatron MLP、注意力与 MoE.

EN tensor-parallel MLP and attention (Megatron-LM) · RU тензорно-параллельные MLP и внимание ·
ZH 张量并行的 MLP 与注意力

Shoeybi et al. 2019, arXiv 1909.08053, §3, Fig. 3 (the pictures are in
:mod:`minipar.parallel.tensor_parallel_gpt`): each piece is a forward and its backward on
this rank's slices, built from :class:`~minipar.parallel.tensor_parallel.ColumnParallelLinear`
and :class:`~minipar.parallel.tensor_parallel.RowParallelLinear`, so each runs exactly one
f (all-reduce backward) and one g (all-reduce forward):

    MLP        y = g( GELU(f(x) W_in,r + b_in,r) W_out,r ) + b_out
    attention  y = g( Attn_{my n_head/t heads}(f(x) W_qkv,r + b_qkv,r) W_out,r ) + b_out
    MoE        y = combine( g( Experts_r( f(dispatch(x)) ) ) )   (router replicated)

:func:`tp_steps` hands them to the serial block walk (:func:`minipar.nn.gpt.block_forward`'s
``attn=`` / ``ffn=``), so the LayerNorms and residuals of the tensor-parallel block are the
serial code.  Tests: tests/mpi/tp_check.py (the GPT built from them against the serial one,
float64).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from minipar.backend import xp
from minipar.collectives import _base as B
from minipar.comm.pairs import copy_to_parallel, reduce_from_parallel
from minipar.nn.attention import (
    attention_core_backward,
    attention_core_forward,
    merge_heads,
    split_heads,
)
from minipar.nn.gpt import Step
from minipar.nn.gpt_config import GPTConfig
from minipar.nn.layers import gelu_backward, gelu_forward
from minipar.nn.moe_steps import (
    combine_backward,
    combine_forward,
    dispatch_backward,
    dispatch_forward,
    experts_backward,
    experts_forward,
)
from minipar.parallel.tensor_parallel import ColumnParallelLinear, RowParallelLinear

__all__ = ["tp_attention_backward", "tp_attention_forward", "tp_mlp_backward", "tp_mlp_forward",
           "tp_moe_backward", "tp_moe_forward", "tp_steps"]


def _rank_size(comm: Any) -> tuple[int, int]:
    c = B.traced(comm)
    return c.rank, c.size


# ------------------------------------------------------------------------------- MLP
def tp_mlp_forward(comm: Any, p: dict[str, Any], x: Any,
                   sequence_parallel: bool = False) -> tuple[Any, tuple]:
    """Megatron's MLP: column-parallel W_in, GELU local, row-parallel W_out, b_out once."""
    col = ColumnParallelLinear(comm, sequence_parallel=sequence_parallel)
    row = RowParallelLinear(comm, sequence_parallel=sequence_parallel)
    a, s1 = col.forward({"w": p["w_in"], "b": p["b_in"]}, x)
    h, s2 = gelu_forward(a)
    del a
    y, s3 = row.forward({"w": p["w_out"], "b": p["b_out"]}, h)
    return y, (s1, s2, s3, sequence_parallel)


def tp_mlp_backward(comm: Any, p: dict[str, Any], saved: tuple,
                    dy: Any) -> tuple[Any, dict[str, Any]]:
    """Return ``(dx, {w_in, b_in, w_out, b_out})`` (this rank's slices; b_out replicated)."""
    s1, s2, s3, sp = saved
    dh, g_row = RowParallelLinear(comm, sequence_parallel=sp).backward(
        {"w": p["w_out"], "b": p["b_out"]}, s3, dy)
    da = gelu_backward(s2, dh)
    dx, g_col = ColumnParallelLinear(comm, sequence_parallel=sp).backward(
        {"w": p["w_in"], "b": p["b_in"]}, s1, da)
    return dx, {"w_in": g_col["w"], "b_in": g_col["b"], "w_out": g_row["w"], "b_out": g_row["b"]}


# ------------------------------------------------------------------------- attention
def tp_attention_forward(comm: Any, p: dict[str, Any], x: Any, n_head: int,
                         sequence_parallel: bool = False, core: Any = None) -> tuple[Any, tuple]:
    """Self-attention with this rank's n_head/t heads (``n_head``: the model's heads).
    ``core``: another attention core on the local fused qkv (b, s, 3h/t) -> o (b, s, h/t),
    e.g. context parallelism's :class:`~minipar.parallel.context_parallel.CPAttention`."""
    _, t = _rank_size(comm)
    h_local = n_head // t
    col = ColumnParallelLinear(comm, sequence_parallel=sequence_parallel)
    qkv, s_qkv = col.forward({"w": p["w_qkv"], "b": p["b_qkv"]}, x)
    if core is not None:
        o, s_core = core.forward(qkv)
    else:
        q, k, v = (split_heads(a, h_local) for a in xp.split(qkv, 3, axis=-1))
        o, s_core = attention_core_forward(q, k, v)
        o = merge_heads(o)
    del qkv
    row = RowParallelLinear(comm, sequence_parallel=sequence_parallel)
    y, s_out = row.forward({"w": p["w_out"], "b": p["b_out"]}, o)
    return y, (s_qkv, s_core, s_out, h_local, sequence_parallel)


def tp_attention_backward(comm: Any, p: dict[str, Any], saved: tuple, dy: Any,
                          core: Any = None) -> tuple[Any, dict[str, Any]]:
    """Return ``(dx, {w_qkv, b_qkv, w_out, b_out})`` (``core``: the forward's)."""
    s_qkv, s_core, s_out, h_local, sp = saved
    do, g_out = RowParallelLinear(comm, sequence_parallel=sp).backward(
        {"w": p["w_out"], "b": p["b_out"]}, s_out, dy)
    if core is not None:
        dqkv = core.backward(s_core, do)
    else:
        dq, dk, dv = attention_core_backward(s_core, split_heads(do, h_local))
        dqkv = xp.concatenate([merge_heads(dq), merge_heads(dk), merge_heads(dv)], axis=-1)
    dx, g_qkv = ColumnParallelLinear(comm, sequence_parallel=sp).backward(
        {"w": p["w_qkv"], "b": p["b_qkv"]}, s_qkv, dqkv)
    return dx, {"w_qkv": g_qkv["w"], "b_qkv": g_qkv["b"], "w_out": g_out["w"],
                "b_out": g_out["b"]}


# ----------------------------------------------------------------------------- MoE
def tp_moe_forward(comm: Any, p: dict[str, Any], x: Any, cfg: GPTConfig) -> tuple[Any, dict]:
    """MoE under TP: replicated dispatch, f on the buffers, sliced experts, g, combine."""
    r, _ = _rank_size(comm)
    h = x.reshape(-1, x.shape[-1])
    buffers, s_d = dispatch_forward(p["router"], h, cfg.n_experts, cfg.top_k,
                                    cfg.capacity_factor, cfg.aux_loss_coef)
    buffers = copy_to_parallel.forward(comm, buffers)
    pe = dict(p)
    if r:  # b_out is replicated: rank 0 adds it, g's sum then has it once
        for e in range(cfg.n_experts):
            pe[f"experts.{e}.b_out"] = np.zeros_like(p[f"experts.{e}.b_out"])
    out, s_e = experts_forward(pe, buffers, s_d["tokens_per_expert"])
    out = reduce_from_parallel.forward(comm, out)
    y, s_c = combine_forward(out, s_d)
    return y.reshape(x.shape), {**s_d, "x_shape": x.shape, "experts": s_e, "combine": s_c}


def tp_moe_backward(comm: Any, p: dict[str, Any], saved: dict, dy: Any,
                    daux: float = 1.0) -> tuple[Any, dict[str, Any]]:
    """combine⁻¹ (replicated) → g⁻¹ → sliced experts⁻¹ → f⁻¹ (all-reduce) → dispatch⁻¹."""
    d_out, d_gates = combine_backward(saved["combine"], dy.reshape(-1, dy.shape[-1]))
    d_out = reduce_from_parallel.backward(comm, d_out)
    d_buf, g_e = experts_backward(p, saved["experts"], d_out)
    d_buf = copy_to_parallel.backward(comm, d_buf)
    dh, d_router = dispatch_backward(p["router"], saved, d_buf, d_gates, daux)
    return dh.reshape(saved["x_shape"]), {"router": d_router, **g_e}


# --------------------------------------------------------------------- the block's steps
def tp_steps(comm: Any, cfg: GPTConfig, sequence_parallel: bool = False,
             core: Any = None) -> tuple[Step, Step]:
    """The ``(attn, ffn)`` steps (:data:`minipar.nn.gpt.Step`) of a Megatron-sliced block:
    :func:`minipar.nn.gpt.block_forward` / ``block_backward`` with these is the
    tensor-parallel block (the LayerNorms and residuals are the serial code); ``core``:
    the attention core of the local heads (default: the serial one; context parallelism's)."""
    sp = sequence_parallel

    def attn_forward(q: dict[str, Any], a: Any) -> tuple[Any, Any]:
        return tp_attention_forward(comm, q, a, cfg.n_head, sp, core)

    def attn_backward(q: dict[str, Any], s: Any, dy: Any) -> tuple[Any, dict[str, Any]]:
        return tp_attention_backward(comm, q, s, dy, core)

    def ffn_forward(q: dict[str, Any], h: Any) -> tuple[Any, Any]:
        if "router" in q:
            return tp_moe_forward(comm, q, h, cfg)
        return tp_mlp_forward(comm, q, h, sp)

    def ffn_backward(q: dict[str, Any], s: Any, dy: Any,
                     daux: float = 1.0) -> tuple[Any, dict[str, Any]]:
        if "router" in q:
            return tp_moe_backward(comm, q, s, dy, daux)
        return tp_mlp_backward(comm, q, s, dy)

    return (attn_forward, attn_backward), (ffn_forward, ffn_backward)
