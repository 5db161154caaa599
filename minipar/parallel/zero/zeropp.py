"""ZeRO++: ZeRO-3 with quantized and hierarchical communication — ZeRO++ — ZeRO++.

EN ZeRO++ (qwZ, hpZ, qgZ) · RU ZeRO++ (квантованный обмен ZeRO-3) · ZH ZeRO++（量化通信的 ZeRO-3）

Wang et al. 2023, "ZeRO++: Extremely Efficient Collective Communication for Giant
Model Training", arXiv 2306.10209.  Three changes to ZeRO-3's hooks
(:class:`~minipar.parallel.zero.hooks.ZeroHooks`), any subset of them:

* **qwZ** (§3.1): a unit's forward all-gather sends the parts as int8 blocks of
  ``block`` elements, each block with its scale (:class:`BlockCodec`,
  :class:`~minipar.collectives.quantized.QuantizedAllgather`);
* **hpZ** (§3.2): each rank keeps the slice of every unit's gathered (dequantized)
  parameters that the secondary partition over its node gives it — the flat
  buffer cut into K node shards by the rank's local index k — and a unit's later
  fetches (its backward) all-gather these slices inside the node only;
* **qgZ** (§3.3): a unit's gradient reduce-scatter is the hierarchical all-to-all
  of int4 blocks (:func:`~minipar.collectives.quantized.hierarchical_reduce_scatter`).

N ranks in M nodes of K (``node``: my node's communicator, rank k; ``cross``: the
ranks with my local rank, rank m; dp rank r = mK + k).  Every rank quantizes the
same blocks of the same parts, so every rank computes with the same weights, and
the serial run that repeats the arithmetic on the same parts equals this one bit
for bit (:mod:`minipar.parallel.zero.oracle`).  The walk is always planned
(:meth:`~minipar.parallel.zero.hooks.ZeroHooks.plan`), so prefetching K units
posts their quantized all-gathers, and their node all-gathers once the secondary
slice they read exists.  A walk not planned (a pipeline's first step, which learns
its walk) is planned fetch by fetch: a unit's first fetch of a walk gathers globally and
keeps the slice, its later ones (other micro-batches' too) read the node.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from minipar.collectives.iring import RingAllgatherRequest
from minipar.collectives.quantized import QuantizedAllgather, hierarchical_reduce_scatter
from minipar.comm.tags import nonblocking_tag
from minipar.nn.units import Unit
from minipar.parallel.zero.hooks import ZeroHooks
from minipar.parallel.zero.shard import overlap, shard_range
from minipar.quantize import dequantize, pack_int4, quantize, unpack_int4

#: ZeRO++'s three parts
PARTS = ("qwz", "hpz", "qgz")


class BlockCodec:
    """A flat part on the wire: its values in ``fmt`` ("int8", or "int4" two to a byte),
    quantized in blocks of ``block`` elements from the part's start, then one scale per
    block in the part's dtype: ``size(n, dtype)`` = ceil(n/2) or n, + ceil(n/block)·b."""

    def __init__(self, fmt: str, block: int) -> None:
        self.fmt, self.block = fmt, block

    def size(self, n: int, dtype: Any) -> int:
        values = (n + 1) // 2 if self.fmt == "int4" else n
        return values + math.ceil(n / self.block) * np.dtype(dtype).itemsize

    def pack(self, x: Any) -> Any:
        q, scales = quantize(x, self.fmt, (self.block,))
        values = pack_int4(q) if self.fmt == "int4" else q.view(np.uint8)
        return np.concatenate([values, scales.astype(x.dtype).view(np.uint8)])

    def unpack(self, buf: Any, n: int, dtype: Any) -> Any:
        k = (n + 1) // 2 if self.fmt == "int4" else n
        q = unpack_int4(buf[:k], n) if self.fmt == "int4" else buf[:k].view(np.int8)
        return dequantize(q, buf[k:].view(dtype), self.fmt, (self.block,), (n,)).astype(dtype)

    def roundtrip(self, x: Any) -> Any:
        """What a receiver makes of ``x``."""
        return self.unpack(self.pack(x), x.size, x.dtype)


class ZeroPPHooks(ZeroHooks):
    """:class:`ZeroHooks` of stage 3 with ZeRO++'s ``parts`` (a subset of :data:`PARTS`),
    quantization blocks of ``block`` elements, over ``node`` and ``cross`` (the module
    docstring); ``secondary``: hpZ's slices by unit, this rank's of the node partition."""

    def __init__(self, *args: Any, parts: tuple[str, ...] = (), block: int = 256,
                 node: Any = None, cross: Any = None, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.parts, self.block, self.node, self.cross = tuple(parts), block, node, cross
        self.int8, self.int4 = BlockCodec("int8", block), BlockCodec("int4", block)
        size = self.shards[-1][1]
        self.node_shards = [shard_range(size, node.size, k) for k in range(node.size)]
        self.secondary: dict[str, Any] = {}

    def plan(self, order: list[str]) -> None:
        super().plan(order)
        self.secondary = {}  # this walk's forward keeps fresh slices

    def _later(self, k: int) -> bool:
        """Whether position ``k`` fetches a unit the walk fetched before (its backward)."""
        return "hpz" in self.parts and self.order[k] in self.order[:k]

    def _post(self, k: int) -> None:
        name = self.order[k]
        if k in self.inflight or (self._later(k) and name not in self.secondary):
            return  # (a node all-gather is posted once its forward kept the slice)
        a, b, _ = self.table[name]
        if self._later(k):
            counts = [max(0, min(b, hi) - max(a, lo)) for lo, hi in self.node_shards]
            self.inflight[k] = RingAllgatherRequest(self.node, self.secondary[name], counts,
                                                    nonblocking_tag(k))
            return
        i, j = overlap(a, b, *self.shard)
        if "qwz" in self.parts:
            self.inflight[k] = QuantizedAllgather(self.comm, self.states.params[i:j],
                                                  self._counts(a, b), nonblocking_tag(k),
                                                  self.int8)
        else:
            super()._post(k)

    def fetch(self, unit: Unit) -> dict[str, Any]:
        if self.stage == 3 and self.at == len(self.order):  # unplanned (a pipeline's first
            self.order.append(unit.name)  # step, learning its walk): planned fetch by fetch
        return super().fetch(unit)

    def _fetch_planned(self, unit: Unit) -> Any:
        first = not self._later(self.at)
        self._post(self.at)
        flat = super()._fetch_planned(unit)
        if first and "hpz" in self.parts:
            a, b, _ = self.table[unit.name]
            i, j = overlap(*self.node_shards[self.node.rank], a, b)
            self.secondary[unit.name] = flat[i:j].copy()
        return flat

    def on_grads(self, unit: Unit, grads: dict[str, Any]) -> None:
        if "qgz" not in self.parts:
            return super().on_grads(unit, grads)
        a, b, lay = self.table[unit.name]
        flat = lay.flatten({n: grads[n] for n in lay.names}, self.dtype)
        mine = hierarchical_reduce_scatter(self.node, self.cross, flat, self._counts(a, b),
                                           self.int4)
        i, j = overlap(a, b, *self.shard)
        if self.accumulate:
            self.states.grads[i:j] += mine
        else:
            self.states.grads[i:j] = mine
        self.progress()
