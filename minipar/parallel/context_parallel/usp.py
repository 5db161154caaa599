"""USP: Ulysses inside a group, ring attention across groups — USP (Ulysses × кольцо) —
USP（组内 Ulysses × 组间环形注意力）.

EN unified sequence parallelism (USP, Ulysses × ring) · RU унифицированный параллелизм
по последовательности (Ulysses × кольцо) · ZH 统一序列并行（Ulysses × 环）

Fang & Zhao 2024, "USP: A Unified Sequence Parallelism Approach for Long Context
Generative AI", arXiv 2405.07719; Megatron-Core's ``cp_comm_type = "a2a+p2p"``.  The cp
ranks form a 2-D grid of R ring groups × U Ulysses ranks (cp = U·R): rank (g, u) = g·U + u.
The sequence is cut over the R groups as ring attention cuts it (zigzag: group g holds
chunks g and 2R−1−g) and each group's positions over its U ranks, contiguously:

    qkv (b, s/(RU), H, ·)  --a2a in my group-->  (b, s/R, H/U, ·)   Ulysses: heads ↔ sequence
    ring attention over the R ranks with my Ulysses index (same heads, the groups' K/V)
    o   (b, s/R, H/U, d_h) --a2a⁻¹ in my group-->  (b, s/(RU), H, d_h)

Ulysses alone needs cp ≤ H (each rank whole heads); the ring alone sends K and V P−1
hops and cannot hide them behind short blocks.  USP lifts the first limit (U ≤ H, R any)
and keeps the bandwidth-hungry all-to-all inside a group (a node), the ring's
point-to-point hops across groups.

**Bytes per rank per layer** (exact: the two parts of
:mod:`~minipar.parallel.context_parallel.measure`): the Ulysses all-to-alls of a
sequence of s/R over U ranks, (2H + 2K')·b·(s/(RU))·d_h·(U−1)/U each way, plus ring
attention over R ranks on K'/U key/value heads, 2(R−1)·b·(s/R)·K'·d_h/U forward
(K' = max(K, U): with fewer key/value heads than U each is copied).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from minipar.parallel.context_parallel import ulysses
from minipar.parallel.context_parallel.layout import Sharding
from minipar.parallel.context_parallel.ring_attention import (
    ring_attention_backward,
    ring_attention_forward,
)

__all__ = ["USPSharding", "usp_attention_backward", "usp_attention_forward"]


def usp_attention_forward(groups: tuple[Any, Any], qkv: Any, n_head: int, n_kv_head: int,
                          layout: Sharding) -> tuple[Any, tuple]:
    """Causal attention of my positions' fused ``qkv``; ``groups`` = (my Ulysses group, my
    ring), ``layout`` the ring's cut of the sequence over the R groups."""
    a2a, ring = groups

    def attend(q: Any, k: Any, v: Any) -> tuple[Any, tuple]:
        return ring_attention_forward(ring, q, k, v, layout)

    return ulysses.ulysses_attention_forward(a2a, qkv, n_head, n_kv_head, attend)


def usp_attention_backward(groups: tuple[Any, Any], saved: tuple, do: Any) -> Any:
    """d(qkv) of my positions: the all-to-alls' adjoints around ring attention's backward."""
    a2a, ring = groups

    def attend_backward(s: tuple, d: Any) -> tuple[Any, Any, Any]:
        return ring_attention_backward(ring, s, d)

    return ulysses.ulysses_attention_backward(a2a, saved, do, attend_backward)


@dataclass(frozen=True)
class USPSharding:
    """Which positions rank g·U + u holds: the ring's cut of the sequence over the R groups
    (``ring``, zigzag or not), group g's positions then cut over its U ranks in order."""

    ring: Sharding
    U: int

    @property
    def P(self) -> int:
        return self.ring.P * self.U

    def positions(self, rank: int) -> np.ndarray:
        g, u = divmod(rank, self.U)
        mine = self.ring.positions(g)
        t = len(mine) // self.U
        return mine[u * t:(u + 1) * t]
