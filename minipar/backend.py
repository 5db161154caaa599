"""Array backend: NumPy by default, CuPy on request.

Every module that does math takes its array functions from ``xp``::

    from minipar.backend import xp
    y = xp.tanh(x)

so the same code runs on a GPU when ``MINIPAR_BACKEND=cupy`` is set before
minipar is imported.  MPI buffers must live in host memory unless the MPI
library is CUDA-aware; ``to_host`` / ``to_device`` move arrays across.
``tests/test_backend.py`` keeps modules honest: no math module imports NumPy
for array computation behind ``xp``'s back.
"""

from __future__ import annotations

import os
from typing import Any

import numpy as np

BACKEND_ENV = "MINIPAR_BACKEND"


def _load(name: str) -> Any:
    if name in ("", "numpy"):
        return np
    if name == "cupy":
        try:
            import cupy  # type: ignore[import-not-found]
        except ImportError as e:  # pragma: no cover - depends on the machine
            raise RuntimeError(
                f"{BACKEND_ENV}=cupy but CuPy is not installed: "
                "pip install 'minipar[gpu]' (and a CUDA GPU), or unset "
                f"{BACKEND_ENV} to use NumPy"
            ) from e
        try:
            n = cupy.cuda.runtime.getDeviceCount()
        except Exception as e:  # pragma: no cover - depends on the machine
            raise RuntimeError(f"{BACKEND_ENV}=cupy but no CUDA GPU is usable: {e}") from e
        if n == 0:  # pragma: no cover
            raise RuntimeError(f"{BACKEND_ENV}=cupy but no CUDA GPU was found")
        return cupy
    raise ValueError(f"{BACKEND_ENV}={name!r}: expected 'numpy' or 'cupy'")


#: the array module every math module uses (numpy or cupy)
xp = _load(os.environ.get(BACKEND_ENV, "numpy").strip().lower())
name: str = "cupy" if xp is not np else "numpy"


def to_host(a: Any) -> np.ndarray:
    """Return ``a`` as a NumPy array in host memory (a no-op under NumPy)."""
    if xp is np:
        return np.asarray(a)
    return xp.asnumpy(a)  # pragma: no cover


def to_device(a: Any) -> Any:
    """Return ``a`` as an array of the active backend (a no-op under NumPy)."""
    return xp.asarray(a)


def offload_stream() -> Any:
    """A CUDA stream for device<->host copies that overlap compute (None under NumPy)."""
    if xp is np:
        return None
    return xp.cuda.Stream(non_blocking=True)  # pragma: no cover


def host_copy(a: Any, stream: Any = None) -> np.ndarray:
    """A new host array holding a copy of ``a`` (offloading, ``minipar.parallel.offload``).

    NumPy: a plain copy in the same RAM.  CuPy: pinned (page-locked) host memory,
    filled by a device-to-host copy queued on ``stream`` after the work already queued
    on the current stream: asynchronous, so ``stream.synchronize()`` before reading it
    and keep ``a`` alive until then."""
    if xp is np:
        return np.array(a, copy=True)
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
    return int(a.data.ptr)  # pragma: no cover


def view_of(flat: Any, shape: tuple[int, ...], dtype: Any, offset: int,
            strides: tuple[int, ...]) -> Any:
    """The view (``shape``, ``dtype``, ``strides``) starting ``offset`` bytes into the
    1-D array ``flat``: rebuilds a view of a buffer that was moved away and back."""
    if xp is np:
        return np.ndarray(shape, dtype, buffer=flat, offset=offset, strides=strides)
    return xp.ndarray(shape, dtype, memptr=flat.data + offset, strides=strides)  # pragma: no cover


def device_memory_bytes() -> int | None:
    """Bytes currently held by the device memory pool, or None under NumPy."""
    if xp is np:
        return None
    return int(xp.get_default_memory_pool().used_bytes())  # pragma: no cover
