"""Array backend: NumPy by default, CuPy on request, a strict CuPy stand-in for tests.

Every module that does math takes its array functions from ``xp``::

    from minipar.backend import xp
    y = xp.tanh(x)

so the same code runs on a GPU when ``MINIPAR_BACKEND=cupy`` is set before
minipar is imported (each rank takes GPU ``local rank % device count``).
``MINIPAR_BACKEND=strict`` selects :mod:`minipar.strict_device`: CuPy's rules
(no NumPy on a device array, no host array in a device function) enforced on
NumPy, so the device path is tested on a machine with no GPU.

The device boundary: MPI buffers live in host memory unless the MPI library is
CUDA-aware (``MINIPAR_CUDA_AWARE_MPI=1``); :mod:`minipar.comm.traced` stages
device buffers through host memory itself.  Elsewhere ``to_host`` /
``to_device`` move arrays across, and :func:`on_device` says which side an
array is on.  ``tests/test_backend.py`` keeps modules honest: no math module
imports NumPy for array computation behind ``xp``'s back.
"""

from __future__ import annotations

import contextlib
import os
from typing import Any

import numpy as np

BACKEND_ENV = "MINIPAR_BACKEND"
#: "1": device buffers go to MPI as they are (a CUDA-aware MPI library); otherwise staged
CUDA_AWARE_ENV = "MINIPAR_CUDA_AWARE_MPI"
#: the environment variables MPI launchers set to a process's rank on its own node
LOCAL_RANK_ENVS = ("MPI_LOCALRANKID", "OMPI_COMM_WORLD_LOCAL_RANK", "SLURM_LOCALID",
                   "LOCAL_RANK")


def _load(name: str) -> Any:
    if name in ("", "numpy"):
        return np
    if name == "strict":
        from minipar import strict_device

        return strict_device
    if name == "cupy":
        try:
            import cupy  # type: ignore[import-not-found]
        except ImportError as e:  # pragma: no cover - depends on the machine
            raise RuntimeError(
                f"{BACKEND_ENV}=cupy but CuPy is not installed: "
                "pip install 'minipar[gpu-cuda12]' or 'minipar[gpu-cuda13]' (and a CUDA GPU), "
                f"or unset {BACKEND_ENV} to use NumPy"
            ) from e
        try:
            n = cupy.cuda.runtime.getDeviceCount()
        except Exception as e:  # pragma: no cover - depends on the machine
            raise RuntimeError(f"{BACKEND_ENV}=cupy but no CUDA GPU is usable: {e}") from e
        if n == 0:  # pragma: no cover
            raise RuntimeError(f"{BACKEND_ENV}=cupy but no CUDA GPU was found")
        cupy.cuda.Device(local_rank() % n).use()  # pragma: no cover
        return cupy
    raise ValueError(f"{BACKEND_ENV}={name!r}: expected 'numpy', 'cupy' or 'strict'")


def local_rank() -> int:
    """This process's rank on its node, as the MPI launcher says (0 when not launched)."""
    for var in LOCAL_RANK_ENVS:
        v = os.environ.get(var, "")
        if v.isdigit():
            return int(v)
    return 0


#: the backend's name: "numpy", "cupy" or "strict"
name: str = os.environ.get(BACKEND_ENV, "numpy").strip().lower() or "numpy"
#: the array module every math module uses (numpy, cupy or minipar.strict_device)
xp = _load(name)
#: whether arrays live in device memory (CuPy, or the strict stand-in)
device: bool = xp is not np


def cuda_aware() -> bool:
    """Whether device buffers go to MPI as they are (``MINIPAR_CUDA_AWARE_MPI=1``)."""
    return os.environ.get(CUDA_AWARE_ENV, "").strip() == "1"


def on_device(a: Any) -> bool:
    """Whether ``a`` is a device array (never under NumPy)."""
    return device and isinstance(a, xp.ndarray)


def array_module(a: Any) -> Any:
    """The array module of ``a``'s side: ``xp`` for a device array, NumPy for anything else
    (CuPy's ``get_array_module``): code that takes either makes its buffers beside ``a``."""
    return xp if on_device(a) else np


def to_host(a: Any) -> np.ndarray:
    """Return ``a`` as a NumPy array in host memory (a no-op under NumPy; a device
    array is copied, and the stand-in counts the copy)."""
    if not on_device(a):
        return np.asarray(a)
    return xp.asnumpy(a)


def synchronize() -> None:
    """Wait for the device's queued work (before reading a clock); nothing on the host."""
    if name == "cupy":  # pragma: no cover - needs a GPU
        xp.cuda.Device().synchronize()


def stream_synchronize() -> None:
    """Wait for the work queued on the current CUDA stream: a copy from pinned host memory
    is asynchronous, so its host buffer may be reused only after this (nothing on the host)."""
    if name == "cupy":  # pragma: no cover - needs a GPU
        xp.cuda.get_current_stream().synchronize()


def errstate(**kwargs: Any) -> Any:
    """NumPy's floating-point warnings set for a block (``np.errstate``, also for the strict
    stand-in, which computes with NumPy); CuPy has none to set: its kernels never warn."""
    return contextlib.nullcontext() if name == "cupy" else np.errstate(**kwargs)


def transfers() -> dict[str, int]:
    """Device<->host copies this process made, counted by the strict stand-in (bytes and
    calls each way); zeros under NumPy, and under CuPy, which does not count them."""
    if name == "strict":
        return xp.transfers.as_dict()
    return {"d2h_bytes": 0, "d2h_calls": 0, "h2d_bytes": 0, "h2d_calls": 0}


def to_device(a: Any) -> Any:
    """Return ``a`` as an array of the active backend (a no-op under NumPy)."""
    return xp.asarray(a)


def offload_stream() -> Any:
    """A CUDA stream for device<->host copies that overlap compute (None without CuPy)."""
    if name != "cupy":
        return None
    return xp.cuda.Stream(non_blocking=True)  # pragma: no cover


def host_copy(a: Any, stream: Any = None) -> np.ndarray:
    """A new host array holding a copy of ``a`` (offloading, ``minipar.parallel.offload``).

    NumPy: a plain copy in the same RAM.  The strict stand-in: a counted device->host
    copy.  CuPy: pinned (page-locked) host memory,
    filled by a device-to-host copy queued on ``stream`` after the work already queued
    on the current stream: asynchronous, so ``stream.synchronize()`` before reading it
    and keep ``a`` alive until then."""
    if not on_device(a):
        return np.array(a, copy=True)
    if name != "cupy":
        return a.get()
    import cupyx  # type: ignore[import-not-found]  # pragma: no cover

    out = cupyx.empty_pinned(a.shape, a.dtype)  # pragma: no cover
    if stream is None:  # pragma: no cover
        a.get(out=out)
        return out
    stream.wait_event(xp.cuda.get_current_stream().record())  # pragma: no cover
    try:  # pragma: no cover
        a.get(stream=stream, out=out, blocking=False)
    except TypeError:  # pragma: no cover - CuPy < 12 has no ``blocking``
        a.get(stream=stream, out=out)
    return out  # pragma: no cover


def address(a: Any) -> int:
    """The address of an array's first element (host or device): views of one buffer
    differ by their byte offsets."""
    if isinstance(a, np.ndarray):
        return int(a.__array_interface__["data"][0])
    return int(a.data.ptr)


def view_of(flat: Any, shape: tuple[int, ...], dtype: Any, offset: int,
            strides: tuple[int, ...]) -> Any:
    """The view (``shape``, ``dtype``, ``strides``) starting ``offset`` bytes into the
    1-D array ``flat``: rebuilds a view of a buffer that was moved away and back."""
    if not on_device(flat):
        return np.ndarray(shape, dtype, buffer=flat, offset=offset, strides=strides)
    return xp.ndarray(shape, dtype, memptr=flat.data + offset, strides=strides)


def device_memory_bytes() -> int | None:
    """Bytes currently held by CuPy's device memory pool, or None without CuPy."""
    if name != "cupy":
        return None
    return int(xp.get_default_memory_pool().used_bytes())  # pragma: no cover
