"""ZeRO's shards: which slice of the flat buffer each rank owns — шарды ZeRO — ZeRO 的分片.

EN parameter / gradient partitioning · RU разбиение параметров и градиентов ·
ZH 参数与梯度分区

Rajbhandari et al. 2019, "ZeRO", arXiv 1910.02054, §5 (P_os, P_g, P_p).
Rank r of N owns the slice ``[lo_r, hi_r)`` of the flat buffer of Ψ elements
(:func:`shard_range`, the ``numpy.array_split`` rule of :mod:`minipar.spans`:
C_r = Ψ//N elements, one more for the first Ψ mod N ranks).  A unit
(:mod:`minipar.nn.units`: embedding, block, head) is the span ``[a, b)`` of the
buffer (:func:`unit_table`, :func:`units_table`); its part on rank r is the
overlap of the two (:func:`overlap`), and rank q's part of a unit holds

    max(0, min(b, hi_q) - max(a, lo_q))  elements,

so the units' parts tile the shards: gathering every unit once moves exactly
one all-gather of the buffer.  Example: Ψ = 10 on N = 3 gives [0, 4), [4, 7),
[7, 10); the unit [3, 8) is 1, 3 and 1 elements on ranks 0, 1, 2.
"""

from __future__ import annotations

import functools
from typing import Any

from minipar import spans
from minipar.nn.gpt import GPT, GPTConfig
from minipar.nn.units import Unit
from minipar.nn.units import spans as unit_spans
from minipar.optim import FlatParams


def shard_range(psi: int, world: int, rank: int) -> tuple[int, int]:
    """[lo, hi) of the flat buffer of ``psi`` elements that ``rank`` owns (array_split rule)."""
    if world > psi:
        raise ValueError(f"{world} ranks but only {psi} parameters to shard: every rank must own "
                         "at least one element; use fewer ranks or a bigger model")
    return spans.span(psi, world, rank)


@functools.lru_cache(maxsize=16)
def layout_of(cfg: GPTConfig) -> FlatParams:
    """The flat buffer's layout (cached: one table per configuration, not per engine)."""
    return FlatParams.from_shapes(GPT(cfg).param_shapes())


@functools.lru_cache(maxsize=16)
def unit_table(cfg: GPTConfig) -> tuple[tuple[Unit, int, int, FlatParams], ...]:
    """(unit, lo, hi, the unit's own layout by local name) for each unit of the GPT, in
    buffer order (cached per configuration, like :func:`layout_of`)."""
    return units_table(GPT(cfg).units(), layout_of(cfg))


def units_table(units: Any, layout: FlatParams) -> tuple[tuple[Unit, int, int, FlatParams], ...]:
    """:func:`unit_table` of any units that tile ``layout`` in order (a pipeline stage's)."""
    out = []
    for u, (lo, hi) in zip(units, unit_spans(units, layout)):
        shapes = {n: layout.shapes[layout.names.index(u.prefix + n)] for n in u.names}
        out.append((u, lo, hi, FlatParams.from_shapes(shapes)))
    return tuple(out)


def overlap(a: int, b: int, lo: int, hi: int) -> tuple[int, int]:
    """[a, b) ∩ [lo, hi) as offsets into [lo, hi) (an empty range when they do not meet)."""
    start = min(max(a, lo), hi)
    return start - lo, max(min(b, hi), start) - lo
