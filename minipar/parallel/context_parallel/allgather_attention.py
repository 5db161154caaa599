"""All-gather context parallelism (Llama 3) — контекстный параллелизм со сбором K/V
(Llama 3) — 全收集上下文并行（Llama 3）.

EN all-gather context parallelism · RU контекстный параллелизм со сбором ключей и
значений · ZH 全收集（all-gather）上下文并行

Llama Team 2024, "The Llama 3 Herd of Models", arXiv 2407.21783, §3.3.2; Megatron-Core's
``cp_comm_type = "all_gather"``.  The sequence is cut into 2P chunks and rank r holds
chunks r and 2P−1−r (the zigzag :class:`~.layout.Sharding`: equal causal work).  Before
attention every rank **all-gathers K and V** of the whole sequence, then computes its own
queries against them; in backward the dK, dV of every position are **reduce-scattered**
back to the ranks that own them — the pair ``gather_from_sequence_parallel_region``
(:mod:`minipar.parallel.mappings`: all-gather forward, reduce-scatter backward):

    kv (b, s/P, 2K·d_h)  --all-gather-->  (b, s, 2K·d_h), rank order -> sequence order
    each of my query chunks [a, a+c): keys 0 … a+c−1, the causal mask at offset a
    d kv (b, s, 2K·d_h)  --reduce-scatter-->  (b, s/P, 2K·d_h): my positions' sum

The all-gather is exposed (nothing to overlap it with); Llama 3 chose it over the ring
because any mask (documents) is easy — a query chunk sees the keys whole — and because
with grouped-query attention K and V are small: K/H of the queries'.

**Bytes per rank per layer** (ring all-gather and reduce-scatter, E = b·(s/P)·2K·d_h):
forward (P−1)·E · i, backward (P−1)·E · i_c (dK, dV in the compute dtype).
**Activation memory**: my q, k, v, o and lse, and the gathered K, V of the whole
sequence (b·s·2K·d_h), kept for backward.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from minipar.backend import to_device, xp
from minipar.nn.attention import merge_heads, split_heads
from minipar.nn.blockwise_attention import attention_block_backward, attention_block_forward
from minipar.nn.dtypes import compute_dtype, down
from minipar.parallel.context_parallel.layout import Sharding
from minipar.parallel.mappings import gather_from_sequence_parallel_region as all_gather_kv

__all__ = ["OP", "allgather_attention_backward", "allgather_attention_forward"]

OP = "allgather_kv"


def _order(layout: Sharding) -> tuple[Any, Any]:
    """The gathered (rank-order) positions, and the permutation to sequence order."""
    held = np.concatenate([layout.positions(j) for j in range(layout.P)])
    return to_device(held), to_device(np.argsort(held))


def allgather_attention_forward(comm: Any, q: Any, k: Any, v: Any,
                                layout: Sharding, rank: int) -> tuple[Any, tuple]:
    """Causal attention of my queries q (B, H, t, d_h) over the whole sequence's keys and
    values, all-gathered from every rank's k, v (B, K, t, d_h); ``(o, saved)``."""
    kh = k.shape[1]
    mine = xp.concatenate([merge_heads(k), merge_heads(v)], axis=-1)  # (B, t, 2K·d_h)
    _, seq = _order(layout)
    full = all_gather_kv.forward(comm, mine, op=OP)[:, seq]  # (B, s, 2K·d_h), in order
    kf, vf = (split_heads(a, kh) for a in xp.split(full, 2, axis=-1))
    o = xp.empty(q.shape, dtype=q.dtype)
    lse = xp.empty(q.shape[:3], dtype=compute_dtype(q.dtype))
    at = 0
    for start, n in layout.chunks(rank):  # chunk [start, start+n) sees keys 0 … start+n−1
        o[:, :, at:at + n], lse[:, :, at:at + n] = attention_block_forward(
            q[:, :, at:at + n], kf[:, :, :start + n], vf[:, :, :start + n], start, 0)
        at += n
    return o, (q, k, v, kf, vf, o, lse, layout, rank)


def allgather_attention_backward(comm: Any, saved: tuple, do: Any) -> tuple[Any, Any, Any]:
    """``(dq, dk, dv)`` of my positions: dK, dV of the whole sequence reduce-scattered."""
    q, k, v, kf, vf, o, lse, layout, rank = saved
    cd = compute_dtype(q.dtype)
    dq = xp.empty(q.shape, dtype=cd)
    dkf, dvf = xp.zeros(kf.shape, dtype=cd), xp.zeros(vf.shape, dtype=cd)
    at = 0
    for start, n in layout.chunks(rank):
        r = slice(at, at + n)
        dq[:, :, r], dk, dv = attention_block_backward(
            q[:, :, r], kf[:, :, :start + n], vf[:, :, :start + n], o[:, :, r], lse[:, :, r],
            do[:, :, r], start, 0)
        dkf[:, :, :start + n] += dk
        dvf[:, :, :start + n] += dv
        at += n
    held, _ = _order(layout)
    d_full = xp.concatenate([merge_heads(dkf), merge_heads(dvf)], axis=-1)[:, held]
    d_mine = all_gather_kv.backward(comm, d_full, op=OP)  # reduce-scatter: my positions
    dk, dv = (split_heads(a, k.shape[1]) for a in xp.split(d_mine, 2, axis=-1))
    dt = q.dtype
    return down(dq, dt), down(dk, dt), down(dv, dt)
