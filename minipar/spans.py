"""How minipar cuts n things into parts: the ``numpy.array_split`` rule, written once.

EN partitioning rule · RU правило разбиения · ZH 划分规则

Rows of a global batch over data-parallel ranks, elements of a flat
parameter buffer over ZeRO ranks or parameter servers, chunks of a ring
all-reduce over the ring: every split in minipar follows one rule, so a
learner who knows it can predict who holds what.  With n units and P parts,

    part i has  n // P + 1  units if  i < n % P,  else  n // P,

and the parts are contiguous and in order: part i is ``[lo_i, hi_i)`` with
``lo_i = i·(n // P) + min(i, n % P)``.  (B = 10 rows on 3 ranks: 4, 3, 3.)
"""

from __future__ import annotations


def _check(n: int, parts: int) -> None:
    if int(parts) != parts or parts < 1:
        raise ValueError(f"the number of parts must be a positive integer, got {parts!r}")
    if int(n) != n or n < 0:
        raise ValueError(f"the number of units to split must be a non-negative integer, got {n!r}")


def counts(n: int, parts: int) -> list[int]:
    """Sizes of the ``parts`` parts of ``n`` units (``numpy.array_split`` order)."""
    _check(n, parts)
    q, r = divmod(int(n), int(parts))
    return [q + 1 if i < r else q for i in range(int(parts))]


def offsets(sizes: list[int]) -> list[int]:
    """Where each part starts, given the parts' sizes (an exclusive prefix sum)."""
    out, acc = [], 0
    for k in sizes:
        out.append(acc)
        acc += k
    return out


def span(n: int, parts: int, i: int) -> tuple[int, int]:
    """``[lo, hi)``: the units of part ``i`` of ``parts`` parts of ``n`` units."""
    _check(n, parts)
    if int(i) != i or not 0 <= i < parts:
        raise ValueError(f"part {i!r} is outside 0..{int(parts) - 1}")
    q, r = divmod(int(n), int(parts))
    lo = int(i) * q + min(int(i), r)
    return lo, lo + q + (1 if i < r else 0)
