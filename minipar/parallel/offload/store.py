"""Offload tiers — уровни выгрузки (хост, диск) — 卸载层级（主机、磁盘）.

EN offload tiers (host memory, disk) · RU уровни выгрузки (память хоста, диск) ·
ZH 卸载层级（主机内存、磁盘）

The data movement under :mod:`minipar.parallel.offload.activations` and
:mod:`minipar.parallel.offload.optimizer` (Ren et al. 2021, ZeRO-Offload, arXiv
2101.06840; Rajbhandari et al. 2021, ZeRO-Infinity, arXiv 2104.07857): a
:class:`Store` moves a buffer to host memory or to a ``numpy.memmap`` file (in a
private :class:`Folder`) and back, through :mod:`minipar.backend` (``host_copy``:
CuPy copies into pinned memory on a side stream; ``to_device``).  A tree of arrays
(a unit's ``saved``) goes out buffer by buffer, each once: an array becomes a
:class:`View` (offset, shape, strides, dtype) of its buffer's :class:`Offloaded`
handle, and comes back as the same view of the restored buffer — the same bits.
Handles look like arrays to a memory ledger (``nbytes``, ``dtype``, ``place``), so
:func:`minipar.memory.bytes_by_place` puts them in the host or disk column.  What
moved is counted outside (:class:`minipar.parallel.offload.measure.MeteredStore`):
bytes out = bytes back = the distinct buffers' bytes (tests/test_offload.py).
"""

from __future__ import annotations

import os
import shutil
import tempfile
import weakref
from pathlib import Path
from typing import Any

import numpy as np

from minipar import backend
from minipar.trees import map_arrays, owner

__all__ = ["TARGETS", "Folder", "Offloaded", "Store", "View", "to_file"]

TARGETS = ("host", "disk")


class Folder:
    """A private folder inside ``parent`` (default: the system's temporary folder),
    made on first use; :meth:`close` (or collecting it) removes it and what is in it."""

    def __init__(self, parent: str | None = None) -> None:
        self.parent, self.path, self._cleanup = parent, None, None

    def file(self, name: str) -> str:
        if self.path is None:
            self.path = tempfile.mkdtemp(prefix="minipar-offload-", dir=self.parent)
            self._cleanup = weakref.finalize(self, shutil.rmtree, self.path, True)
        return os.path.join(self.path, name)  # a str: NumPy's memmap opens it faster

    def close(self) -> None:
        if self._cleanup is not None:
            self._cleanup()
        self.path = self._cleanup = None


def to_file(path: str, host: Any) -> Any:
    """A ``numpy.memmap`` file at ``path`` holding the host array ``host``'s values."""
    mm = np.memmap(path, dtype=host.dtype, mode="w+", shape=host.shape)
    mm[...] = host
    return mm


class Offloaded:
    """One buffer moved out: ``place`` ("host" or "disk"), ``nbytes``, ``dtype``, and
    where it is (``data``: the host copy; ``path``: the file)."""

    __slots__ = ("__weakref__", "data", "dtype", "nbytes", "path", "place", "source")
    base = None

    def __init__(self, place: str, flat: Any) -> None:
        self.place, self.dtype, self.nbytes = place, flat.dtype, int(flat.nbytes)
        self.data: Any = None  # host: the host copy
        self.path: str | None = None  # disk: the file
        self.source: Any = None  # CuPy: the device buffer, kept until its copy is done


class View:
    """An array of a ``kept`` tree whose buffer went out: where in the buffer it was
    (``base`` is the buffer's :class:`Offloaded` handle)."""

    __slots__ = ("base", "dtype", "nbytes", "offset", "shape", "strides")

    def __init__(self, a: Any, handle: Offloaded, root: Any) -> None:
        self.base, self.dtype, self.shape = handle, a.dtype, a.shape
        self.strides, self.nbytes = a.strides, int(a.nbytes)
        self.offset = backend.address(a) - backend.address(root)


class Store:
    """Moves buffers to ``target`` ("host" or "disk") and back.  Disk: one file per
    buffer in a private :class:`Folder` inside ``folder``, removed when everything in it
    has come back, by ``folder.close()``, or when the store is collected."""

    def __init__(self, target: str = "host", folder: str | None = None) -> None:
        self.target, self.folder = target, Folder(folder)
        self._files = self._out = 0  # disk: files written (names), and out now
        self._stream = backend.offload_stream() if target == "host" else None
        self._pending: list[Offloaded] = []  # CuPy: copies in flight on the side stream

    def _settle(self, wait: bool) -> None:  # pragma: no cover - CuPy only
        """The side stream's copies done (or waited for): their device buffers may go."""
        if self._stream is not None and (wait or self._stream.done):
            self._stream.synchronize()
            for h in self._pending:
                h.source = None
            self._pending.clear()

    # -- one buffer ---------------------------------------------------------------
    def put(self, flat: Any) -> Offloaded:
        """Move the 1-D buffer ``flat`` out; returns its handle."""
        h = Offloaded(self.target, flat)
        host = backend.host_copy(flat, self._stream)
        if self.target == "host":
            h.data = host
            if self._stream is not None:  # pragma: no cover - CuPy only
                h.source = flat
                self._pending.append(h)
            self._settle(wait=False)
        else:
            self._files, self._out = self._files + 1, self._out + 1
            h.path = self.folder.file(f"{self._files}.bin")
            to_file(h.path, host)  # unmapped at once: the kernel writes the pages back
            weakref.finalize(h, Path(h.path).unlink, True)  # never brought back: removed
        return h

    def get(self, h: Offloaded) -> Any:
        """The buffer back on the device (a new 1-D array); the disk file is deleted."""
        self._settle(wait=True)
        if h.place == "host":
            flat, h.data = backend.to_device(h.data), None
            return flat
        flat = backend.to_device(np.array(np.memmap(h.path, dtype=h.dtype, mode="r")))
        os.remove(h.path)
        self._out -= 1
        if self._out == 0:  # all back: the folder goes too
            self.folder.close()
        return flat

    # -- a tree of arrays -----------------------------------------------------------
    def out(self, tree: Any, min_bytes: int = 0) -> Any:
        """``tree`` with every array whose buffer has >= ``min_bytes`` bytes moved out
        (a buffer in memory order: C- or Fortran-contiguous; other buffers stay)."""
        memo: dict[int, tuple[Any, Offloaded]] = {}

        def move(t: Any) -> Any:
            r = owner(t)
            if id(r) not in memo:
                order = "C" if r.flags.c_contiguous else "F" if r.flags.f_contiguous else None
                if order is None or r.nbytes < min_bytes or r.nbytes == 0:
                    return t
                memo[id(r)] = (r, self.put(r.reshape(-1, order=order)))
            return View(t, memo[id(r)][1], r)

        res = map_arrays(tree, move, lambda t: isinstance(t, (np.ndarray, backend.xp.ndarray)))
        memo.clear()  # free the moved buffers now, not at the next garbage collection
        return res

    def back(self, tree: Any) -> Any:
        """``tree`` with every moved-out array back on the device (views rebuilt)."""
        flats: dict[int, Any] = {}

        def restore(t: View) -> Any:
            h = t.base
            if id(h) not in flats:
                flats[id(h)] = self.get(h)
            return backend.view_of(flats[id(h)], t.shape, t.dtype, t.offset, t.strides)

        res = map_arrays(tree, restore, lambda t: isinstance(t, View))
        flats.clear()
        return res
