"""Ring attention — кольцевое внимание — 环形注意力.

EN ring attention (zigzag load balancing) · RU кольцевое внимание (зигзагообразное
разбиение) · ZH 环形注意力（之字形负载均衡）

Liu, Zaharia & Abbeel 2023, "Ring Attention with Blockwise Transformers for
Near-Infinite Context", arXiv 2310.01889; the zigzag split of causal work:
Brandon et al. 2023, "Striped Attention", arXiv 2311.09431, and Megatron-LM /
Llama 3's context parallelism (each rank holds chunks r and 2P−1−r).

Each of the P ranks of the context-parallel group holds its part of the
sequence: its queries stay home while the key/value blocks travel around the
ring (rank r sends to r+1, receives from r−1).  At step i = 0 … P−1 rank r
holds the K/V block of rank j = (r − i) mod P and folds it into its running
(o, lse) with the online-softmax merge (:mod:`minipar.nn.blockwise_attention`);
the next block is already in flight (``Isend``/``Irecv`` posted before the
compute, waited after: communication overlapped with computation).  No rank
ever holds the whole sequence or an s × s score matrix.

**Causal work and the zigzag split.**  With plain contiguous chunks rank r's
queries see only the blocks j <= r: it computes (r+1)·(s/P)² scores per head,
so rank P−1 does P times rank 0's work and everyone waits for it.  Cut the
sequence into 2P chunks of c = s/(2P) and give rank r chunks r and 2P−1−r:
they see r+1 and 2P−r key chunks, **(2P+1)·c² scores per head on every rank**
(:func:`~minipar.parallel.context_parallel.measure.score_elements`; the positions:
:class:`~minipar.parallel.context_parallel.layout.Sharding`).
Block pairs entirely above the diagonal are skipped (:func:`block_pairs`,
:func:`~minipar.nn.blockwise_attention.block_visible`).

**Backward.**  Each rank keeps q, k, v, o and lse of its own tokens.  The K/V
blocks travel the ring again, now with the accumulators dK, dV of their owner:
at each step a rank adds its queries' contribution to the visiting block's
dK, dV and its own dq, then passes both on; after P steps one last hop brings
every dK, dV home.

**Bytes per rank per layer** (E = b·(s/P)·d elements, one rank's K or V):

    forward   2(P−1)·E                (K and V, P−1 hops)  == plan's ring_attention_bytes_per_rank
    backward  2(P−1)·E  +  2P·E       (K, V again; dK, dV one hop more, in the compute dtype)

(:func:`~minipar.parallel.context_parallel.measure.ring_forward_bytes`,
:func:`~minipar.parallel.context_parallel.measure.ring_backward_bytes`).

Messages carry the tag of the blocking collective ``"ring_attention"``
(:mod:`minipar.comm.tags`), so a rank that calls something else is named at
once, and the counters file them under that operation.
"""

from __future__ import annotations

from typing import Any

from minipar.backend import xp
from minipar.comm.tags import collective_tag
from minipar.comm.traced import traced
from minipar.nn.blockwise_attention import (
    attention_block_backward,
    attention_block_forward,
    block_visible,
    merge_attention,
)
from minipar.nn.dtypes import compute_dtype, down
from minipar.parallel.context_parallel.layout import Sharding

__all__ = ["OP", "block_pairs", "ring_attention_backward", "ring_attention_forward"]

OP = "ring_attention"


def block_pairs(layout: Sharding, me: int, other: int) -> list[tuple[slice, slice, int, int]]:
    """(my query slice, their key slice, q_offset, k_offset) for every block pair with work."""
    out, qa = [], 0
    for qs, qn in layout.chunks(me):
        ka = 0
        for ks, kn in layout.chunks(other):
            if block_visible(qn, kn, qs, ks):
                out.append((slice(qa, qa + qn), slice(ka, ka + kn), qs, ks))
            ka += kn
        qa += qn
    return out


def _ring(comm: Any) -> tuple[Any, int, int, int, int]:
    c = traced(comm)
    return c, c.size, c.rank, (c.rank + 1) % c.size, (c.rank - 1) % c.size


def ring_attention_forward(comm: Any, q: Any, k: Any, v: Any,
                           layout: Sharding) -> tuple[Any, tuple]:
    """Causal attention of my queries over the whole sequence; ``(o, saved)``.

    q, k, v: (B, H, t, d_h), my positions ``layout.positions(rank)``; o the same
    shape, storage dtype.  ``comm``: the context-parallel group (rank order = ring,
    ``layout.P`` ranks)."""
    c, P, r, right, left = _ring(comm)
    o = xp.zeros(q.shape, dtype=compute_dtype(q.dtype))
    lse = xp.full(q.shape[:3], -xp.inf, dtype=o.dtype)
    kv = xp.ascontiguousarray(xp.stack([k, v]))  # one message: (2, B, H, t, d_h)
    tag = collective_tag(OP, kv.dtype)
    with c.operation(OP):
        for i in range(P):
            j = (r - i) % P  # whose K/V block I hold now
            reqs: list[Any] = []
            if i < P - 1:  # the next block is in flight while I compute with this one
                nxt = xp.empty(kv.shape, kv.dtype)
                reqs = [c.Irecv(nxt, left, tag), c.Isend(kv, right, tag)]
            for qs, ks, qo, ko in block_pairs(layout, r, j):
                ob, lb = attention_block_forward(q[:, :, qs], kv[0][:, :, ks], kv[1][:, :, ks],
                                                 qo, ko)
                o[:, :, qs], lse[:, :, qs] = merge_attention(o[:, :, qs], lse[:, :, qs], ob, lb)
            if reqs:
                c.waitall(reqs)
                kv = nxt
    o = down(o, q.dtype)
    return o, (q, k, v, o, lse, layout)


def ring_attention_backward(comm: Any, saved: tuple, do: Any) -> tuple[Any, Any, Any]:
    """``(dq, dk, dv)`` of my positions for the output gradient ``do`` (B, H, t, d_h)."""
    q, k, v, o, lse, layout = saved
    c, P, r, right, left = _ring(comm)
    cd = compute_dtype(q.dtype)
    dq = xp.zeros(q.shape, dtype=cd)
    kv = xp.ascontiguousarray(xp.stack([k, v]))
    dkv = xp.zeros(kv.shape, dtype=cd)  # the visiting block's dK, dV, travelling with it
    tag, dtag = collective_tag(OP, kv.dtype), collective_tag(OP, dkv.dtype)
    with c.operation(OP):
        for i in range(P):
            j = (r - i) % P
            reqs: list[Any] = []
            if i < P - 1:
                nxt = xp.empty(kv.shape, kv.dtype)
                reqs = [c.Irecv(nxt, left, tag), c.Isend(kv, right, tag)]
            for qs, ks, qo, ko in block_pairs(layout, r, j):
                a, b, g = attention_block_backward(q[:, :, qs], kv[0][:, :, ks], kv[1][:, :, ks],
                                                   o[:, :, qs], lse[:, :, qs], do[:, :, qs], qo, ko)
                dq[:, :, qs] += a
                dkv[0][:, :, ks] += b
                dkv[1][:, :, ks] += g
            if reqs:  # K/V first: the same tag as dK/dV when dtypes agree, matched in order
                c.waitall(reqs)
                kv = nxt
            if P > 1:  # pass the accumulators on; after step P−1 this is the hop home
                got = xp.empty(dkv.shape, dkv.dtype)
                c.Sendrecv(dkv, right, dtag, got, left, dtag)
                dkv = got
    dt = q.dtype
    return down(dq, dt), down(dkv[0], dt), down(dkv[1], dt)

