"""Causal multi-head self-attention — причинное многоголовое самовнимание — 因果多头自注意力.

Vaswani et al. 2017, "Attention Is All You Need", arXiv 1706.03762; the
GPT-2 layout (Radford et al. 2019): one fused QKV projection.

    [q | k | v] = x W_qkv + b_qkv            W_qkv: (d, (H + 2K)·d_h), columns [q | k | v]
    q -> (B, H, T, d_h), k, v -> (B, K, T, d_h),  d_h = d / H,  head h owns q columns
    h·d_h … (h+1)·d_h and reads key/value head h // (H/K)
    A = softmax(q kᵀ / sqrt(d_h) + M),       M[i, j] = −inf for j > i (causal)
    o = A v -> (B, T, d),   y = o W_out + b_out

**Grouped-query attention** (Ainslie et al. 2023, "GQA", arXiv 2305.13245; Llama 2/3):
K key/value heads, each shared by H/K query heads; K = H is multi-head attention (W_qkv
(d, 3d), today's model), K = 1 multi-query attention (Shazeer 2019, arXiv 1911.02150).
The K/V activations, the KV cache and every K/V message of context parallelism shrink by
H/K.  The core broadcasts a key/value head over its group (:func:`group_heads`), and in
backward a key/value head's gradient is the sum over the query heads of its group.

Backward of the core (checked by finite differences in
tests/test_nn_layers.py):

    dA = do vᵀ,  dv = Aᵀ do,  dS = A ⊙ (dA − Σ_j dA ⊙ A),
    dq = dS k / sqrt(d_h),  dk = dSᵀ q / sqrt(d_h)   (dk, dv: summed over a group).

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


def group_heads(q: Any, kv: Any) -> tuple[Any, Any]:
    """GQA's broadcast: q (B, H, T, d_h) as (B, K, H/K, T, d_h) and a key/value tensor
    (B, K, T, d_h) as (B, K, 1, T, d_h), so that query head h meets key/value head
    h // (H/K) with no copy (K = H: ordinary multi-head attention, groups of one)."""
    b, h, t, dh = q.shape
    kh = kv.shape[1]
    return q.reshape(b, kh, h // kh, t, dh), kv[:, :, None]


def attention_core_forward(q: Any, k: Any, v: Any) -> tuple[Any, tuple]:
    """Causal softmax attention; returns (o, saved).  q (B, H, T, d_h), k and v
    (B, K, T, d_h) with K dividing H (grouped-query attention; K = H multi-head)."""
    dt = q.dtype
    qc, kc = group_heads(up(q), up(k))
    scale = 1.0 / math.sqrt(q.shape[-1])
    s = qc @ kc.swapaxes(-1, -2)  # (B, K, H/K, T, T)
    s *= scale
    s += causal_mask(q.shape[2], s.dtype)
    s -= s.max(axis=-1, keepdims=True)
    xp.exp(s, out=s)
    s /= s.sum(axis=-1, keepdims=True)  # s is now A
    o = (s @ up(v)[:, :, None]).reshape(q.shape)
    return down(o, dt), (q, k, v, down(s, dt))


def attention_core_backward(saved: tuple, do: Any) -> tuple[Any, Any, Any]:
    """Return ``(dq, dk, dv)`` for the core's output gradient ``do``; a key/value head's
    gradient is the sum over the H/K query heads that share it."""
    q, k, v, a16 = saved
    dt = do.dtype
    a = up(a16)
    qc, kc = group_heads(up(q), up(k))
    doc = up(do).reshape(qc.shape)
    scale = 1.0 / math.sqrt(q.shape[-1])
    dv = (a.swapaxes(-1, -2) @ doc).sum(axis=2)
    da = doc @ up(v)[:, :, None].swapaxes(-1, -2)
    ds = da
    ds -= xp.einsum("...ij,...ij->...i", da, a)[..., None]  # Σ_j dA ⊙ A, without a (T, T) temporary
    ds *= a
    ds *= scale
    dq = (ds @ kc).reshape(q.shape)
    dk = (ds.swapaxes(-1, -2) @ qc).sum(axis=2)
    return down(dq, dt), down(dk, dt), down(dv, dt)


def split_qkv(qkv: Any, n_head: int, n_kv_head: int | None = None) -> tuple[Any, Any, Any]:
    """The fused projection's output (B, T, (H + 2K)·d_h) as q (B, H, T, d_h) and k, v
    (B, K, T, d_h): columns [H query heads | K key heads | K value heads]."""
    kh = n_kv_head or n_head
    dh = qkv.shape[-1] // (n_head + 2 * kh)
    q, k, v = xp.split(qkv, [n_head * dh, (n_head + kh) * dh], axis=-1)
    return split_heads(q, n_head), split_heads(k, kh), split_heads(v, kh)


def merge_qkv(dq: Any, dk: Any, dv: Any) -> Any:
    """:func:`split_qkv`'s inverse: (B, T, (H + 2K)·d_h), [q | k | v] heads merged."""
    return xp.concatenate([merge_heads(dq), merge_heads(dk), merge_heads(dv)], axis=-1)


def attention_forward(p: dict[str, Any], x: Any, n_head: int,
                      n_kv_head: int | None = None) -> tuple[Any, tuple]:
    """Self-attention on x (B, T, d) with ``p`` = {w_qkv, b_qkv, w_out, b_out}.

    ``n_head`` query heads and ``n_kv_head`` key/value heads (default ``n_head``) are
    those in ``p`` (all of them serially, a rank's share under tensor parallelism):
    W_qkv has (n_head + 2·n_kv_head)·d_h columns."""
    qkv, s_qkv = linear_forward(x, p["w_qkv"])
    qkv = bias_forward(qkv, p["b_qkv"])
    o, s_core = attention_core_forward(*split_qkv(qkv, n_head, n_kv_head))
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
    dqkv = merge_qkv(*attention_core_backward(s_core, split_heads(do, n_head)))
    db_qkv = bias_backward(dqkv)
    dx, dw_qkv = linear_backward(p["w_qkv"], s_qkv, dqkv)
    return dx, {"w_qkv": dw_qkv, "b_qkv": db_qkv, "w_out": dw_out, "b_out": db_out}
