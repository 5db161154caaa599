"""How much communication was hidden behind computation: one figure, one name.

EN communication overlap · RU перекрытие обменов с вычислениями · ZH 通信与计算重叠

Every run that overlaps communication with computation (DDP's buckets, ZeRO-3's
prefetch, tensor parallelism's decomposed GEMMs, DualPipe's overlapped pairs)
records, per rank, when it computed and when a message was in flight, as
``(start, end)`` intervals in seconds.  The share of the communication time
that fell inside some computation is

    hidden_fraction = |comm ∩ compute| / |comm|

with each side first merged into disjoint intervals, so two messages in flight
at once count once.  1.0: every byte moved while the rank computed; 0.0: the
rank computed nothing while it waited.  Every run summary and benchmark that
reports overlap uses this function and this key, ``hidden_fraction``.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

Interval = tuple[float, float]


def merge(intervals: Iterable[Sequence[float]]) -> list[Interval]:
    """The union of ``intervals`` as disjoint ``(start, end)`` pairs, sorted; empty ones dropped."""
    out: list[list[float]] = []
    for a, b in sorted((float(a), float(b)) for a, b in intervals):
        if b < a:
            raise ValueError(f"an interval ends before it starts: ({a}, {b})")
        if b == a:
            continue
        if out and a <= out[-1][1]:
            out[-1][1] = max(out[-1][1], b)
        else:
            out.append([a, b])
    return [(a, b) for a, b in out]


def total(intervals: Iterable[Sequence[float]]) -> float:
    """Seconds covered by ``intervals`` (overlaps counted once)."""
    return sum(b - a for a, b in merge(intervals))


def overlap(xs: Iterable[Sequence[float]], ys: Iterable[Sequence[float]]) -> float:
    """Seconds covered by both ``xs`` and ``ys``."""
    x, y = merge(xs), merge(ys)
    i = j = 0
    both = 0.0
    while i < len(x) and j < len(y):
        lo, hi = max(x[i][0], y[j][0]), min(x[i][1], y[j][1])
        both += max(0.0, hi - lo)
        if x[i][1] < y[j][1]:
            i += 1
        else:
            j += 1
    return both


def hidden_fraction(compute: Iterable[Sequence[float]],
                    comm: Iterable[Sequence[float]]) -> float | None:
    """Share of ``comm``'s time covered by ``compute`` (None when nothing was communicated)."""
    comm = merge(comm)
    spent = sum(b - a for a, b in comm)
    if spent == 0.0:
        return None
    return overlap(compute, comm) / spent
