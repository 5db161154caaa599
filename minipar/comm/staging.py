"""The device boundary of communication: device buffers staged through host memory.

EN host staging · RU промежуточная буферизация в памяти хоста · ZH 主机内存中转

MPI reads and writes the memory its buffers point to.  An MPI library built
with CUDA support (a *CUDA-aware* MPI) can be handed a GPU buffer; one built
without it, like the ``mpich`` wheel minipar installs, would read a device
address as if it were host memory.  So under a device backend
(``MINIPAR_BACKEND=cupy``, or the ``strict`` stand-in that tests it) every
device buffer a :class:`~minipar.comm.traced.TracedComm` is given crosses here:

* a **send** copies the device bytes into a host buffer (device→host), and MPI
  sends that;
* a **receive** lands in a host buffer, and the bytes that arrived are copied
  into the device buffer (host→device) when the request completes.

Host buffers are reused: one free list per message size (a ring all-reduce sends
the same chunk sizes every step), pinned (page-locked) memory under CuPy, so the
copies run at the bus's speed.  A buffer goes back to its list when its request
completes, so two sends in flight never share one.  Each copy is counted, by
operation and communicator (:meth:`~minipar.comm.stats.Stats.bytes_staged`),
and every run summary shows it: this is what an MPI that is not CUDA-aware
costs.  With ``MINIPAR_CUDA_AWARE_MPI=1`` device buffers go to MPI as they are
(through ``__cuda_array_interface__``), nothing is staged, and the device is
synchronised first so MPI reads finished data.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable
from typing import Any

import numpy as np
from mpi4py import MPI

from minipar import backend
from minipar.comm.errors import CommUsageError

#: what to run when a request completes: given the request's MPI status
Finish = Callable[[Any], None]


class HostBuffers:
    """Reusable host buffers, one free list per size in bytes."""

    def __init__(self) -> None:
        self.free: dict[int, list[np.ndarray]] = defaultdict(list)
        self.made = 0  # buffers ever allocated (a test reads it: reuse works)

    def take(self, nbytes: int) -> np.ndarray:
        if self.free[nbytes]:
            return self.free[nbytes].pop()
        self.made += 1
        if backend.name == "cupy":  # pragma: no cover - needs a GPU
            import cupyx  # type: ignore[import-not-found]

            return cupyx.empty_pinned((nbytes,), np.uint8)
        return np.empty(nbytes, np.uint8)

    def give(self, buf: np.ndarray) -> None:
        self.free[buf.nbytes].append(buf)


#: this process's staging buffers
BUFFERS = HostBuffers()


def as_bytes(buf: Any, *, what: str = "buffer") -> np.ndarray:
    """A uint8 view of a C-contiguous NumPy array (no copy); clear error otherwise."""
    a = buf if type(buf) is np.ndarray else np.asarray(buf)
    if a.flags.c_contiguous:
        return a.reshape(-1).view(np.uint8)
        raise CommUsageError(f"{what} of shape {a.shape} is not C-contiguous; "
                             "pass np.ascontiguousarray(x)")


def device_bytes(buf: Any, what: str) -> Any:
    """A uint8 view of a C-contiguous device array (no copy); clear error otherwise."""
    if not buf.flags.c_contiguous:
        raise CommUsageError(f"{what} of shape {buf.shape} is not C-contiguous; "
                             "pass xp.ascontiguousarray(x)")
    return buf.reshape(-1).view(np.uint8)


def outgoing(buf: Any, stats: Any, op: str, comm: str) -> tuple[Any, Finish | None]:
    """What MPI sends for ``buf``, and what to run when the send completes: a host array's
    own bytes; for a device array a host copy (counted) and what frees it, or the device
    bytes themselves with a CUDA-aware MPI."""
    if type(buf) is np.ndarray or not backend.on_device(buf):
        return as_bytes(buf, what="send buffer"), None
    d = device_bytes(buf, "send buffer")
    if backend.cuda_aware():
        backend.synchronize()
        return d, None
    host = BUFFERS.take(d.nbytes)
    d.get(out=host)
    stats.record_staged(op, comm, "d2h", d.nbytes)
    return host, lambda status: BUFFERS.give(host)


def incoming(buf: Any, stats: Any, op: str, comm: str) -> tuple[Any, Finish | None]:
    """Where MPI receives for ``buf``, and what to run when the receive completes: a host
    array itself; for a device array a host buffer, and what copies the bytes that
    arrived into ``buf`` (counted)."""
    if type(buf) is np.ndarray or not backend.on_device(buf):
        return as_bytes(buf, what="receive buffer"), None
    d = device_bytes(buf, "receive buffer")
    if backend.cuda_aware():
        backend.synchronize()
        return d, None
    host = BUFFERS.take(d.nbytes)

    def finish(status: Any) -> None:
        n = status.Get_count(MPI.BYTE)
        if n > 0:
            d[:n].set(host[:n])
            backend.stream_synchronize()  # from pinned memory the copy runs on: wait for it
        stats.record_staged(op, comm, "h2d", n)
        BUFFERS.give(host)

    return host, finish


def any_device(args: tuple, kwargs: dict) -> bool:
    """Whether a call's arguments hold a device array (alone or first in a list)."""
    return backend.device and any(
        backend.on_device(a[0] if isinstance(a, (list, tuple)) and a else a)
        for a in (*args, *kwargs.values()))


#: MPI's blocking buffer collectives: the position and name of the buffer MPI writes
WRITTEN = {"Allgather": (1, "recvbuf"), "Allgatherv": (1, "recvbuf"),
           "Allreduce": (1, "recvbuf"), "Alltoall": (1, "recvbuf"), "Alltoallv": (1, "recvbuf"),
           "Bcast": (0, "buf"), "Gather": (1, "recvbuf"), "Reduce": (1, "recvbuf"),
           "Reduce_scatter": (1, "recvbuf"), "Scatter": (1, "recvbuf")}


def mpi_collective(self: Any, name: str, args: tuple, kwargs: dict) -> Any:
    """MPI's own collective ``name`` on device buffers, for the TracedComm ``self`` that
    passes it through: each device buffer (alone, or first in a ``[buf, ...]`` spec)
    copied to the host before, the one MPI writes copied back after, both counted under
    the operation in progress."""
    if backend.cuda_aware():
        backend.synchronize()
        return getattr(self.comm, name)(*args, **kwargs)
    if name not in WRITTEN:
        raise CommUsageError(f"{name} with a device buffer: stage it to the host first "
                             f"(or set {backend.CUDA_AWARE_ENV}=1 for a CUDA-aware MPI)")
    op, back = self.current_op, []

    def host(a: Any, written: bool) -> Any:
        spec = isinstance(a, (list, tuple))
        dev = a[0] if spec else a
        if not backend.on_device(dev):
            return a
        h = backend.to_host(dev)
        self.stats.record_staged(op, self.name, "d2h", h.nbytes)
        if written:
            back.append((dev, h))
        return type(a)([h, *a[1:]]) if spec else h

    pos, key = WRITTEN[name]
    args = tuple(host(a, i == pos) for i, a in enumerate(args))
    kwargs = {k: host(v, k == key) for k, v in kwargs.items()}
    out = getattr(self.comm, name)(*args, **kwargs)
    for dev, h in back:
        dev[...] = backend.to_device(h)
        self.stats.record_staged(op, self.name, "h2d", h.nbytes)
    return out
