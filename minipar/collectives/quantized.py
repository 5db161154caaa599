"""Quantized collectives of ZeRO++ — квантованные коллективы — 量化集合通信.

EN quantized communication · RU квантованный обмен · ZH 量化通信

Wang et al. 2023, "ZeRO++", arXiv 2306.10209, §3.1 (qwZ) and §3.3 (qgZ).  A part
of a flat buffer travels as its block-quantized values followed by one scale per
block (:mod:`minipar.quantize`: blocks of ``block`` elements cut from the start of
the part, scale = amax / max_finite, the scales in the part's own dtype), so a part
of n elements of itemsize b weighs, on the wire (:func:`packed_size`),

    int8:  n + ceil(n / block)·b  bytes        int4:  ceil(n / 2) + ceil(n / block)·b

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
  Σ_{j≠k} Σ_{m'} packed_size(n_{m'K+j}) inside its node and
  Σ_{m'≠m} packed_size(n_{m'K+k}) across nodes.

Both are exact functions of the packed parts, so a serial run that calls
:func:`roundtrip` and :func:`add` on the same parts in the same order gets the same
bits (:mod:`minipar.parallel.zero.oracle`).
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from minipar.collectives import _base as B
from minipar.collectives.alltoall import all_to_all
from minipar.collectives.iring import RingAllgatherRequest
from minipar.quantize import dequantize, pack_int4, quantize, unpack_int4


def packed_size(n: int, fmt: str, block: int, itemsize: int) -> int:
    """Bytes of a part of ``n`` elements on the wire: values, then one scale per block."""
    return (n + 1) // 2 * (fmt == "int4") + n * (fmt == "int8") + math.ceil(n / block) * itemsize


def pack(x: Any, fmt: str, block: int) -> Any:
    """``x`` (flat) quantized in blocks of ``block``: its values, then its scales, as bytes."""
    q, scales = quantize(x, fmt, (block,))
    values = pack_int4(q) if fmt == "int4" else q.view(np.uint8)
    return np.concatenate([values, scales.astype(x.dtype).view(np.uint8)])


def unpack(buf: Any, n: int, fmt: str, block: int, dtype: Any) -> Any:
    """The ``n`` dequantized elements (``dtype``) of :func:`pack`'s bytes."""
    k = (n + 1) // 2 if fmt == "int4" else n
    q = unpack_int4(buf[:k], n) if fmt == "int4" else buf[:k].view(np.int8)
    scales = buf[k:].view(dtype)
    return dequantize(q, scales, fmt, (block,), (n,)).astype(dtype)


def roundtrip(x: Any, fmt: str, block: int) -> Any:
    """What a receiver makes of ``x``: packed, then unpacked."""
    return unpack(pack(x, fmt, block), x.size, fmt, block, x.dtype)


def add(parts: list[Any]) -> Any:
    """Σ parts, in order, in their dtype (the higher precision of the reduction)."""
    acc = parts[0].copy()
    for p in parts[1:]:
        acc += p
    return acc


class QuantizedAllgather(RingAllgatherRequest):
    """qwZ: all-gather every rank's ``part`` (``counts[r]`` elements on rank r) as
    ``fmt`` blocks of ``block``; ``wait()`` returns the dequantized concatenation."""

    def __init__(self, comm: Any, part: Any, counts: list[int], tag: int, block: int,
                 fmt: str = "int8") -> None:
        self.sizes, self.fmt, self.block, self.dtype = list(counts), fmt, block, part.dtype
        wire = [packed_size(k, fmt, block, part.dtype.itemsize) for k in counts]
        super().__init__(comm, pack(part, fmt, block), wire, tag, name="qwz_all_gather")

    def result(self) -> Any:
        return np.concatenate([unpack(self.chunk(i), k, self.fmt, self.block, self.dtype)
                               for i, k in enumerate(self.sizes)])


def _exchange(comm: Any, parts: list[list[Any]], block: int, fmt: str, op: str) -> list[Any]:
    """Send ``parts[j]`` (a list of flat arrays) to rank j, each packed; the list, by
    source rank, of the dequantized lists received (one rank: the parts as they are)."""
    if comm.size == 1:
        return [parts[0]]
    sent = [np.concatenate([pack(p, fmt, block) for p in ps]) for ps in parts]
    mine = parts[comm.rank]
    with B.traced(comm).operation(op):
        got = all_to_all(comm, sent)
    out = []
    for buf in got:
        cut = np.cumsum([0] + [packed_size(p.size, fmt, block, p.dtype.itemsize) for p in mine])
        out.append([unpack(buf[a:b], p.size, fmt, block, p.dtype)
                    for a, b, p in zip(cut[:-1], cut[1:], mine)])
    return out


def hierarchical_reduce_scatter(node: Any, cross: Any, flat: Any, counts: list[int],
                                block: int, fmt: str = "int4") -> Any:
    """qgZ: this rank's part (``counts``, rank r = mK + k) of Σ over the ranks of ``flat``,
    by two quantized all-to-alls: ``node`` (the K ranks of my node, my rank k) and
    ``cross`` (the M ranks with my local rank, one per node, my rank m)."""
    K, M = node.size, cross.size
    offs = B.offsets_of(list(counts))
    part = [flat[o:o + c] for o, c in zip(offs, counts)]
    to_local = [[part[m * K + j] for m in range(M)] for j in range(K)]
    got = _exchange(node, to_local, block, fmt, "qgz_all_to_all_node")
    summed = [add([g[m] for g in got]) for m in range(M)]  # the node's sum of part (m, k)
    got = _exchange(cross, [[s] for s in summed], block, fmt, "qgz_all_to_all_cross")
    return add([g[0] for g in got])
