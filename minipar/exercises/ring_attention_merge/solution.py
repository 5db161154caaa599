"""Reference solution: ring attention, K/V blocks around the ring, partials merged by log-sum-exp.

EN ring attention · RU кольцевое внимание · ZH 环形注意力

Liu, Zaharia & Abbeel 2023, "Ring Attention with Blockwise Transformers",
arXiv 2310.01889; the merge is the online softmax of Milakov & Gimelshein
2018 (arXiv 1805.02867), as in FlashAttention (Dao et al. 2022, arXiv
2205.14135).  Rank r holds the query block r of the sequence (positions
r·B … (r+1)·B) and, at step s, the key/value block src = (r - s) mod N.
Attention of the queries over one block gives a partial result (o_b, lse_b):
o_b the softmax-weighted values over that block alone, lse_b = log Σ_j
exp(q·k_j / sqrt(d)) over it.  Two partials merge exactly:

    lse = log(exp(lse_1) + exp(lse_2))
    o   = exp(lse_1 - lse) · o_1 + exp(lse_2 - lse) · o_2

Causal: a block from an earlier rank (src < r) is seen whole, the own block
(src == r) through the lower-triangular mask, a later one (src > r) not at
all.  Each rank sends (N-1) x (|K_r| + |V_r|) bytes, only to (r + 1) % N.

The merge and the attention of one block are the package's own, the very
functions minipar's ring attention runs
(:mod:`minipar.nn.blockwise_attention`: :func:`merge_attention`,
:func:`attention_block_forward` with the blocks' global positions,
:func:`block_visible`); ``attention_block`` is the skeleton's given helper,
kept for the grader's diagnosis.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from minipar.nn.blockwise_attention import attention_block_forward, block_visible
from minipar.nn.blockwise_attention import merge_attention as merge


def attention_block(q: np.ndarray, k: np.ndarray, v: np.ndarray,
                    mask: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
    """Softmax attention of ``q`` over one block of keys: ``(o, lse)``.

    ``mask`` (Bq, Bk) bool, True where a query may see a key; a query that
    sees no key gets o = 0 and lse = -inf (it adds nothing when merged)."""
    s = q @ k.swapaxes(-1, -2) / math.sqrt(q.shape[-1])
    if mask is not None:
        s = np.where(mask, s, -np.inf)
    m = s.max(axis=-1, keepdims=True)
    m = np.where(np.isfinite(m), m, 0.0)
    p = np.exp(s - m)
    total = p.sum(axis=-1, keepdims=True)
    with np.errstate(divide="ignore"):
        lse = (m + np.log(total))[..., 0]
    return (p @ v) / np.where(total > 0, total, 1.0), lse


def ring_attention(comm: Any, x: np.ndarray, k: np.ndarray, v: np.ndarray,
                   causal: bool = True) -> np.ndarray:
    """This rank's rows of softmax(q kᵀ / sqrt(d)) v over the whole sequence.

    ``x``: the query block (..., B, d) of rank r; ``k``, ``v``: the key and
    value blocks of rank r, same shape."""
    n, r = comm.Get_size(), comm.Get_rank()
    right, left = (r + 1) % n, (r - 1) % n
    o, lse = np.zeros(x.shape), np.full(x.shape[:-1], -np.inf)
    kb, vb = k.copy(), v.copy()
    B = x.shape[-2]
    q_at = r * B if causal else n * B  # not causal: every key lies before every query
    for s in range(n):
        src = (r - s) % n  # whose K/V block this rank holds now
        # causal: a block from a later rank is all future (skipped), the own block masked
        if block_visible(B, B, q_at, src * B):
            o, lse = merge(o, lse, *attention_block_forward(x, kb, vb, q_at, src * B))
        if s < n - 1:  # pass the block on: send to the right, receive from the left
            k_in, v_in = np.empty_like(kb), np.empty_like(vb)
            comm.Sendrecv(kb, dest=right, recvbuf=k_in, source=left)
            comm.Sendrecv(vb, dest=right, recvbuf=v_in, source=left)
            kb, vb = k_in, v_in
    return o
