"""Offload tiers — уровни выгрузки (хост, диск) — 卸载层级（主机、磁盘）.

EN offload tiers (host memory, disk) · RU уровни выгрузки (память хоста, диск) ·
ZH 卸载层级（主机内存、磁盘）

The data movement under :mod:`minipar.parallel.offload.activations` (Ren et al. 2021,
ZeRO-Offload, arXiv 2101.06840; Rajbhandari et al. 2021, ZeRO-Infinity, arXiv
2104.07857): a :class:`Store` moves a buffer to host memory or to a
``numpy.memmap`` file and back, through :mod:`minipar.backend`
(``host_copy``: CuPy copies into pinned memory on a side stream; ``to_device``),
and counts what it moved, what lies out now and the seconds it took.  A tree
of arrays (a unit's ``saved``) goes out buffer by buffer, each once: an array
becomes a :class:`View` (offset, shape, strides, dtype) of its buffer's
:class:`Offloaded` handle, and comes back as the same view of the restored
buffer — the same bits.  Handles look like arrays to the memory ledger
(``nbytes``, ``dtype``, ``place``), so :func:`minipar.memory.bytes_by_place`
puts them in the host or disk column.  The formula the tests check: bytes out
= bytes back = the distinct buffers' bytes (tests/test_offload.py).
"""

from __future__ import annotations

import os
import shutil
import tempfile
import time
import weakref
from typing import Any

import numpy as np

from minipar import backend, checks
from minipar.trees import map_arrays, owner

__all__ = ["TARGETS", "Offloaded", "Store", "View", "check_target"]

TARGETS = ("host", "disk")


def check_target(target: Any, folder: Any = None) -> str:
    """The target's name; one-line ValueError for an unknown target or an unusable folder."""
    checks.one_of("offload target", target, TARGETS)
    if folder is not None:
        if target != "disk":
            raise ValueError(f"an offload folder ({folder}) is for target 'disk', not {target!r}")
        if not os.path.isdir(folder):
            raise ValueError(f"offload folder {folder} does not exist or is not a directory")
        try:  # os.access says yes to root everywhere: try it
            os.rmdir(tempfile.mkdtemp(prefix="minipar-offload-check-", dir=folder))
        except OSError as e:
            raise ValueError(f"offload folder {folder} is not writable ({e.strerror})") from None
    return str(target)


class Offloaded:
    """One buffer moved out: ``place`` ("host" or "disk"), ``nbytes``, ``dtype``, ``size``.

    It looks like an array to :func:`minipar.memory.buffers` (``nbytes``, ``dtype``,
    no ``base``), so a ``kept`` tree holding it is accounted in its place's column."""

    __slots__ = ("__weakref__", "_source", "data", "dtype", "nbytes", "path", "place", "size")
    base = None

    def __init__(self, place: str, flat: Any) -> None:
        self.place, self.dtype, self.size = place, flat.dtype, int(flat.size)
        self.nbytes = int(flat.nbytes)
        self.data: Any = None  # host: the host copy
        self.path: str | None = None  # disk: the file
        self._source: Any = None  # CuPy: the device buffer, kept until its copy is done


class View:
    """An array of a ``kept`` tree whose buffer went out: where in the buffer it was
    (``base`` is the buffer's :class:`Offloaded` handle)."""

    __slots__ = ("base", "dtype", "nbytes", "offset", "shape", "strides")

    def __init__(self, a: Any, handle: Offloaded, root: Any) -> None:
        self.base, self.dtype, self.shape = handle, a.dtype, a.shape
        self.strides, self.nbytes = a.strides, int(a.nbytes)
        self.offset = backend.address(a) - backend.address(root)


def _flat(root: Any) -> Any:
    """The buffer as a 1-D array in memory order (a view), or None if it is not contiguous."""
    if root.flags.c_contiguous:
        return root.reshape(-1)
    if root.flags.f_contiguous:
        return root.T.reshape(-1)
    return None


class Store:
    """Moves buffers to ``target`` and back; counts bytes and seconds.  One private
    folder (disk) per store, made on first use inside ``folder`` (default: the system's
    temporary folder), removed when everything in it has come back, by :meth:`close`,
    or when the store is collected."""

    def __init__(self, target: str = "host", folder: str | None = None) -> None:
        self.target = check_target(target, folder)
        self.folder, self._dir, self._n = folder, None, 0
        self.moved = {"to_host": 0, "to_disk": 0, "to_device": 0}
        self.held = {"host": 0, "disk": 0}
        self.peak = dict(self.held)
        self.seconds = {"out": 0.0, "back": 0.0}
        self._stream = backend.offload_stream() if target == "host" else None
        self._pending: list[Offloaded] = []  # CuPy: copies in flight on the side stream
        self._cleanup: Any = None

    def _path(self) -> str:
        if self._dir is None:
            self._dir = tempfile.mkdtemp(prefix="minipar-offload-", dir=self.folder)
            self._cleanup = weakref.finalize(self, shutil.rmtree, self._dir, True)
        self._n += 1
        return os.path.join(self._dir, f"{self._n}.bin")

    def close(self) -> None:
        """Remove the private folder and anything left in it (a later put makes a new one)."""
        if self._cleanup is not None:
            self._cleanup()
        self._dir = self._cleanup = None

    def reset_peak(self) -> None:
        self.peak = dict(self.held)

    # -- one buffer ---------------------------------------------------------------
    def put(self, flat: Any) -> Offloaded:
        """Move the 1-D buffer ``flat`` out; returns its handle."""
        h = Offloaded(self.target, flat)
        host = backend.host_copy(flat, self._stream)
        if self.target == "host":
            h.data = host
            if self._stream is not None:  # pragma: no cover - CuPy only
                h._source = flat
                self._pending.append(h)
        else:
            if self._stream is not None:  # pragma: no cover
                self._stream.synchronize()
            h.path = self._path()
            mm = np.memmap(h.path, dtype=h.dtype, mode="w+", shape=(h.size,))
            mm[...] = host
            del mm, host  # unmapped: the kernel writes the pages back in the background
            weakref.finalize(h, _unlink, h.path)  # a handle never brought back: file removed
        key = "to_host" if self.target == "host" else "to_disk"
        self.moved[key] += h.nbytes
        self.held[h.place] += h.nbytes
        self.peak[h.place] = max(self.peak[h.place], self.held[h.place])
        self._pending = [p for p in self._pending if not _done(p, self._stream)]
        return h

    def get(self, h: Offloaded) -> Any:
        """The buffer back on the device (a new 1-D array); the disk file is deleted."""
        if self._stream is not None:  # pragma: no cover - CuPy only
            self._stream.synchronize()
            self._pending.clear()
            h._source = None
        if h.place == "host":
            flat = backend.to_device(h.data)
            h.data = None
        else:
            assert h.path is not None
            mm = np.memmap(h.path, dtype=h.dtype, mode="r", shape=(h.size,))
            flat = backend.to_device(np.array(mm))
            del mm
            _unlink(h.path)
        self.moved["to_device"] += h.nbytes
        self.held[h.place] -= h.nbytes
        if h.place == "disk" and self.held["disk"] == 0:  # all back: the folder goes too
            self.close()
        return flat

    # -- a tree of arrays -----------------------------------------------------------
    def out(self, tree: Any, min_bytes: int = 0) -> Any:
        """``tree`` with every array whose buffer has >= ``min_bytes`` bytes moved out."""
        t0 = time.perf_counter()
        memo: dict[int, tuple[Any, Offloaded]] = {}

        def move(t: Any) -> Any:
            r = owner(t)
            if id(r) not in memo:
                flat = _flat(r)
                if flat is None or r.nbytes < min_bytes or r.nbytes == 0:
                    return t
                memo[id(r)] = (r, self.put(flat))
            return View(t, memo[id(r)][1], r)

        res = map_arrays(tree, move, lambda t: isinstance(t, (np.ndarray, backend.xp.ndarray)))
        memo.clear()  # free the moved buffers now, not at the next garbage collection
        self.seconds["out"] += time.perf_counter() - t0
        return res

    def back(self, tree: Any) -> Any:
        """``tree`` with every moved-out array back on the device (views rebuilt)."""
        t0 = time.perf_counter()
        flats: dict[int, Any] = {}

        def restore(t: View) -> Any:
            h = t.base
            if id(h) not in flats:
                flats[id(h)] = self.get(h)
            return backend.view_of(flats[id(h)], t.shape, t.dtype, t.offset, t.strides)

        res = map_arrays(tree, restore, lambda t: isinstance(t, View))
        flats.clear()
        self.seconds["back"] += time.perf_counter() - t0
        return res


def _unlink(path: str) -> None:
    try:
        os.remove(path)
    except FileNotFoundError:
        pass


def _done(h: Offloaded, stream: Any) -> bool:  # pragma: no cover - CuPy only
    """A pending copy has finished (its device buffer may be freed)."""
    if stream is None or stream.done:
        h._source = None
        return True
    return False
