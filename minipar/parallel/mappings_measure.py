"""Measuring the conjugate pairs: the bytes each sends, and the adjoint test — измерение
сопряжённых пар: байты и проверка сопряжённости — 共轭通信对的测量：字节数与伴随检验.

EN conjugate pairs, measured · RU сопряжённые пары: измерения · ZH 共轭通信对：测量

The pairs themselves are :mod:`minipar.parallel.mappings`; this module holds what the
tests, the families' ``measure`` modules and the notebooks check them with:

* :func:`pair_bytes_sent` — the (forward, backward) bytes one rank sends in a pair,
  exactly, for the whole array's shape, built on :mod:`minipar.collectives.cost`
  (what the counters of a :class:`~minipar.comm.traced.TracedComm` must read);
* :func:`dot` and :func:`adjoint_sides` — the inner product of distributed arrays
  (a per-rank array adds its ranks' parts, a replicated one counts once) and the
  dot-product test ``<forward(x), dy> == <x, backward(dy)>`` that makes each backward
  the adjoint of its forward.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from minipar import backend, checks, spans
from minipar.collectives import allreduce, cost
from minipar.comm.traced import traced
from minipar.parallel.mappings import (
    PER_RANK,
    REPLICATED,
    Pair,
    all_to_all,
    copy_to_tensor_model_parallel_region,
    gather_from_sequence_parallel_region,
    reduce_from_tensor_model_parallel_region,
    reduce_scatter_to_sequence_parallel_region,
)

__all__ = ["adjoint_sides", "dot", "pair_bytes_sent"]


def _axis(shape: tuple[int, ...], axis: int) -> int:
    nd = len(shape)
    if not checks.is_integer(axis) or not -nd <= axis < nd:
        raise ValueError(f"pair_bytes_sent: axis {axis!r} is out of range for an array of "
                         f"shape {shape} (0..{nd - 1}, or negative from the end)")
    return int(axis) % nd


def _all_reduce_bytes(shape: tuple[int, ...], itemsize: int, world: int, rank: int,
                      algorithm: str = "ring") -> tuple[int, int]:
    """(identity, all-reduce): f's (forward, backward)."""
    n = int(np.prod(shape, dtype=np.int64))
    return 0, cost.allreduce_bytes_sent(n, itemsize, world, rank, algorithm)


def _sequence_bytes(shape: tuple[int, ...], itemsize: int, world: int, rank: int,
                    axis: int = 1) -> tuple[int, int]:
    """(all-gather, reduce-scatter) along ``axis``: SP's f's (forward, backward)."""
    ax = _axis(shape, axis)
    unit = itemsize * int(np.prod(shape[:ax] + shape[ax + 1:], dtype=np.int64))  # a position
    return (cost.all_gather_bytes(spans.counts(shape[ax], world), unit, rank)[0],
            cost.reduce_scatter_bytes(shape[ax], unit, world, rank)[0])


def _all_to_all_bytes(shape: tuple[int, ...], itemsize: int, world: int, rank: int,
                      split_axis: int = 2, concat_axis: int = 1) -> tuple[int, int]:
    """Ulysses' layout, array_split on both axes: rank r holds s_r positions of
    ``concat_axis`` before and c_r of ``split_axis`` after; forward s_r·(H - c_r)·rest,
    backward c_r·(S - s_r)·rest elements."""
    sa, ca = _axis(shape, split_axis), _axis(shape, concat_axis)
    if sa == ca:
        raise ValueError("pair_bytes_sent: with split_axis == concat_axis (expert dispatch) "
                         "the bytes depend on the routing: count rows sent elsewhere")
    H, S = shape[sa], shape[ca]
    rest = itemsize * int(np.prod([d for i, d in enumerate(shape) if i not in (sa, ca)],
                                  dtype=np.int64))
    c, s = spans.counts(H, world)[rank], spans.counts(S, world)[rank]
    return s * (H - c) * rest, c * (S - s) * rest


def pair_bytes_sent(pair: Pair, full_shape: Sequence[int], itemsize: int, world: int,
                    rank: int, **kw: Any) -> tuple[int, int]:
    """(forward, backward) bytes rank ``rank`` of ``world`` sends in ``pair`` for the whole
    array's ``full_shape`` (elements of ``itemsize`` bytes), exactly; ``kw``: the pair's
    keywords (``algorithm`` of f and g, ``axis`` of SP's, the all-to-all's axes)."""
    shape = tuple(int(d) for d in full_shape)
    if pair is copy_to_tensor_model_parallel_region:
        return _all_reduce_bytes(shape, itemsize, world, rank, **kw)
    if pair is reduce_from_tensor_model_parallel_region:
        return _all_reduce_bytes(shape, itemsize, world, rank, **kw)[::-1]
    if pair is gather_from_sequence_parallel_region:
        return _sequence_bytes(shape, itemsize, world, rank, **kw)
    if pair is reduce_scatter_to_sequence_parallel_region:
        return _sequence_bytes(shape, itemsize, world, rank, **kw)[::-1]
    if pair is all_to_all:
        return _all_to_all_bytes(shape, itemsize, world, rank, **kw)
    raise ValueError(f"pair_bytes_sent: {pair.name!r} is not a pair of minipar.parallel.mappings")


def dot(comm: Any, a: Any, b: Any, kind: str = PER_RANK) -> float:
    """The inner product of two distributed arrays, the same on every rank.

    ``kind="per-rank"``: Σ over ranks of the local ``<a_r, b_r>`` (an
    all-reduce of one float64, counted under ``"dot"``); ``"replicated"``: the
    local ``<a, b>`` once (a replicated array is one vector, not N).
    """
    am = backend.array_module(a)
    local = float(am.vdot(am.asarray(a, np.float64), am.asarray(b, np.float64)))
    if kind == REPLICATED:
        return local
    if kind != PER_RANK:
        raise ValueError(f"dot: kind {kind!r} is neither {PER_RANK!r} nor {REPLICATED!r}")
    c = traced(comm)
    with c.operation("dot"):
        return float(allreduce(c, np.array([local]), "sum", "ring")[0])


def adjoint_sides(comm: Any, pair: Pair, x: Any, dy: Any, **kw: Any) -> tuple[float, float]:
    """(<forward(x), dy>, <x, backward(dy)>): equal, up to rounding, for a true adjoint.

    ``x`` must be replicated (the same on every rank) when ``pair.domain`` is,
    ``dy`` when ``pair.codomain`` is.
    """
    lhs = dot(comm, pair.forward(comm, x, **kw), dy, pair.codomain)
    rhs = dot(comm, x, pair.backward(comm, dy, **kw), pair.domain)
    return lhs, rhs
