"""Causal multi-head self-attention — причинное многоголовое самовнимание — 因果多头自注意力.

Vaswani et al. 2017, "Attention Is All You Need", arXiv 1706.03762; the
GPT-2 layout (Radford et al. 2019): one fused QKV projection.

    [q | k | v] = x W_qkv + b_qkv            W_qkv: (d, 3d), columns [q | k | v]
    q, k, v -> (B, H, T, d_h),  d_h = d / H  head h owns columns h·d_h … (h+1)·d_h
    A = softmax(q kᵀ / sqrt(d_h) + M),       M[i, j] = −inf for j > i (causal)
    o = A v -> (B, T, d),   y = o W_out + b_out

Backward of the core (checked by finite differences in
tests/test_nn_layers.py):

    dA = do vᵀ,  dv = Aᵀ do,  dS = A ⊙ (dA − Σ_j dA ⊙ A),
    dq = dS k / sqrt(d_h),  dk = dSᵀ q / sqrt(d_h).

Tensor parallelism (Megatron) splits the heads: a rank holds the q, k and v
columns of its heads and the matching rows of W_out; ``attention_core_*``
works on any number of heads, so it is reused unchanged there.
DeepSpeed-Ulysses reuses it too (full sequence, H/P heads per rank); ring
attention takes the keys a block at a time instead, merged by the online
softmax (:mod:`minipar.nn.blockwise_attention`, with position offsets).
"""

from __future__ import annotations

import math
from typing import Any

from minipar.backend import xp
from minipar.nn.dtypes import down, up
from minipar.nn.layers import bias_backward, bias_forward, linear_backward, linear_forward

_MASKS: dict[tuple[int, Any], Any] = {}


def causal_mask(t: int, dtype: Any) -> Any:
    """(T, T) additive mask: 0 on and below the diagonal, −inf above it (cached)."""
    key = (t, xp.dtype(dtype))
    if key not in _MASKS:
        m = xp.zeros((t, t), dtype=dtype)
        m[xp.triu_indices(t, k=1)] = -xp.inf
        _MASKS[key] = m
    return _MASKS[key]


def split_heads(x: Any, n_head: int) -> Any:
    """(B, T, H·d_h) -> (B, H, T, d_h)."""
    b, t, d = x.shape
    return x.reshape(b, t, n_head, d // n_head).transpose(0, 2, 1, 3)


def merge_heads(x: Any) -> Any:
    """(B, H, T, d_h) -> (B, T, H·d_h), contiguous."""
    b, h, t, dh = x.shape
    return x.transpose(0, 2, 1, 3).reshape(b, t, h * dh)


def attention_core_forward(q: Any, k: Any, v: Any) -> tuple[Any, tuple]:
    """Causal softmax attention on (B, H, T, d_h) heads; returns (o, saved)."""
    dt = q.dtype
    qc, kc, vc = up(q), up(k), up(v)
    scale = 1.0 / math.sqrt(q.shape[-1])
    s = qc @ kc.transpose(0, 1, 3, 2)
    s *= scale
    s += causal_mask(q.shape[2], s.dtype)
    s -= s.max(axis=-1, keepdims=True)
    xp.exp(s, out=s)
    s /= s.sum(axis=-1, keepdims=True)  # s is now A
    o = s @ vc
    return down(o, dt), (q, k, v, down(s, dt))


def attention_core_backward(saved: tuple, do: Any) -> tuple[Any, Any, Any]:
    """Return ``(dq, dk, dv)`` for the core's output gradient ``do``."""
    q, k, v, a16 = saved
    dt = do.dtype
    a, doc = up(a16), up(do)
    scale = 1.0 / math.sqrt(q.shape[-1])
    dv = a.transpose(0, 1, 3, 2) @ doc
    da = doc @ up(v).transpose(0, 1, 3, 2)
    ds = da
    ds -= xp.einsum("...ij,...ij->...i", da, a)[..., None]  # Σ_j dA ⊙ A, without a (T, T) temporary
    ds *= a
    ds *= scale
    dq = ds @ up(k)
    dk = ds.transpose(0, 1, 3, 2) @ up(q)
    return down(dq, dt), down(dk, dt), down(dv, dt)


def attention_forward(p: dict[str, Any], x: Any, n_head: int) -> tuple[Any, tuple]:
    """Self-attention on x (B, T, d) with ``p`` = {w_qkv, b_qkv, w_out, b_out}.

    ``n_head`` is the number of heads in ``p`` (all of them serially, a
    rank's share under tensor parallelism): W_qkv has 3·n_head·d_h columns.
    """
    qkv, s_qkv = linear_forward(x, p["w_qkv"])
    qkv = bias_forward(qkv, p["b_qkv"])
    q, k, v = (split_heads(a, n_head) for a in xp.split(qkv, 3, axis=-1))
    o, s_core = attention_core_forward(q, k, v)
    y, s_out = linear_forward(merge_heads(o), p["w_out"])
    y = bias_forward(y, p["b_out"])
    return y, (s_qkv, s_core, s_out, n_head)


def attention_backward(
    p: dict[str, Any], saved: tuple, dy: Any
) -> tuple[Any, dict[str, Any]]:
    """Return ``(dx, grads)`` with grads keyed like ``p`` (its weights are read, not saved)."""
    s_qkv, s_core, s_out, n_head = saved
    db_out = bias_backward(dy)
    do, dw_out = linear_backward(p["w_out"], s_out, dy)
    dq, dk, dv = attention_core_backward(s_core, split_heads(do, n_head))
    b, t, _ = dy.shape
    dqkv = xp.empty((b, t, 3 * dq.shape[1] * dq.shape[3]), dtype=dq.dtype)
    for part, dpart in zip(xp.split(dqkv, 3, axis=-1), (dq, dk, dv)):
        split_heads(part, n_head)[...] = dpart  # [dq | dk | dv], heads merged: one copy each
    db_qkv = bias_backward(dqkv)
    dx, dw_qkv = linear_backward(p["w_qkv"], s_qkv, dqkv)
    return dx, {"w_qkv": dw_qkv, "b_qkv": db_qkv, "w_out": dw_out, "b_out": db_out}
