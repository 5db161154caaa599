"""Quantized collectives of ZeRO++ — квантованные коллективы — 量化集合通信.

EN quantized communication · RU квантованный обмен · ZH 量化通信

Wang et al. 2023, "ZeRO++", arXiv 2306.10209, §3.1 (qwZ) and §3.3 (qgZ).  A part
of a flat buffer travels as a *codec* packs it into bytes (``codec.pack(x)``,
``codec.unpack(buf, n, dtype)``, ``codec.size(n, dtype)`` bytes: ZeRO++'s
:class:`~minipar.parallel.zero.zeropp.BlockCodec`, block-quantized values followed by
one scale per block), so a part of n elements of itemsize b weighs, with blocks of B,

    int8:  n + ceil(n / B)·b  bytes        int4:  ceil(n / 2) + ceil(n / B)·b

* :class:`QuantizedAllgather` (qwZ): the ring all-gather of
  :mod:`minipar.collectives.iring` over the packed parts, dequantized when done —
  rank r sends every packed part but rank r+1's: Σ_{i≠r+1} packed_size(n_i);
* :func:`hierarchical_reduce_scatter` (qgZ): a reduce-scatter made of two
  all-to-alls of int4 parts, within the node and then across nodes.  Rank r = mK + k
  (node m of M, local rank k of K) owns part r.  Hop 1, in the node: local rank j
  gets the parts of the ranks (m', j), every m' (ZeRO++'s "tensor slice
  reordering"); each receiver dequantizes the K contributions and adds them in local
  rank order, in the buffer's dtype.  Hop 2, across nodes: the node's sum of part
  (m', k) is re-quantized and goes to rank (m', k), which adds the M dequantized sums
  in node order.  A hop of one rank sends nothing and quantizes nothing.  Rank r sends
  Σ_{j≠k} Σ_{m'} size(n_{m'K+j}) inside its node and Σ_{m'≠m} size(n_{m'K+k}) across.

Both are exact functions of the packed parts, so a serial run that packs and unpacks
the same parts and calls :func:`add` in the same order gets the same bits
(:mod:`minipar.parallel.zero.oracle`).  (The codec comes from the caller: the
collectives sit below the quantizers, :mod:`minipar.quantize`.)
"""

from __future__ import annotations

from typing import Any

import numpy as np

from minipar.collectives import _base as B
from minipar.collectives.alltoall import all_to_all
from minipar.collectives.iring import RingAllgatherRequest


def add(parts: list[Any]) -> Any:
    """Σ parts, in order, in their dtype (the higher precision of the reduction)."""
    acc = parts[0].copy()
    for p in parts[1:]:
        acc += p
    return acc


class QuantizedAllgather(RingAllgatherRequest):
    """qwZ: all-gather every rank's ``part`` (``counts[r]`` elements on rank r) as
    ``codec`` packs it; ``wait()`` returns the unpacked concatenation."""

    def __init__(self, comm: Any, part: Any, counts: list[int], tag: int, codec: Any) -> None:
        self.sizes, self.codec, self.dtype = list(counts), codec, part.dtype
        wire = [codec.size(k, part.dtype) for k in counts]
        super().__init__(comm, codec.pack(part), wire, tag, name="qwz_all_gather")

    def result(self) -> Any:
        return np.concatenate([self.codec.unpack(self.chunk(i), k, self.dtype)
                               for i, k in enumerate(self.sizes)])


def _exchange(comm: Any, parts: list[list[Any]], codec: Any, op: str) -> list[Any]:
    """Send ``parts[j]`` (a list of flat arrays) to rank j, each packed; the list, by
    source rank, of the unpacked lists received (one rank: the parts as they are)."""
    if comm.size == 1:
        return [parts[0]]
    sent = [np.concatenate([codec.pack(p) for p in ps]) for ps in parts]
    mine = parts[comm.rank]
    with B.traced(comm).operation(op):
        got = all_to_all(comm, sent)
    cut = np.cumsum([0] + [codec.size(p.size, p.dtype) for p in mine])
    return [[codec.unpack(buf[a:b], p.size, p.dtype) for a, b, p in zip(cut[:-1], cut[1:], mine)]
            for buf in got]


def hierarchical_reduce_scatter(node: Any, cross: Any, flat: Any, counts: list[int],
                                codec: Any) -> Any:
    """qgZ: this rank's part (``counts``, rank r = mK + k) of Σ over the ranks of ``flat``,
    by two all-to-alls of parts packed by ``codec``: ``node`` (the K ranks of my node, my
    rank k) and ``cross`` (the M ranks with my local rank, one per node, my rank m)."""
    K, M = node.size, cross.size
    offs = B.offsets_of(list(counts))
    part = [flat[o:o + c] for o, c in zip(offs, counts)]
    to_local = [[part[m * K + j] for m in range(M)] for j in range(K)]
    got = _exchange(node, to_local, codec, "qgz_all_to_all_node")
    summed = [add([g[m] for g in got]) for m in range(M)]  # the node's sum of part (m, k)
    got = _exchange(cross, [[s] for s in summed], codec, "qgz_all_to_all_cross")
    return add([g[0] for g in got])
