"""Tensor (intra-layer) model parallelism: all-reduces per layer and bytes per rank.

EN tensor parallelism · RU тензорный параллелизм · ZH 张量并行

Megatron-LM (Shoeybi, Patwary, Puri, LeGresley, Casper & Catanzaro 2019,
arXiv 1909.08053).  The MLP splits its first weight by columns (GELU stays
local) and its second by rows; attention splits Q, K, V by columns (heads)
and the output projection by rows.  Two conjugate operators glue the
pieces: f (identity forward, all-reduce backward) and g (all-reduce forward,
identity backward).  Per transformer layer that is

    2 all-reduces forward + 2 backward,  each of b·s·h elements

(b micro-batch, s sequence, h hidden), so with a ring each of the t ranks
sends 4 × 2(t−1)/t × b·s·h·bytes per layer per training step.  Sequence
parallelism (Korthikanti et al. 2022, arXiv 2205.05198) turns each
all-reduce into a reduce-scatter + all-gather pair: the same bytes.
"""

from __future__ import annotations

from minipar.plan._check import count, positive
from minipar.plan.collectives import ring_allreduce_volume

TP_ALLREDUCES_FORWARD = 2  #: g after attention, g after the MLP
TP_ALLREDUCES_BACKWARD = 2  #: f before attention, f before the MLP


def tp_allreduces_per_layer(backward: bool = True) -> int:
    """All-reduces one transformer layer needs: 2 forward (+ 2 backward)."""
    return TP_ALLREDUCES_FORWARD + (TP_ALLREDUCES_BACKWARD if backward else 0)


def tp_allreduce_bytes(b: int, s: int, h: int, bytes_per_elem: float = 2) -> float:
    """Size in bytes of one TP all-reduce buffer: b·s·h activations (16-bit by default)."""
    return (count("b", b) * count("s", s) * count("h", h)
            * positive("bytes_per_elem", bytes_per_elem))


def tp_bytes_per_rank_per_layer(
    b: int, s: int, h: int, t: int, bytes_per_elem: float = 2, backward: bool = True
) -> float:
    """Bytes each of t ranks sends per layer: n_allreduce × 2(t−1)/t × b·s·h·bytes (ring)."""
    return tp_allreduces_per_layer(backward) * ring_allreduce_volume(
        tp_allreduce_bytes(b, s, h, bytes_per_elem), t)


def tp_bytes_per_rank(
    n_layer: int, b: int, s: int, h: int, t: int,
    bytes_per_elem: float = 2, backward: bool = True,
) -> float:
    """Bytes each TP rank sends per step for ``n_layer`` layers (ring all-reduces)."""
    return count("n_layer", n_layer) * tp_bytes_per_rank_per_layer(
        b, s, h, t, bytes_per_elem, backward)


#: what Megatron cuts t ways, and why: the rule of tensor (and sequence) parallelism's sizes
TP_CUTS = (("heads", "each rank takes heads/t whole heads"),
           ("d_ff", "each rank takes d_ff/t MLP columns"),
           ("vocab", "each rank takes vocab/t embedding rows"))
SP_CUT = ("seq", "each rank keeps seq/t positions")


def tp_indivisible(t: int, heads: int, d_ff: int, vocab: int | None = None,
                   seq: int | None = None) -> list[tuple[str, int, str]]:
    """``(name, size, why)`` of every size that ``t`` does not divide — heads, the MLP width,
    the vocabulary (when given) and, for sequence parallelism, the sequence (when given):
    empty when the model cuts ``t`` ways.  The one home of this rule; each caller says it
    in its own words (an engine names the sizes, the command line its options)."""
    sizes = {"heads": heads, "d_ff": d_ff, "vocab": vocab, "seq": seq}
    return [(what, sizes[what], why) for what, why in (*TP_CUTS, SP_CUT)
            if sizes[what] is not None and sizes[what] % t]


def check_tp_sizes(t: int, heads: int, d_ff: int, vocab: int, seq: int | None = None, *,
                   sequence_parallel: bool = False, experts: int = 0,
                   kv_heads: int | None = None) -> None:
    """ValueError naming the first size ``t`` does not divide (``seq``: checked when given);
    sequence parallelism also refuses a mixture of experts; ``kv_heads`` K (grouped-query
    attention) must be a multiple of t (K/t per rank) or divide it (each key/value head
    replicated on t/K ranks).  Every rank raises alike."""
    if kv_heads and kv_heads % t and t % kv_heads:
        raise ValueError(f"kv_heads = {kv_heads} and the tensor-parallel size t = {t}: one "
                         f"must divide the other (K/t key/value heads per rank, or each "
                         f"replicated on t/K ranks)")
    for what, n, why in tp_indivisible(t, heads, d_ff, vocab, seq):
        if what == "seq":
            raise ValueError(f"sequence length {n} is not divisible by the sequence-parallel "
                             f"size t = {t}: {why}")
        raise ValueError(f"{what} = {n} is not divisible by the tensor-parallel size "
                         f"t = {t}: {why}")
    if sequence_parallel and experts:
        raise ValueError("sequence parallelism with a mixture of experts is not built: "
                         "use tensor parallelism alone (run tp) for an MoE GPT")
