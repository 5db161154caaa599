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
from minipar.nn.attention import attention_core_backward, attention_core_forward
from minipar.parallel.mappings import all_to_all

__all__ = ["OP", "ulysses_attention_backward", "ulysses_attention_forward"]

OP = "ulysses_a2a"


def ulysses_attention_forward(comm: Any, qkv: Any, n_head: int) -> tuple[Any, tuple]:
    """Causal attention of my positions' fused ``qkv`` (b, t, 3d) -> ``(o (b, t, d), saved)``."""
    b, t, three_d = qkv.shape
    d = three_d // 3
    x = qkv.reshape(b, t, 3, n_head, d // n_head)
    full = all_to_all.forward(comm, x, split_axis=3, concat_axis=1, op=OP)  # (b, s, 3, H/P, dh)
    q, k, v = (full[:, :, i].transpose(0, 2, 1, 3) for i in range(3))  # (b, H/P, s, dh) views
    o, s_core = attention_core_forward(q, k, v)
    mine = all_to_all.backward(comm, o.transpose(0, 2, 1, 3), split_axis=2, concat_axis=1,
                               op=OP)  # (b, t, H, dh): my positions, every head
    return mine.reshape(b, t, d), (s_core, x.shape)


def ulysses_attention_backward(comm: Any, saved: tuple, do: Any) -> Any:
    """d(qkv) (b, t, 3d) for the output gradient ``do`` (b, t, d): the two all-to-alls'
    adjoints, in reverse order, around the serial core's backward."""
    s_core, (b, t, _, n_head, dh) = saved
    do_full = all_to_all.forward(comm, do.reshape(b, t, n_head, dh), split_axis=2,
                                 concat_axis=1, op=OP)  # (b, s, H/P, dh)
    dq, dk, dv = attention_core_backward(s_core, do_full.transpose(0, 2, 1, 3))
    d_full = xp.stack([g.transpose(0, 2, 1, 3) for g in (dq, dk, dv)], axis=2)
    dx = all_to_all.backward(comm, d_full, split_axis=3, concat_axis=1, op=OP)  # (b, t, 3, H, dh)
    return dx.reshape(b, t, 3 * n_head * dh)

