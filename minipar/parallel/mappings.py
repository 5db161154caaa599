"""Megatron's mappings: the conjugate pairs, each collective's backward its adjoint (f and g).

EN conjugate communication pairs (f and g operators) · RU сопряжённые пары обменов
(операторы f и g) · ZH 共轭通信对（f 与 g 算子）

Tensor, sequence, context and expert parallelism move their activations and
their gradients through these pairs (Megatron-LM ``mappings.py``: Shoeybi et
al. 2019, arXiv 1909.08053; the sequence pairs: Korthikanti et al. 2022, arXiv
2205.05198; all-to-all: Jacobs et al. 2023, DeepSpeed-Ulysses, arXiv 2309.14509;
expert dispatch: Lepikhin et al. 2020, GShard, arXiv 2006.16668).  What else
moves is said where it happens: the vocab-parallel cross-entropy's two small
all-reduces, ``gather_output``'s all-gather of columns, sequence parallelism's
sums of the replicated parameters' gradients, ring attention's point-to-point.

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

=======  ===============================================  ==============  ==============
pair     name (Megatron's)                                forward         backward
=======  ===============================================  ==============  ==============
f        ``copy_to_tensor_model_parallel_region``         identity        all-reduce
g        ``reduce_from_tensor_model_parallel_region``     all-reduce      identity
SP's f   ``gather_from_sequence_parallel_region``         all-gather      reduce-scatter
SP's g   ``reduce_scatter_to_sequence_parallel_region``   reduce-scatter  all-gather
a2a      ``all_to_all``                                   all-to-all      the reverse one
=======  ===============================================  ==============  ==============

f enters a column-parallel region, g leaves a row-parallel one (tensor parallelism).
Sequence parallelism is tensor parallelism with g split in two: all-reduce =
reduce-scatter + all-gather along the sequence, so SP moves the same bytes as TP and
keeps the LayerNorm regions sharded along the sequence in between.  The all-to-all
is Ulysses' (heads <-> sequence) and the experts' dispatch and combine.

**Bytes per rank** (S = bytes of the full activation; ring collectives, exact when N
divides the split axis; the exact figures for any length:
:func:`minipar.parallel.mappings_measure.pair_bytes_sent`): f, g one all-reduce,
**2(N-1)/N x S**; SP's f, SP's g one all-gather and one reduce-scatter, **(N-1)/N x S**
each; all-to-all **(N-1)/N x S/N** each way.

**Contract.**  Each pair is a :class:`Pair`: ``forward(comm, x, **kw)`` and
``backward(comm, dy, **kw)`` with the same keywords; arrays in, new arrays out (the
identity returns its input: it costs nothing).  Splits follow :mod:`minipar.spans`
(the ``numpy.array_split`` order), so any length works; the sequence axis is ``axis``
(default 1 of a (batch, seq, hidden) activation).  Bytes are counted under the pair's
name (``"tp_f"``, ``"tp_g"``, ``"sp_f"``, ``"sp_g"``, ``"a2a"``; ``op=`` renames, e.g.
``"ep_dispatch"``).  Bad input (an axis out of range, sizes that do not add up) is a
one-line ``ValueError`` before any message; shapes that differ across ranks are caught
by the collectives (:class:`~minipar.comm.errors.CollectiveMismatchError`).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from minipar import backend, checks, spans
from minipar.collectives import allreduce, alltoall
from minipar.collectives.ring import all_gather, reduce_scatter
from minipar.comm.tags import dtype_code
from minipar.comm.traced import traced

__all__ = ["PAIRS", "PER_RANK", "REPLICATED", "Pair", "all_to_all",
           "copy_to_tensor_model_parallel_region", "gather_from_sequence_parallel_region",
           "reduce_from_tensor_model_parallel_region",
           "reduce_scatter_to_sequence_parallel_region"]

#: an array every rank holds alike (one vector) / each rank its own (N components)
REPLICATED, PER_RANK = "replicated", "per-rank"


@dataclass(frozen=True)
class Pair:
    """A collective and its adjoint: ``forward(comm, x, **kw)``, ``backward(comm, dy, **kw)``.

    ``forward_collective(comm, x, op, **kw)`` / ``backward_collective``: the two maps,
    counted under ``op`` (default the pair's ``name``); ``domain`` / ``codomain``:
    whether the forward's input / output is replicated or per-rank."""

    name: str
    forward_collective: Callable[..., Any]
    backward_collective: Callable[..., Any]
    domain: str = PER_RANK
    codomain: str = PER_RANK

    def forward(self, comm: Any, x: Any, *, op: str | None = None, **kw: Any) -> Any:
        return self.forward_collective(comm, _array(x), op or self.name, **kw)

    def backward(self, comm: Any, dy: Any, *, op: str | None = None, **kw: Any) -> Any:
        return self.backward_collective(comm, _array(dy), op or self.name, **kw)


def _array(x: Any) -> Any:
    a = backend.array_module(x).asarray(x)  # a device array stays on the device
    dtype_code(a.dtype)  # unsupported dtype: ValueError before any message
    return a


def _axis(shape: tuple[int, ...], axis: int, what: str) -> int:
    """``axis`` normalised to 0..ndim-1, or a ValueError naming the shape."""
    nd = len(shape)
    if not checks.is_integer(axis) or not -nd <= axis < nd:
        raise ValueError(f"{what}: axis {axis!r} is out of range for an array of shape "
                         f"{shape} (0..{nd - 1}, or negative from the end)")
    return int(axis) % nd


# ------------------------------------------------------------------------ f and g
def _identity(comm: Any, x: Any, op: str, algorithm: str = "ring") -> Any:
    return x  # no message, no copy


def _all_reduce(comm: Any, x: Any, op: str, algorithm: str = "ring") -> Any:
    """The sum over the ranks (``algorithm`` as :func:`~minipar.collectives.allreduce`)."""
    c = traced(comm)
    with c.operation(op):
        return allreduce(c, x, "sum", algorithm)


# ------------------------------------------------------ SP's f and g (along the sequence)
def _all_gather_along(comm: Any, x: Any, op: str, axis: int = 1) -> Any:
    """Every rank's array_split part of ``axis``, joined; each rank checks its share."""
    ax, am, c = _axis(x.shape, axis, op), backend.array_module(x), traced(comm)
    with c.operation(op):
        full = all_gather(c, am.moveaxis(x, ax, 0))
    want = spans.counts(full.shape[0], c.size)[c.rank]
    if x.shape[ax] != want:
        raise ValueError(f"{op}: rank {c.rank} holds {x.shape[ax]} of the {full.shape[0]} "
                         f"positions along axis {ax}; the array_split rule gives it {want} "
                         "(shard with minipar.spans)")
    return am.moveaxis(full, 0, ax)


def _reduce_scatter_along(comm: Any, x: Any, op: str, axis: int = 1) -> Any:
    """The sum over the ranks, of which each keeps its array_split part of ``axis``."""
    ax, am, c = _axis(x.shape, axis, op), backend.array_module(x), traced(comm)
    with c.operation(op):
        part = reduce_scatter(c, am.moveaxis(x, ax, 0))
    return am.moveaxis(part, 0, ax)


# ------------------------------------------------ all-to-all (Ulysses, expert dispatch)
def _all_to_all(comm: Any, x: Any, op: str, split_axis: int = 2, concat_axis: int = 1,
                split_sizes: Sequence[int] | None = None,
                output_sizes: Sequence[int] | None = None) -> Any:
    """Split ``split_axis`` into N parts (``split_sizes``, default array_split), part i to
    rank i, join what arrives along ``concat_axis`` (checked against ``output_sizes``,
    default array_split).  Ulysses: (b, s/N, H, d) -> (b, s, H/N, d); expert dispatch:
    ``split_axis == concat_axis`` (tokens), sizes from the routing."""
    c, am = traced(comm), backend.array_module(x)
    n, r = c.size, c.rank
    sa, ca = _axis(x.shape, split_axis, op), _axis(x.shape, concat_axis, op)
    sizes = _sizes(split_sizes, n, f"{op} split sizes") or spans.counts(x.shape[sa], n)
    expect = _sizes(output_sizes, n, f"{op} output sizes")
    if sum(sizes) != x.shape[sa]:
        raise ValueError(f"{op}: split sizes {sizes} do not add up to the "
                         f"{x.shape[sa]} positions along axis {sa}")
    known = list(x.shape)  # a received part's shape, but for its concat length
    known[ca] = 1
    if sa != ca:
        known[sa] = sizes[r]
        if min(sizes) == 0:
            raise ValueError(f"{op}: axis {sa} of {x.shape[sa]} positions split into "
                             f"{sizes} leaves a rank with none, whose part's shape its "
                             f"receiver could not tell: it needs >= {n} positions")
    per_position = int(np.prod(known, dtype=np.int64))
    if per_position == 0:
        raise ValueError(f"{op}: the array of shape {x.shape} has an empty axis besides "
                         f"axis {ca}: the parts received would hold no elements")
    parts = [am.ascontiguousarray(x[(slice(None),) * sa + (slice(o, o + k),)]).reshape(-1)
             for o, k in zip(spans.offsets(sizes), sizes)]
    with c.operation(op):
        got = alltoall.all_to_all(c, parts)
    lengths = [g.size // per_position for g in got]
    want = expect if expect is not None else spans.counts(sum(lengths), n)
    if lengths != want:
        raise ValueError(f"{op}: rank {r} received {lengths} positions along axis {ca} "
                         f"from ranks 0..{n - 1}, not the " + ("output sizes" if expect
                         else "array_split parts") + f" {want} (pass output_sizes)")
    return am.concatenate([g.reshape(known[:ca] + [k] + known[ca + 1:])
                           for g, k in zip(got, lengths)], axis=ca)


def _all_to_all_reverse(comm: Any, dy: Any, op: str, split_axis: int = 2,
                        concat_axis: int = 1, split_sizes: Sequence[int] | None = None,
                        output_sizes: Sequence[int] | None = None) -> Any:
    """The forward's all-to-all undone (axes and sizes swapped): a permutation's inverse
    is its transpose.  Takes the forward's keywords unchanged."""
    return _all_to_all(comm, dy, op, concat_axis, split_axis, output_sizes, split_sizes)


def _sizes(sizes: Sequence[int] | None, world: int, what: str) -> list[int] | None:
    if sizes is None:
        return None
    if len(sizes) != world or any(int(k) != k or k < 0 for k in sizes):
        raise ValueError(f"{what}: {list(sizes)} must be {world} non-negative integers, "
                         "one per rank")
    return [int(k) for k in sizes]


# -------------------------------------------------------------------------- the pairs
#: f: enter a column-parallel region (its input replicated, its gradient summed)
copy_to_tensor_model_parallel_region = Pair("tp_f", _identity, _all_reduce,
                                            REPLICATED, PER_RANK)
#: g: leave a row-parallel region (partial sums in, their sum replicated out)
reduce_from_tensor_model_parallel_region = Pair("tp_g", _all_reduce, _identity,
                                                PER_RANK, REPLICATED)
#: SP's f: a sequence shard in, the whole sequence out
gather_from_sequence_parallel_region = Pair("sp_f", _all_gather_along, _reduce_scatter_along)
#: SP's g: partial sums in, this rank's sequence shard of their sum out
reduce_scatter_to_sequence_parallel_region = Pair("sp_g", _reduce_scatter_along,
                                                  _all_gather_along)
#: Ulysses' and the experts' all-to-all, its backward the reverse one
all_to_all = Pair("a2a", _all_to_all, _all_to_all_reverse)

#: every pair, in the order of the table above
PAIRS: tuple[Pair, ...] = (copy_to_tensor_model_parallel_region,
                           reduce_from_tensor_model_parallel_region,
                           gather_from_sequence_parallel_region,
                           reduce_scatter_to_sequence_parallel_region, all_to_all)
