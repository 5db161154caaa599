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

from typing import Any

import ml_dtypes
import numpy as np  # dtype names only; array math goes through xp

from minipar.backend import xp

#: the 16-bit floating dtypes minipar knows
HALF_DTYPES = (np.dtype(np.float16), np.dtype(ml_dtypes.bfloat16))


def check_model_dtype(dtype: Any) -> np.dtype:
    """``dtype`` as a NumPy dtype a model can store; ValueError unless 64/32/16-bit float."""
    try:
        dt = np.dtype(dtype)
    except TypeError as e:
        raise ValueError(f"unknown dtype {dtype!r}") from e
    if dt not in (np.dtype(np.float64), np.dtype(np.float32), *HALF_DTYPES):
        raise ValueError(f"dtype must be float64, float32, float16 or bfloat16, got {dt}")
    return dt


def is_16bit(dtype: Any) -> bool:
    """True for float16 and bfloat16."""
    return np.dtype(dtype) in HALF_DTYPES


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
