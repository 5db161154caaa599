"""Measured memory — измеренная память — 实测内存.

Two instruments, so that a claim about memory is a measurement:

* ``measure()`` — a context manager around a region of code reporting the
  tracemalloc *peak* and the bytes still held at its end, both relative to
  its start.  NumPy registers its array buffers with tracemalloc (an 8 MB
  array measured 8,000,128 bytes), so this sees arrays, not only Python
  objects.
* ``Ledger`` — bytes held by category, per rank: ``params``, ``grads``,
  ``optimizer states`` (fp32 master weights and moments) and
  ``activations`` (what forward saved for backward).  Each buffer counts
  once, however many views of it appear (q, k, v are views of one qkv
  array; every parameter is a view of the flat buffer).
* Places — ``device``, ``host``, ``disk`` (``docs/ARCHITECTURE.md``, "The device boundary"):
  where a held buffer lives.  An array is on the device; an offloaded one
  (:mod:`minipar.parallel.offload.store`) is a handle whose ``place`` says where
  it went and whose ``nbytes`` are its size there, so :func:`bytes_by_place`
  of an executor's ``kept`` list shows where the activations are, and a
  ledger row carries its place (``Ledger.bytes_by_place``).  Without a GPU
  device and host are the same RAM, accounted apart; disk is real anywhere.

The ZeRO paper (Rajbhandari et al. 2019, arXiv 1910.02054) splits memory
into *model states* (params, grads, optimizer states: 16Ψ bytes with mixed-
precision Adam) and *residual states* (activations, buffers, fragments);
the ledger uses the same categories, and tests/test_memory.py checks that
it equals the arrays' real ``nbytes`` and agrees with tracemalloc.
"""

from __future__ import annotations

import tracemalloc
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

from minipar.trees import arrays, owner

CATEGORIES = ("params", "grads", "optimizer states", "activations")
PLACES = ("device", "host", "disk")


def place_of(a: Any) -> str:
    """Where a buffer lives: an offload handle's ``place``, else ``"device"``."""
    return str(getattr(a, "place", "device"))


def buffers(tree: Any, exclude: Any = ()) -> dict[int, int]:
    """{id of owning buffer: bytes} for the arrays in a nested dict/list/tuple,
    each buffer once, leaving out the buffers of ``exclude`` (another tree)."""
    skip = set(buffers(exclude)) if exclude is not None and exclude != () else set()
    out: dict[int, int] = {}
    for a in arrays(tree):
        r = owner(a)
        if id(r) not in skip:
            out[id(r)] = int(r.nbytes)
    return out


def bytes_by_place(tree: Any) -> dict[str, int]:
    """Bytes of the distinct buffers in ``tree`` by place: device arrays, host and disk
    handles (:func:`place_of`)."""
    out = dict.fromkeys(PLACES, 0)
    seen: set[int] = set()
    for a in arrays(tree):
        r = owner(a)
        if id(r) not in seen:
            seen.add(id(r))
            out[place_of(r)] += int(r.nbytes)
    return out


def nbytes(tree: Any, exclude: Any = ()) -> int:
    """Bytes of the distinct buffers in ``tree`` (minus those of ``exclude``)."""
    return sum(buffers(tree, exclude).values())


@dataclass
class Region:
    """Filled in by ``measure()``: bytes relative to the region's start."""

    peak_bytes: int = 0
    current_bytes: int = 0


@contextmanager
def measure() -> Iterator[Region]:
    """tracemalloc peak and net bytes of the ``with`` body (starts tracing if needed)."""
    started = not tracemalloc.is_tracing()
    if started:
        tracemalloc.start()
    base = tracemalloc.get_traced_memory()[0]
    tracemalloc.reset_peak()
    region = Region()
    try:
        yield region
    finally:
        cur, peak = tracemalloc.get_traced_memory()
        region.peak_bytes, region.current_bytes = peak - base, cur - base
        if started:
            tracemalloc.stop()


@dataclass
class Ledger:
    """Bytes held by one rank, by category; every entry is (category, name, bytes)."""

    rank: int = 0
    entries: list[tuple[str, str, int]] = field(default_factory=list)
    places: list[str] = field(default_factory=list)  # each entry's place, in entry order
    _seen: set[int] = field(default_factory=set, repr=False)

    def add(self, category: str, name: str, tree: Any, place: str = "device") -> int:
        """Record the buffers of ``tree`` not already recorded, held in ``place``
        (device, host or disk); returns the bytes added."""
        if category not in CATEGORIES:
            raise ValueError(f"unknown category {category!r}; one of {', '.join(CATEGORIES)}")
        if place not in PLACES:
            raise ValueError(f"unknown place {place!r}; one of {', '.join(PLACES)}")
        new = {k: v for k, v in buffers(tree).items() if k not in self._seen}
        self._seen.update(new)
        size = sum(new.values())
        self.entries.append((category, name, size))
        self.places.append(place)
        return size

    def bytes_by_place(self) -> dict[str, int]:
        """Bytes held by place: the ledger's device, host and disk columns."""
        out = dict.fromkeys(PLACES, 0)
        for (_, _, b), where in zip(self.entries, self.places):
            out[where] += b
        return out

    def bytes_by_category(self) -> dict[str, int]:
        out = dict.fromkeys(CATEGORIES, 0)
        for c, _, b in self.entries:
            out[c] += b
        return out

    def total(self) -> int:
        return sum(b for _, _, b in self.entries)


def training_ledger(states: Any, cache: dict[str, Any] | None = None, rank: int = 0) -> Ledger:
    """The ledger of a ``precision.ModelStates`` and, optionally, a GPT forward ``cache``
    (one ``activations`` row per piece: embed, block i, head)."""
    led = Ledger(rank)
    led.add("params", "params", states.params)
    led.add("grads", "grads", states.grads)
    led.add("optimizer states", "optimizer", states.optimizer.state_arrays())
    if states.master is not None:
        led.add("optimizer states", "fp32 master weights", states.master)
    if cache is not None:
        for name, tree in activation_pieces(cache):
            led.add("activations", name, tree)
    return led


def activation_pieces(cache: dict[str, Any]) -> list[tuple[str, Any]]:
    """(name, saved) of each piece of a GPT forward cache, in forward order."""
    return ([("embed", cache["embed"])]
            + [(f"block {i}", s) for i, s in enumerate(cache["blocks"])]
            + [("head", cache["head"])])
