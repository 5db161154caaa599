"""The all-to-all pair — пара all-to-all — 全交换算子对: DeepSpeed-Ulysses and expert dispatch.

EN all-to-all pair · RU пара «всё-ко-всем» · ZH 全交换算子对

Jacobs et al. 2023, "DeepSpeed Ulysses", arXiv 2309.14509 (sequence ↔ heads);
Lepikhin et al. 2020, GShard, arXiv 2006.16668 (tokens to their experts and
back).  The backward of an all-to-all is the reverse all-to-all: a
permutation's inverse is its transpose.  Part of :mod:`minipar.comm.pairs`
(the table, the adjoint test), which re-exports it.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from minipar import spans
from minipar.collectives import _base as B
from minipar.collectives.alltoall import all_to_all as _all_to_all
from minipar.comm.pair_base import Pair, _array, _axis


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
        c = B.traced(comm)
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
        parts = [np.ascontiguousarray(np.take(x, range(o, o + k), axis=sa)).reshape(-1)
                 for o, k in zip(spans.offsets(sizes), sizes)]
        with c.operation(op):
            got = _all_to_all(c, parts)
        lengths = [g.size // per_position for g in got]
        want = expect if expect is not None else spans.counts(sum(lengths), n)
        if lengths != want:
            raise ValueError(f"{what}: rank {r} received {lengths} positions along axis {ca} "
                             f"from ranks 0..{n - 1}, not the " + ("output sizes" if expect
                             else "array_split parts") + f" {want} (pass output_sizes)")
        return np.concatenate([g.reshape(known[:ca] + [k] + known[ca + 1:])
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
