"""Storage vs compute dtype — тип хранения и тип вычислений — 存储精度与计算精度.

How the layers honour a precision policy (Micikevicius et al. 2017, arXiv 1710.03740).

Layers keep their inputs, outputs and saved activations in the *storage*
dtype of the arrays they are given (float64, float32 or a 16-bit float).
NumPy has no 16-bit BLAS (a float16 matmul measured ~36x slower than
float32), so for 16-bit storage every layer upcasts to float32, computes,
and rounds its result back, as accelerators accumulate 16-bit products in
fp32.  For float32 and float64 the helpers are no-ops (no copies).
"""

from __future__ import annotations

import sys
from typing import Any

import numpy as np  # dtype names only; array math goes through xp

from minipar.backend import xp

#: the 16-bit floating dtypes minipar knows, by name
HALF_DTYPES = ("float16", "bfloat16")
#: every dtype a model can store
MODEL_DTYPES = ("float64", "float32", *HALF_DTYPES)


_FLOATS = (np.dtype(np.float64), np.dtype(np.float32), np.dtype(np.float16))
_BF16: list[np.dtype] = []  # filled by the first bfloat16(), or seen once ml_dtypes is loaded


def bfloat16() -> np.dtype:
    """NumPy's bfloat16, from ``ml_dtypes`` — imported here, on first use: loading its C
    extension costs about 0.5 s of CPU, which every process and MPI rank that never
    touches bfloat16 is spared."""
    if not _BF16:
        import ml_dtypes

        _BF16.append(np.dtype(ml_dtypes.bfloat16))
    return _BF16[0]


def as_dtype(dtype: Any) -> np.dtype:
    """``np.dtype(dtype)``, with ``"bfloat16"`` understood before ``ml_dtypes`` is loaded."""
    if isinstance(dtype, str) and dtype == "bfloat16":
        return bfloat16()
    return np.dtype(dtype)


def check_model_dtype(dtype: Any) -> np.dtype:
    """``dtype`` as a NumPy dtype a model can store; ValueError unless 64/32/16-bit float."""
    try:
        dt = as_dtype(dtype)
    except TypeError as e:
        raise ValueError(f"unknown dtype {dtype!r}") from e
    if dt not in _FLOATS and dt not in _BF16:
        raise ValueError(f"dtype must be float64, float32, float16 or bfloat16, got {dt}")
    return dt


def is_16bit(dtype: Any) -> bool:
    """True for float16 and bfloat16."""
    dt = as_dtype(dtype)  # compared with the dtypes, not by name: dtype.name allocates
    if not _BF16 and "ml_dtypes" in sys.modules:  # a caller made bfloat16 arrays itself
        bfloat16()
    return dt == _FLOATS[2] or (bool(_BF16) and dt == _BF16[0])


def compute_dtype(dtype: Any) -> np.dtype:
    """The dtype arithmetic runs in: float32 for 16-bit storage, else the dtype itself."""
    return np.dtype(np.float32) if is_16bit(dtype) else np.dtype(dtype)


def up(a: Any) -> Any:
    """``a`` in its compute dtype (a float32 copy of a 16-bit array; otherwise ``a`` itself)."""
    return a.astype(xp.float32) if is_16bit(a.dtype) else a


def down(a: Any, dtype: Any) -> Any:
    """``a`` rounded to the storage ``dtype`` (no copy when it already has it)."""
    return a.astype(dtype, copy=False)


def matmul(a: Any, b: Any) -> Any:
    """``a @ b`` in the storage dtype of ``a``, accumulated in fp32 for 16-bit inputs."""
    if is_16bit(a.dtype) or is_16bit(b.dtype):
        return (up(a) @ up(b)).astype(a.dtype)
    return a @ b
