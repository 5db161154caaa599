"""Which positions each context-parallel rank holds — разбиение последовательности — 序列切分.

EN sequence sharding (contiguous and zigzag) · RU разбиение последовательности
(сплошное и зигзагом) · ZH 序列切分（连续与之字形）

Context parallelism (:mod:`minipar.parallel.context_parallel.engine`) cuts the s
positions of every row over P ranks.  *Contiguous*: rank r holds chunk r of
s/P positions.  *Zigzag* (ring attention's load balance; Brandon et al. 2023,
"Striped Attention", arXiv 2311.09431; Megatron-LM's context parallelism):
the sequence is cut into 2P chunks of c = s/(2P) and rank r holds chunks r
and 2P−1−r, so under the causal mask every rank has the same work::

    s = 16, P = 2, c = 4:   rank 0: positions 0-3 and 12-15,  rank 1: 4-7 and 8-11

Also the checks, here because they need no MPI: ``minipar run cp`` calls
:func:`check` in the launching process, the ranks call it again before any
message.  Each names the numbers that do not divide.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from minipar import checks

__all__ = ["KINDS", "Sharding", "check", "sharding"]

#: the two routes for attention's keys and values
KINDS = ("ulysses", "ring")


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


def check(seq: int, heads: int, cp: int, kind: str, zigzag: bool, experts: int = 0) -> None:
    """ValueError naming the numbers unless a CP run of this kind can be cut as asked."""
    checks.one_of("--kind", kind, KINDS)
    if experts:
        raise ValueError(f"context parallelism runs a dense GPT here; got --experts {experts} "
                         "(an MoE would route each rank's tokens as a group of its own)")
    if kind == "ulysses":
        if zigzag:
            raise ValueError("--zigzag balances ring attention's causal work; Ulysses "
                             "attends over the whole sequence on every rank: use --no-zigzag")
        if heads % cp:
            raise ValueError(f"DeepSpeed-Ulysses: --heads {heads} is not divisible by "
                             f"cp = {cp}: each rank takes a whole number of heads")
    if cp >= 1 and seq % (2 * cp if zigzag else cp):  # Sharding's check, naming the options
        how = (f"2·cp = {2 * cp} (zigzag: rank r holds chunks r and 2·cp−1−r; --no-zigzag "
               f"needs only cp = {cp})" if zigzag else f"cp = {cp}")
        raise ValueError(f"--seq {seq} is not divisible by {how}: every context-parallel rank "
                         "needs equal chunks")
    Sharding(seq, cp, zigzag)


def sharding(seq: int, cp: int, kind: str, zigzag: bool) -> Sharding:
    """Which positions each rank holds (Ulysses: contiguous chunks)."""
    return Sharding(seq, cp, zigzag and kind == "ring")
