"""Blockwise attention with an online softmax — блочное внимание с онлайн-softmax — 分块注意力与在线 softmax.

EN online softmax (log-sum-exp merge) · RU онлайн-softmax (слияние через log-sum-exp) ·
ZH 在线 softmax（log-sum-exp 合并）

Milakov & Gimelshein 2018, "Online normalizer calculation for softmax",
arXiv 1805.02867; Rabe & Staats 2021, "Self-attention does not need O(n²)
memory", arXiv 2112.05682; Dao et al. 2022, FlashAttention, arXiv 2205.14135
(its backward: FlashAttention-2, Dao 2023, arXiv 2307.08691).  Ring attention
(Liu et al. 2023, arXiv 2310.01889; :mod:`minipar.parallel.context_parallel.ring_attention`)
is this module with the key blocks on other ranks.

Attention of one query over *all* keys is a softmax over their scores
s_j = q·k_j / sqrt(d_h).  Cut the keys into blocks A and B; each block alone
gives its own normalised output and the log of its normaliser:

    o_A = Σ_{j∈A} exp(s_j − lse_A) v_j,      lse_A = log Σ_{j∈A} exp(s_j)

and the two combine exactly — the **log-sum-exp merge**:

    lse = log(exp(lse_A) + exp(lse_B)) = logaddexp(lse_A, lse_B)
    o   = exp(lse_A − lse) · o_A + exp(lse_B − lse) · o_B

(each block's output re-weighted by its share of the total normaliser).  So
the keys can arrive one block at a time and the (s × s) score matrix never
exists whole: a rank keeps only o and lse per query.  Merging every block
equals :func:`minipar.nn.attention.attention_core_forward` (float64, to
rounding: tests/test_context_parallel.py).

**Positions.**  A block is a slice of queries at positions q_offset + i and
of keys at k_offset + j; the causal rule "key j visible to query i iff
k_offset + j <= q_offset + i" needs them, because under context parallelism
a rank's queries and the keys passing by sit anywhere in the sequence.  A
query with no visible key in a block gets lse = −inf and o = 0 (weight 0 in
the merge).

**Backward** (needs only the final o and lse, not the s × s matrix): with
P_ij = exp(s_ij − lse_i) recomputed per block and D_i = Σ_c do_ic·o_ic,

    dv = Pᵀ do,   dP = do vᵀ,   dS = P ⊙ (dP − D),   dq = dS k / sqrt(d_h),
    dk = dSᵀ q / sqrt(d_h)

summed over key blocks for dq; each key block's dk, dv are its own.
"""

from __future__ import annotations

import math
from typing import Any

from minipar import checks
from minipar.backend import errstate, xp
from minipar.nn.attention import group_heads
from minipar.nn.dtypes import down, up

__all__ = ["attention_block_backward", "attention_block_forward", "block_visible",
           "blockwise_attention", "merge_attention"]


def block_visible(tq: int, tk: int, q_offset: int, k_offset: int) -> bool:
    """Whether any key of the block is visible to any of its queries (else skip the block)."""
    return tq > 0 and tk > 0 and k_offset <= q_offset + tq - 1


def _scores(q: Any, k: Any, q_offset: int, k_offset: int) -> Any:
    """s = q kᵀ / sqrt(d_h) in the compute dtype, −inf where key position > query position;
    grouped (B, K, H/K, tq, tk) as :func:`~minipar.nn.attention.group_heads` puts them."""
    qg, kg = group_heads(up(q), up(k))
    s = qg @ kg.swapaxes(-1, -2)
    s *= 1.0 / math.sqrt(q.shape[-1])
    tq, tk = q.shape[2], k.shape[2]
    if k_offset + tk - 1 > q_offset:  # some key lies after some query: mask those pairs
        qpos = xp.arange(q_offset, q_offset + tq)[:, None]
        kpos = xp.arange(k_offset, k_offset + tk)[None, :]
        s[..., kpos > qpos] = -xp.inf
    return s


def attention_block_forward(q: Any, k: Any, v: Any, q_offset: int = 0,
                            k_offset: int = 0) -> tuple[Any, Any]:
    """``(o, lse)`` of queries q (B, H, tq, d_h) over one block of keys/values (B, K, tk, d_h)
    (K divides H: grouped-query attention, query head h reads key/value head h // (H/K)).

    o is normalised over this block's visible keys (storage dtype of q), lse
    (B, H, tq) in the compute dtype; −inf and o = 0 for a query with no visible key."""
    s = _scores(q, k, q_offset, k_offset)
    m = s.max(axis=-1, keepdims=True)
    m = xp.where(xp.isfinite(m), m, 0.0)  # a fully masked row: exp(−inf − 0) = 0, no NaN
    s -= m
    xp.exp(s, out=s)
    denom = s.sum(axis=-1, keepdims=True)
    o = s @ up(v)[:, :, None]
    with errstate(divide="ignore"):  # log 0 = −inf for a query that sees no key
        lse = (m + xp.log(denom))[..., 0]
    o /= xp.where(denom > 0, denom, 1.0)
    return down(o.reshape(q.shape), q.dtype), lse.reshape(q.shape[:3])


def merge_attention(o_a: Any, lse_a: Any, o_b: Any, lse_b: Any) -> tuple[Any, Any]:
    """The online-softmax merge of two partial results over disjoint key sets: ``(o, lse)``.

    lse = logaddexp(lse_a, lse_b); o = exp(lse_a − lse)·o_a + exp(lse_b − lse)·o_b
    (computed in the wider of the inputs' dtypes; a row with lse −inf on both
    sides stays o = 0, lse = −inf)."""
    lse = xp.logaddexp(lse_a, lse_b)
    safe = xp.where(xp.isfinite(lse), lse, 0.0)
    w_a = xp.exp(lse_a - safe)[..., None]
    w_b = xp.exp(lse_b - safe)[..., None]
    return w_a * up(o_a) + w_b * up(o_b), lse


def attention_block_backward(q: Any, k: Any, v: Any, o: Any, lse: Any, do: Any,
                             q_offset: int = 0, k_offset: int = 0) -> tuple[Any, Any, Any]:
    """``(dq, dk, dv)``: this key block's share of the gradients (compute dtype).

    ``o`` and ``lse`` are those of the *whole* attention of these queries (all
    blocks merged); dq over all blocks is the sum of the blocks' dq."""
    s = _scores(q, k, q_offset, k_offset)
    qg, kg = group_heads(up(q), up(k))
    g = qg.shape[:3]  # (B, K, H/K): a key/value head's gradient sums over its group
    s -= xp.where(xp.isfinite(lse), lse, 0.0).reshape(*g, -1)[..., None]
    xp.exp(s, out=s)  # P_ij = exp(s_ij − lse_i): the final softmax, this block's columns
    doc = up(do).reshape(qg.shape)
    delta = (doc * up(o).reshape(qg.shape)).sum(axis=-1, keepdims=True)  # D_i = Σ_c do_ic o_ic
    dv = (s.swapaxes(-1, -2) @ doc).sum(axis=2)
    ds = doc @ up(v)[:, :, None].swapaxes(-1, -2)
    ds -= delta
    ds *= s
    ds *= 1.0 / math.sqrt(q.shape[-1])
    return (ds @ kg).reshape(q.shape), (ds.swapaxes(-1, -2) @ qg).sum(axis=2), dv


def blockwise_attention(q: Any, k: Any, v: Any, block: int) -> tuple[Any, Any]:
    """Causal attention with the keys taken ``block`` at a time and merged: ``(o, lse)``.

    The serial picture of what a ring rank does; equals
    :func:`minipar.nn.attention.attention_core_forward` to rounding."""
    checks.integer("block", block, 1)
    b, h, t, dh = q.shape
    o = xp.zeros((b, h, t, dh), dtype=up(q[:0]).dtype)
    lse = xp.full((b, h, t), -xp.inf, dtype=o.dtype)
    for j in range(0, k.shape[2], block):
        if block_visible(t, min(block, k.shape[2] - j), 0, j):
            ob, lb = attention_block_forward(q, k[:, :, j:j + block], v[:, :, j:j + block], 0, j)
            o, lse = merge_attention(o, lse, ob, lb)
    return down(o, q.dtype), lse
