"""DeepSpeed-Ulysses — DeepSpeed-Ulysses (all-to-all по головам) — DeepSpeed-Ulysses（按头全交换）.

EN DeepSpeed-Ulysses (sequence ↔ heads all-to-all) · RU DeepSpeed-Ulysses (обмен
«всё-ко-всем» между последовательностью и головами) · ZH DeepSpeed-Ulysses（序列与注意力头的全交换）

Jacobs et al. 2023, "DeepSpeed Ulysses: System Optimizations for Enabling
Training of Extreme Long Sequence Transformer Models", arXiv 2309.14509.

Every rank of the context-parallel group holds s/P positions of the
sequence, with all H heads.  Attention needs the whole sequence, but each
head is independent of the others: so one all-to-all trades "my positions,
every head" for "every position, my H/P heads", attention runs locally,
unchanged (:func:`minipar.nn.attention.attention_core_forward`, causal on the
full sequence), and the reverse all-to-all trades back:

    qkv (b, s/P, 3, H, d_h)  --a2a-->  (b, s, 3, H/P, d_h)   attention of my heads
    o   (b, s, H/P, d_h)     --a2a⁻¹-> (b, s/P, H, d_h)      back to my positions

Both are :data:`minipar.parallel.mappings.all_to_all` (split the heads, join the
sequence; the output goes the other way, i.e. the pair's ``backward``), and
the layer's backward runs the same two in reverse order, each as its
adjoint.  Q, K and V travel in one message (the fused QKV projection's
output, split by heads); the paper counts them as three all-to-alls.

**Bytes.**  The paper (§3.2): an all-to-all of M elements over P GPUs moves
M/P per link, so per layer Q, K, V and O cost **4Nh/P** elements per link
(N = b·s tokens, h = d), constant when N and P grow together (Megatron-SP:
4Nh, :func:`minipar.plan.activations.ulysses_alltoall_elements_per_link`).
Counted exactly, a rank holds Nh/P of each and keeps 1/P of that, so it sends

    4·b·s·d·(P−1)/P²  elements per layer forward (the same backward)

= the paper's 4Nh/P × (P−1)/P
(:func:`~minipar.parallel.context_parallel.measure.ulysses_bytes_per_rank`, exact also
when P does not divide).  Requires H divisible by P (each rank a whole number of
heads) and s by P, and contiguous positions (no zigzag): the all-to-all joins the
ranks' chunks in rank order, which is the sequence's order only when rank r holds the
r-th s/P positions (:func:`minipar.parallel.context_parallel.options.check`).
Activation memory of attention per rank: q, k, v of all positions for H/P
heads and the H/P·s² softmax, 1/P of the serial layer's (the s² term stays:
Ulysses divides it by P, ring attention removes it).
"""

from __future__ import annotations

from typing import Any

from minipar.backend import xp
from minipar.comm.traced import traced
from minipar.nn.attention import (
    attention_core_backward,
    attention_core_forward,
    merge_heads,
    split_heads,
)
from minipar.parallel.mappings import all_to_all

__all__ = ["OP", "ulysses_attention_backward", "ulysses_attention_forward"]

OP = "ulysses_a2a"


def _heads(n_head: int, n_kv_head: int, P: int) -> tuple[int, int]:
    """(K', copies): the key/value heads that travel — K, or with fewer than P of them each
    copied to the P/K ranks whose query heads read it (K' = P)."""
    copies = max(P // n_kv_head, 1)
    return n_kv_head * copies, copies


def ulysses_attention_forward(comm: Any, qkv: Any, n_head: int, n_kv_head: int | None = None,
                              attend: Any = attention_core_forward) -> tuple[Any, tuple]:
    """Causal attention of my positions' fused ``qkv`` (b, t, (H + 2K)·d_h) ->
    ``(o (b, t, H·d_h), saved)``.  ``attend(q, k, v) -> (o, saved)``: the attention of the
    gathered positions, my heads (default the serial core; USP: ring attention)."""
    P, kv = traced(comm).size, n_kv_head or n_head
    b, t, width = qkv.shape
    dh = width // (n_head + 2 * kv)
    kvp, copies = _heads(n_head, kv, P)
    q, k, v = xp.split(qkv, [n_head * dh, (n_head + kv) * dh], axis=-1)
    k, v = (xp.repeat(a.reshape(b, t, kv, dh), copies, axis=2) for a in (k, v))
    x = xp.concatenate([a.reshape(b, t, P, -1) for a in (q, k, v)], axis=-1)  # rank p's heads
    full = all_to_all.forward(comm, x, split_axis=2, concat_axis=1, op=OP)[:, :, 0]
    q, k, v = xp.split(full, [n_head // P * dh, (n_head + kvp) // P * dh], axis=-1)
    o, s_core = attend(*(split_heads(a, a.shape[-1] // dh) for a in (q, k, v)))
    mine = all_to_all.backward(comm, o.transpose(0, 2, 1, 3), split_axis=2, concat_axis=1,
                               op=OP)  # (b, t, H, dh): my positions, every head
    return mine.reshape(b, t, n_head * dh), (s_core, (b, t, n_head, kv, copies, dh))


def ulysses_attention_backward(comm: Any, saved: tuple, do: Any,
                               attend_backward: Any = attention_core_backward) -> Any:
    """d(qkv) (b, t, (H + 2K)·d_h) for the output gradient ``do`` (b, t, H·d_h): the two
    all-to-alls' adjoints, in reverse order, around the core's backward (``attend``'s:
    ``attend_backward(saved, do) -> (dq, dk, dv)``); a copied key/value head's gradient
    summed over its copies."""
    s_core, (b, t, n_head, kv, copies, dh) = saved
    P = traced(comm).size
    do_full = all_to_all.forward(comm, do.reshape(b, t, n_head, dh), split_axis=2,
                                 concat_axis=1, op=OP)  # (b, s, H/P, dh)
    grads = attend_backward(s_core, do_full.transpose(0, 2, 1, 3))
    d_full = xp.concatenate([merge_heads(g) for g in grads], axis=-1)[:, :, None]
    dx = all_to_all.backward(comm, d_full, split_axis=2, concat_axis=1, op=OP)  # (b, t, P, w)
    w = [n_head // P * dh, (n_head // P + kv * copies // P) * dh]
    dq, dk, dv = xp.split(dx, w, axis=-1)
    dk, dv = (a.reshape(b, t, kv, copies, dh).sum(axis=3).reshape(b, t, -1) for a in (dk, dv))
    return xp.concatenate([dq.reshape(b, t, -1), dk, dv], axis=-1)
