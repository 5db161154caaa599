"""Which positions each context-parallel rank holds — разбиение последовательности — 序列切分.

EN sequence sharding (contiguous and zigzag) · RU разбиение последовательности
(сплошное и зигзагом) · ZH 序列切分（连续与之字形）

Context parallelism (:mod:`minipar.parallel.context_parallel.engine`) cuts the s
positions of every row over P ranks.  *Contiguous*: rank r holds chunk r of
s/P positions.  *Zigzag* (ring attention's load balance; Brandon et al. 2023,
"Striped Attention", arXiv 2311.09431; Megatron-LM's context parallelism):
the sequence is cut into 2P chunks of c = s/(2P) and rank r holds chunks r
and 2P−1−r, so under the causal mask every rank has the same work.  Who holds
what, s = 16, P = 2 (c = 4)::

    positions    0-3    4-7    8-11   12-15
    contiguous   rank 0 rank 0 rank 1 rank 1
    zigzag       rank 0 rank 1 rank 1 rank 0

Under the causal mask query i sees keys 0 … i, so with contiguous chunks rank r
computes (r+1)·(s/P)² scores per head and rank P−1 does P times rank 0's work;
with zigzag chunks every rank computes (2P+1)·c².  A rank stores its chunks one
after the other (:meth:`Sharding.positions`: index the tokens with it).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from minipar import checks

__all__ = ["Sharding"]


@dataclass(frozen=True)
class Sharding:
    """How ``s`` positions are cut over ``P`` ranks: contiguous, or zigzag (chunks r, 2P−1−r)."""

    s: int
    P: int
    zigzag: bool = True

    def __post_init__(self) -> None:
        checks.integer("the context-parallel size", self.P, 1)
        parts = 2 * self.P if self.zigzag else self.P
        if self.s % parts:
            how = (f"2·cp = {parts} (zigzag: rank r holds chunks r and 2·cp−1−r)"
                   if self.zigzag else f"cp = {parts}")
            raise ValueError(f"sequence length {self.s} is not divisible by {how}: every "
                             "context-parallel rank needs equal chunks")

    def chunks(self, rank: int) -> list[tuple[int, int]]:
        """[(start, length)] of the positions ``rank`` holds, in the order it stores them."""
        if not 0 <= rank < self.P:
            raise ValueError(f"rank {rank} is outside 0..{self.P - 1}")
        if self.zigzag:
            c = self.s // (2 * self.P)
            return [(rank * c, c), ((2 * self.P - 1 - rank) * c, c)]
        c = self.s // self.P
        return [(rank * c, c)]

    def positions(self, rank: int) -> np.ndarray:
        """The positions ``rank`` holds, as one integer array (index the tokens with it)."""
        return np.concatenate([np.arange(a, a + n) for a, n in self.chunks(rank)])
