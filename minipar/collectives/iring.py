"""Non-blocking ring all-gather, reduce-scatter — неблокирующие кольца — 非阻塞环形收集与散射.

The two halves of :mod:`minipar.collectives.ring` as *state machines*, like the
non-blocking all-reduce of :mod:`minipar.collectives.nonblocking`: posted now,
advanced by ``progress()`` from inside the computation, finished by ``wait()``.
What ZeRO-3 with prefetching needs (FSDP's and DeepSpeed's prefetch, Zhao et al.
2023, arXiv 2304.11277; Rajbhandari et al. 2019, arXiv 1910.02054): the next
unit's all-gather moves while this unit computes, a unit's gradient
reduce-scatter while the backward of the unit before it runs.

The steps are the blocking ring's, chunk for chunk (chunks of ``counts[i]``
elements, which may be 0, e.g. a unit's parts cut at the ZeRO shard borders):

* all-gather, step s of N-1: send chunk (r-s) mod N right, receive chunk
  (r-s-1) mod N from the left where it belongs;
* reduce-scatter, step s of N-1: send the partial sum of chunk (r-s-1) mod N
  right, receive chunk (r-s-2) mod N from the left and add it to the own copy
  (own + received, the blocking ring's order: the same sums, bit for bit).

So the bytes are the blocking form's (:func:`minipar.collectives.cost.all_gather_bytes`,
:func:`~minipar.collectives.cost.reduce_scatter_bytes`), counted under the same
operation names (``"all_gather"``, ``"reduce_scatter"``) unless told otherwise.
Each request in flight between the same ranks needs its own tag of the
non-blocking range (:func:`minipar.comm.tags.nonblocking_tag`).
"""

from __future__ import annotations

import time
from typing import Any

from minipar import backend
from minipar.collectives import _base as B
from minipar.comm import tags as T


class _RingRequest:
    """N-1 ring steps over ``buf`` (chunks ``counts``), one posted at a time."""

    def __init__(self, comm: Any, buf: Any, counts: list[int], tag: int, name: str) -> None:
        if tag not in T.NONBLOCKING:
            raise ValueError(f"a non-blocking ring's tag must lie in {T.NONBLOCKING.first}.."
                             f"{T.NONBLOCKING.last}, got {tag!r}")
        self.comm, self.buf, self.tag, self.name = B.traced(comm), buf, int(tag), name
        if len(counts) != self.comm.size or sum(counts) != buf.size or min(counts) < 0:
            raise ValueError(f"{name}: counts {list(counts)} must be {self.comm.size} "
                             f"non-negative chunk sizes summing to {buf.size}")
        self.counts, self.offs = list(counts), B.offsets_of(list(counts))
        self.step, self.reqs = 0, []
        self.t_start: float = time.perf_counter()
        self.t_end: float | None = None
        if self.comm.size > 1:
            self._post()
        else:
            self._finished()

    @property
    def done(self) -> bool:
        return self.t_end is not None

    def chunk(self, i: int) -> Any:
        i %= self.comm.size
        return self.buf[self.offs[i]: self.offs[i] + self.counts[i]]

    def _post(self) -> None:
        send, recv = self._sendrecv()
        r, n = self.comm.rank, self.comm.size
        with self.comm.operation(self.name):
            self.reqs = [self.comm.Irecv(recv, (r - 1) % n, self.tag),
                         self.comm.Isend(send, (r + 1) % n, self.tag)]

    def _finished(self) -> None:
        self.reqs, self.t_end = [], time.perf_counter()

    def _advance(self) -> None:
        self._received()
        self.step += 1
        if self.step < self.comm.size - 1:
            self._post()
        else:
            self._finished()

    def progress(self) -> bool:
        """Finish every step whose messages arrived and post the next; True when done."""
        while not self.done and all(q.Test() for q in self.reqs):
            self._advance()
        return self.done

    def wait(self) -> Any:
        """Finish all steps (under the deadlock watchdog); the result."""
        while not self.done:
            self.comm.waitall(self.reqs)
            self._advance()
        return self.result()


class RingAllgatherRequest(_RingRequest):
    """All-gather of every rank's ``part`` (``counts[r]`` elements on rank r) in flight;
    ``wait()`` returns the concatenation (1-D, ``sum(counts)`` elements)."""

    def __init__(self, comm: Any, part: Any, counts: list[int], tag: int,
                 name: str = "all_gather") -> None:
        c = B.traced(comm)
        buf = backend.array_module(part).empty(sum(counts), part.dtype)
        lo = B.offsets_of(list(counts))[c.rank]
        buf[lo:lo + part.size] = part.reshape(-1)
        super().__init__(c, buf, counts, tag, name)

    def _sendrecv(self) -> tuple[Any, Any]:
        r = self.comm.rank - self.step
        return self.chunk(r), self.chunk(r - 1)

    def _received(self) -> None:
        pass

    def result(self) -> Any:
        return self.buf


class RingReduceScatterRequest(_RingRequest):
    """Reduce-scatter (sum) of ``flat`` (1-D, the same length on every rank, cut into
    ``counts``) in flight; ``wait()`` returns this rank's chunk of the sum.  ``flat`` is
    reduced in place: pass an array of the request's own."""

    def __init__(self, comm: Any, flat: Any, counts: list[int], tag: int,
                 name: str = "reduce_scatter") -> None:
        self.scratch = backend.array_module(flat).empty(max(counts), flat.dtype)
        super().__init__(comm, flat, counts, tag, name)

    def _sendrecv(self) -> tuple[Any, Any]:
        r = self.comm.rank - self.step
        return self.chunk(r - 1), self.scratch[: self.counts[(r - 2) % self.comm.size]]

    def _received(self) -> None:
        i = self.comm.rank - self.step - 2
        mine = self.chunk(i)
        mine += self.scratch[: mine.size]

    def result(self) -> Any:
        return self.chunk(self.comm.rank)
