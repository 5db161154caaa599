"""Megatron's mappings: the conjugate pairs, each collective's backward its adjoint (f and g).

EN conjugate communication pairs (f and g operators) · RU сопряжённые пары обменов
(операторы f и g) · ZH 共轭通信对（f 与 g 算子）

Tensor, sequence, context and expert parallelism are built from these pairs and
nothing else (Megatron-LM ``mappings.py``: Shoeybi et al. 2019, arXiv 1909.08053;
the sequence pairs: Korthikanti et al. 2022, arXiv 2205.05198; all-to-all:
Jacobs et al. 2023, DeepSpeed-Ulysses, arXiv 2309.14509; expert dispatch:
Lepikhin et al. 2020, GShard, arXiv 2006.16668).

**The conjugate idea.**  A collective is a linear map A of the ranks' arrays.
Backpropagation multiplies the gradient by the transpose: if y = A x then
dx = A^T dy, the map with ``<A x, dy> = <x, A^T dy>`` for every x and dy (the
*adjoint*).  So the backward of each collective is another collective, fixed by
that identity.  The inner product runs over everything the ranks hold: a
**per-rank** array (a shard, a partial sum, a rank's own copy) adds its local
``<a_r, b_r>`` over the ranks; a **replicated** array (the same numbers on every
rank) is *one* vector and counts once.  That is why f's backward is an
all-reduce: f turns one replicated x into N copies that the ranks then use
differently, so their gradients must be summed; g does the opposite.

======  ========================  ====================  ====================  ==================
pair    name                      forward               backward (adjoint)    used by
======  ========================  ====================  ====================  ==================
f       ``copy_to_parallel``      identity              all-reduce            TP: enter a
                                                                              column-parallel
                                                                              region
g       ``reduce_from_parallel``  all-reduce            identity              TP: leave a
                                                                              row-parallel one
SP's f  ``gather_from_sequence``  all-gather (seq)      reduce-scatter (seq)  SP (in place of f)
SP's g  ``scatter_to_sequence``   reduce-scatter (seq)  all-gather (seq)      SP (in place of g)
a2a     ``all_to_all``            all-to-all            the reverse one       Ulysses, expert
                                                                              dispatch/combine
======  ========================  ====================  ====================  ==================

(Megatron: ``copy_to_tensor_model_parallel_region``,
``reduce_from_tensor_model_parallel_region``,
``gather_from_sequence_parallel_region``,
``reduce_scatter_to_sequence_parallel_region``, ``all_to_all``.)  Sequence
parallelism is tensor parallelism with g split in two: all-reduce =
reduce-scatter + all-gather, so SP moves the same bytes as TP and keeps the
LayerNorm regions sharded along the sequence in between.

**Bytes per rank** (S = bytes of the full activation, e.g. b·s·h x itemsize; ring
collectives, exact when N divides the split axis; the exact figures for any
length are :meth:`Pair.bytes_sent`, built on :mod:`minipar.collectives.cost`):

* f, g: one ring all-reduce, **2(N-1)/N x S** (f backward, g forward);
* SP's f, SP's g: one all-gather and one reduce-scatter, **(N-1)/N x S** each,
  2(N-1)/N x S per forward+backward, as f and g;
* all-to-all: each rank keeps 1/N of its local S/N bytes and sends the rest,
  **(N-1)/N x S/N** = (N-1)/N² x S each way.

**Contract.**  Each pair is an object with ``forward(comm, x, ...)`` and
``backward(comm, dy, ...)`` (the same keyword arguments in both); arrays in, new
arrays out (f's forward and g's backward return ``x`` itself: identity costs
nothing).  Splits follow :mod:`minipar.spans` (the ``numpy.array_split`` order),
so any length works; the sequence axis is ``axis`` (default 1, of a
(batch, seq, hidden) activation).  Bytes are counted under the pair's operation
name (``"tp_f"``, ``"tp_g"``, ``"sp_f"``, ``"sp_g"``, ``"a2a"``; ``op=``
renames, e.g. ``"ep_dispatch"``), forward and backward alike.  Local errors
(axis out of range, bad sizes, too short a split axis) are ``ValueError`` before
any message; shapes that differ across ranks are caught by the collectives
(:class:`~minipar.comm.errors.CollectiveMismatchError`, a ``ValueError``).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from minipar import backend, checks, spans
from minipar.collectives import allreduce, alltoall, cost
from minipar.collectives.ring import all_gather, reduce_scatter
from minipar.comm.tags import dtype_code
from minipar.comm.traced import traced

__all__ = ["PAIRS", "PER_RANK", "REPLICATED", "AllToAll", "CopyToParallel", "GatherFromSequence",
           "Pair", "ReduceFromParallel", "ScatterToSequence", "adjoint_sides", "all_to_all",
           "copy_to_parallel", "dot", "gather_from_sequence", "reduce_from_parallel",
           "scatter_to_sequence"]


# ------------------------------------------------------------ what every pair shares
REPLICATED, PER_RANK = "replicated", "per-rank"


def _axis(shape: tuple[int, ...], axis: int, what: str) -> int:
    """``axis`` normalised to 0..ndim-1, or a ValueError naming the shape."""
    nd = len(shape)
    if not checks.is_integer(axis) or not -nd <= axis < nd:
        raise ValueError(f"{what}: axis {axis!r} is out of range for an array of shape "
                         f"{shape} (0..{nd - 1}, or negative from the end)")
    return int(axis) % nd


def _array(x: Any) -> np.ndarray:
    a = backend.array_module(x).asarray(x)  # a device array stays on the device
    dtype_code(a.dtype)  # unsupported dtype: ValueError before any message
    return a


class Pair:
    """A collective and its adjoint: ``forward(comm, x, **kw)``, ``backward(comm, dy, **kw)``.

    ``domain`` / ``codomain``: whether the forward's input / output is
    replicated (one vector, counted once in the inner product) or per-rank
    (each rank's array its own component); the backward maps the other way.
    ``bytes_sent(full_shape, itemsize, world, rank, **kw)`` -> (forward,
    backward) bytes rank ``rank`` sends, exactly, for the whole array's shape.
    """

    name = letter = megatron = ""  # counters' operation name; f, g, ...; Megatron's function
    forward_collective = backward_collective = ""
    domain = codomain = PER_RANK

    def __repr__(self) -> str:
        return (f"<pair {self.letter} ({self.name}): forward {self.forward_collective}, "
                f"backward {self.backward_collective}>")


# ------------------------------------------------------------------------ f and g
def _sum(comm: Any, x: Any, op: str, algorithm: str) -> np.ndarray:
    a = _array(x)
    c = traced(comm)
    with c.operation(op):
        return allreduce(c, a, "sum", algorithm)


class CopyToParallel(Pair):
    """Megatron's **f**: forward identity, backward all-reduce (sum).

    Its input is replicated (e.g. the input of a column-parallel linear); each
    rank uses its copy with its own weight columns, so the gradients differ
    by rank and dx is their sum.  ``algorithm``: as :func:`allreduce` (the
    ring by default, whose bytes SP's pairs match).
    """

    name, letter, megatron = "tp_f", "f", "copy_to_tensor_model_parallel_region"
    forward_collective, backward_collective = "identity", "all-reduce"
    domain, codomain = REPLICATED, PER_RANK

    def forward(self, comm: Any, x: Any, *, op: str | None = None,
                algorithm: str = "ring") -> np.ndarray:
        return _array(x)  # x itself: no message, no copy

    def backward(self, comm: Any, dy: Any, *, op: str | None = None,
                 algorithm: str = "ring") -> np.ndarray:
        return _sum(comm, dy, op or self.name, algorithm)

    def bytes_sent(self, full_shape: Sequence[int], itemsize: int, world: int, rank: int, *,
                   algorithm: str = "ring") -> tuple[int, int]:
        n = int(np.prod(full_shape, dtype=np.int64))
        return 0, cost.allreduce_bytes_sent(n, itemsize, world, rank, algorithm)


class ReduceFromParallel(Pair):
    """Megatron's **g**: forward all-reduce (sum of partial results), backward identity.

    Each rank holds a partial sum (a row-parallel linear: its rows of W times
    its slice of x); the sum is replicated, and so is its gradient, which
    every rank passes back unchanged.
    """

    name, letter, megatron = "tp_g", "g", "reduce_from_tensor_model_parallel_region"
    forward_collective, backward_collective = "all-reduce", "identity"
    domain, codomain = PER_RANK, REPLICATED

    def forward(self, comm: Any, x: Any, *, op: str | None = None,
                algorithm: str = "ring") -> np.ndarray:
        return _sum(comm, x, op or self.name, algorithm)

    def backward(self, comm: Any, dy: Any, *, op: str | None = None,
                 algorithm: str = "ring") -> np.ndarray:
        return _array(dy)  # dy itself: no message, no copy

    def bytes_sent(self, full_shape: Sequence[int], itemsize: int, world: int, rank: int, *,
                   algorithm: str = "ring") -> tuple[int, int]:
        return CopyToParallel.bytes_sent(self, full_shape, itemsize, world, rank,
                                         algorithm=algorithm)[::-1]


# --------------------------------------------------- SP's f and g (along the sequence)
def _gather_seq(comm: Any, x: np.ndarray, axis: int, op: str, what: str) -> np.ndarray:
    """All-gather the shards along ``axis``; each rank checks its share is array_split's."""
    ax = _axis(x.shape, axis, what)
    c = traced(comm)
    with c.operation(op):
        full = all_gather(c, backend.array_module(x).moveaxis(x, ax, 0))
    want = spans.counts(full.shape[0], c.size)[c.rank]
    if x.shape[ax] != want:
        raise ValueError(f"{what}: rank {c.rank} holds {x.shape[ax]} of the {full.shape[0]} "
                         f"positions along axis {ax}; the array_split rule gives it {want} "
                         "(shard with minipar.spans)")
    return backend.array_module(full).moveaxis(full, 0, ax)


def _reduce_scatter_seq(comm: Any, x: np.ndarray, axis: int, op: str, what: str) -> np.ndarray:
    """Sum over ranks, then keep this rank's array_split part along ``axis``."""
    ax = _axis(x.shape, axis, what)
    c = traced(comm)
    with c.operation(op):
        part = reduce_scatter(c, backend.array_module(x).moveaxis(x, ax, 0))
    return backend.array_module(part).moveaxis(part, 0, ax)


def _seq_bytes(full_shape: Sequence[int], itemsize: int, world: int, rank: int,
               axis: int) -> tuple[int, int]:
    """(all-gather, reduce-scatter) bytes sent along ``axis`` of ``full_shape``."""
    shape = tuple(int(d) for d in full_shape)
    ax = _axis(shape, axis, "bytes_sent")
    unit = itemsize * int(np.prod(shape[:ax] + shape[ax + 1:], dtype=np.int64))  # a position
    return (cost.all_gather_bytes(spans.counts(shape[ax], world), unit, rank)[0],
            cost.reduce_scatter_bytes(shape[ax], unit, world, rank)[0])


class GatherFromSequence(Pair):
    """SP's **f**: forward all-gather along the sequence, backward reduce-scatter along it.

    Each rank holds its array_split part of the sequence (a sequence-parallel
    LayerNorm's output); the column-parallel linear that follows needs all of
    it, and each rank uses its copy with its own weight columns, so the
    gradients are summed and each rank keeps its part.
    """

    name, letter, megatron = "sp_f", "SP's f", "gather_from_sequence_parallel_region"
    forward_collective, backward_collective = "all-gather (seq)", "reduce-scatter (seq)"

    def forward(self, comm: Any, x: Any, *, axis: int = 1, op: str | None = None) -> np.ndarray:
        return _gather_seq(comm, _array(x), axis, op or self.name, "gather_from_sequence")

    def backward(self, comm: Any, dy: Any, *, axis: int = 1,
                 op: str | None = None) -> np.ndarray:
        return _reduce_scatter_seq(comm, _array(dy), axis, op or self.name,
                                   "gather_from_sequence backward")

    def bytes_sent(self, full_shape: Sequence[int], itemsize: int, world: int, rank: int, *,
                   axis: int = 1) -> tuple[int, int]:
        return _seq_bytes(full_shape, itemsize, world, rank, axis)


class ScatterToSequence(Pair):
    """SP's **g**: forward reduce-scatter along the sequence, backward all-gather along it.

    In place of g after a row-parallel linear: the partial sums are reduced
    and each rank keeps only its part of the sequence (for the
    sequence-parallel LayerNorm that follows).
    """

    name, letter, megatron = "sp_g", "SP's g", "reduce_scatter_to_sequence_parallel_region"
    forward_collective, backward_collective = "reduce-scatter (seq)", "all-gather (seq)"

    def forward(self, comm: Any, x: Any, *, axis: int = 1, op: str | None = None) -> np.ndarray:
        return _reduce_scatter_seq(comm, _array(x), axis, op or self.name, "scatter_to_sequence")

    def backward(self, comm: Any, dy: Any, *, axis: int = 1,
                 op: str | None = None) -> np.ndarray:
        return _gather_seq(comm, _array(dy), axis, op or self.name,
                           "scatter_to_sequence backward")

    def bytes_sent(self, full_shape: Sequence[int], itemsize: int, world: int, rank: int, *,
                   axis: int = 1) -> tuple[int, int]:
        return _seq_bytes(full_shape, itemsize, world, rank, axis)[::-1]


# --------------------------------------------- all-to-all (Ulysses, expert dispatch)
def _sizes(sizes: Sequence[int] | None, world: int, what: str) -> list[int] | None:
    if sizes is None:
        return None
    if len(sizes) != world or any(int(k) != k or k < 0 for k in sizes):
        raise ValueError(f"{what}: {list(sizes)} must be {world} non-negative integers, "
                         "one per rank")
    return [int(k) for k in sizes]


class AllToAll(Pair):
    """All-to-all: split ``split_axis`` into N parts, part i to rank i, join along ``concat_axis``.

    DeepSpeed-Ulysses (defaults, a (batch, seq, heads, head_dim) array): each
    rank holds its part of the sequence with every head and gets the whole
    sequence for its part of the heads; the backward is the reverse all-to-all
    (the axes and the sizes swapped), a permutation's inverse being its
    transpose.  Expert dispatch: ``split_axis == concat_axis`` (tokens) and
    ``split_sizes`` = tokens per destination rank; the combine is the backward.

    ``split_sizes`` (default array_split) must be the same on every rank when
    the axes differ; ``output_sizes``, the lengths along ``concat_axis`` of the
    parts received (default: they must follow array_split), are checked on
    arrival.  ``backward`` takes the forward's keyword arguments unchanged.
    """

    name, letter, megatron = "a2a", "a2a", "all_to_all"
    forward_collective = backward_collective = "all-to-all"

    def forward(self, comm: Any, x: Any, *, split_axis: int = 2, concat_axis: int = 1,
                split_sizes: Sequence[int] | None = None,
                output_sizes: Sequence[int] | None = None,
                op: str | None = None) -> np.ndarray:
        return self._exchange(comm, _array(x), split_axis, concat_axis, split_sizes,
                              output_sizes, op or self.name, "all_to_all")

    def backward(self, comm: Any, dy: Any, *, split_axis: int = 2, concat_axis: int = 1,
                 split_sizes: Sequence[int] | None = None,
                 output_sizes: Sequence[int] | None = None,
                 op: str | None = None) -> np.ndarray:
        return self._exchange(comm, _array(dy), concat_axis, split_axis, output_sizes,
                              split_sizes, op or self.name, "all_to_all backward")

    @staticmethod
    def _exchange(comm: Any, x: np.ndarray, split_axis: int, concat_axis: int,
                  split_sizes: Sequence[int] | None, output_sizes: Sequence[int] | None,
                  op: str, what: str) -> np.ndarray:
        c = traced(comm)
        n, r = c.size, c.rank
        sa, ca = _axis(x.shape, split_axis, what), _axis(x.shape, concat_axis, what)
        sizes = _sizes(split_sizes, n, f"{what} split sizes")
        expect = _sizes(output_sizes, n, f"{what} output sizes")
        if sizes is None:
            sizes = spans.counts(x.shape[sa], n)
        elif sum(sizes) != x.shape[sa]:
            raise ValueError(f"{what}: split sizes {sizes} do not add up to the "
                             f"{x.shape[sa]} positions along axis {sa}")
        known = list(x.shape)  # a received part's shape, but for its concat length
        known[ca] = 1
        if sa != ca:
            known[sa] = sizes[r]
            if min(sizes) == 0:
                raise ValueError(f"{what}: axis {sa} of {x.shape[sa]} positions split into "
                                 f"{sizes} leaves a rank with none, whose part's shape its "
                                 f"receiver could not tell: it needs >= {n} positions")
        per_position = int(np.prod(known, dtype=np.int64))
        if per_position == 0:
            raise ValueError(f"{what}: the array of shape {x.shape} has an empty axis besides "
                             f"axis {ca}: the parts received would hold no elements")
        am = backend.array_module(x)
        parts = [am.ascontiguousarray(x[(slice(None),) * sa + (slice(o, o + k),)]).reshape(-1)
                 for o, k in zip(spans.offsets(sizes), sizes)]
        with c.operation(op):
            got = alltoall.all_to_all(c, parts)
        lengths = [g.size // per_position for g in got]
        want = expect if expect is not None else spans.counts(sum(lengths), n)
        if lengths != want:
            raise ValueError(f"{what}: rank {r} received {lengths} positions along axis {ca} "
                             f"from ranks 0..{n - 1}, not the " + ("output sizes" if expect
                             else "array_split parts") + f" {want} (pass output_sizes)")
        return am.concatenate([g.reshape(known[:ca] + [k] + known[ca + 1:])
                               for g, k in zip(got, lengths)], axis=ca)

    def bytes_sent(self, full_shape: Sequence[int], itemsize: int, world: int, rank: int, *,
                   split_axis: int = 2, concat_axis: int = 1) -> tuple[int, int]:
        """(forward, backward) bytes sent, array_split on both axes (Ulysses' layout).

        ``full_shape`` is the whole array (e.g. (b, s, heads, d)); rank r holds
        s_r positions of ``concat_axis`` before and c_r of ``split_axis`` after:
        forward s_r·(H - c_r)·rest, backward c_r·(S - s_r)·rest elements.
        """
        shape = tuple(int(d) for d in full_shape)
        sa, ca = _axis(shape, split_axis, "bytes_sent"), _axis(shape, concat_axis, "bytes_sent")
        if sa == ca:
            raise ValueError("bytes_sent: with split_axis == concat_axis (expert dispatch) "
                             "the bytes depend on the routing: count rows sent elsewhere")
        H, S = shape[sa], shape[ca]
        rest = itemsize * int(np.prod([d for i, d in enumerate(shape) if i not in (sa, ca)],
                                      dtype=np.int64))
        c, s = spans.counts(H, world)[rank], spans.counts(S, world)[rank]
        return s * (H - c) * rest, c * (S - s) * rest


# ---------------------------------------------------------- the table, the adjoint test
copy_to_parallel = CopyToParallel()
reduce_from_parallel = ReduceFromParallel()
gather_from_sequence = GatherFromSequence()
scatter_to_sequence = ScatterToSequence()
all_to_all = AllToAll()

#: every pair, in the order of the table above
PAIRS: tuple[Pair, ...] = (copy_to_parallel, reduce_from_parallel, gather_from_sequence,
                           scatter_to_sequence, all_to_all)


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
