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
