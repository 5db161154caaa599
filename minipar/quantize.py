"""Block-wise quantization — поблочное квантование — 分块量化.

A tensor is cut into blocks and each block gets its own scale, so one outlier
coarsens only its own block (DeepSeek-V3, arXiv 2412.19437, §3.3: 1×128 tiles
of activations, 128×128 blocks of weights; ZeRO++, arXiv 2306.10209: blocks of
a flat buffer).  For a block with largest magnitude ``amax``::

    scale = amax / max_finite          (amax 0 -> scale 1)
    q     = round(x / scale)           in the format, saturated to ±max_finite
    x    ~= q · scale                  |x − q·scale| <= scale · ulp(q) / 2

``block`` is a tuple as long as ``x.ndim`` — ``(1, 128)`` tiles, ``(128, 128)``
blocks, ``(128,)`` for a flat buffer; blocks are cut from the start of each
axis and a tail shorter than a block is a block of its own, so ``scales`` has
``ceil(n_i / b_i)`` entries along axis i.

Formats (:data:`FORMATS`, largest finite value):

* ``e4m3`` — OCP FP8 E4M3 (``ml_dtypes.float8_e4m3fn``): 4 exponent bits, 3
  mantissa bits, bias 7, no inf, 448 the largest value;
* ``e5m2`` — OCP FP8 E5M2 (``ml_dtypes.float8_e5m2``): 5 and 2 bits, bias 15,
  IEEE-like (it has inf), 57344 the largest finite value;
* ``int8`` (±127) and ``int4`` (±7), symmetric, int8 arrays; :func:`pack_int4`
  puts two int4 values in a byte.

Rounding is to nearest, ties to even (``ml_dtypes`` rounds a float64 directly,
not through float32; integers by ``rint``); a value beyond the largest finite
one *saturates* to it — never inf or nan — as the FP8 recipes do.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np  # dtype names only; array math goes through xp

from minipar.backend import xp

#: format name -> largest finite value
FORMATS: dict[str, float] = {"e4m3": 448.0, "e5m2": 57344.0, "int8": 127.0, "int4": 7.0}


def _wide(dtype: Any) -> np.dtype:
    """The dtype scales and sums use: float32 for a 16-bit input, else its own."""
    return np.dtype(dtype) if np.dtype(dtype).itemsize >= 4 else np.dtype(np.float32)


def storage_dtype(fmt: str) -> np.dtype:
    """The dtype ``q`` is stored in: an ``ml_dtypes`` float8 or int8 (int4 unpacked)."""
    if fmt not in FORMATS:
        raise ValueError(f"format must be one of {', '.join(FORMATS)}, got {fmt!r}")
    if fmt.startswith("int"):
        return np.dtype(np.int8)
    import ml_dtypes  # loaded on first use (its C extension costs ~0.5 s)

    return np.dtype(ml_dtypes.float8_e4m3fn if fmt == "e4m3" else ml_dtypes.float8_e5m2)


def _blocks(shape: tuple[int, ...], block: tuple[int, ...]) -> tuple[int, ...]:
    if len(block) != len(shape) or any(int(b) < 1 for b in block):
        raise ValueError(f"block {tuple(block)} must have {len(shape)} positive sizes")
    return tuple(math.ceil(n / b) for n, b in zip(shape, block))


def _fit(shape: tuple[int, ...], block: tuple[int, ...]) -> tuple[int, ...]:
    """A block no longer than its axis (the same blocks: one along an axis it covers), so
    the padding and the expanded scales never outgrow the tensor."""
    return tuple(max(1, min(int(b), n)) for n, b in zip(shape, block))


def block_amax(x: Any, block: tuple[int, ...]) -> Any:
    """max |x| of every block (shape ``ceil(n_i / b_i)``): zeros pad the tails."""
    nb, block = _blocks(x.shape, block), _fit(x.shape, block)
    pad = [(0, k * b - n) for n, b, k in zip(x.shape, block, nb)]
    a = xp.pad(xp.abs(x.astype(_wide(x.dtype))), pad)
    a = a.reshape([d for k, b in zip(nb, block) for d in (k, b)])
    return a.max(axis=tuple(range(1, 2 * len(nb), 2))) if a.size else a.reshape(nb)


def expand(scales: Any, block: tuple[int, ...], shape: tuple[int, ...]) -> Any:
    """Every block's entry repeated over its elements, cut to ``shape``."""
    for axis, b in enumerate(_fit(shape, block)):
        scales = xp.repeat(scales, b, axis=axis)
    return scales[tuple(slice(0, n) for n in shape)]


def quantize(x: Any, fmt: str, block: tuple[int, ...], amax: Any = None) -> tuple[Any, Any]:
    """``(q, scales)``: ``x`` in ``fmt`` with one scale per block (module docstring).

    ``amax`` (default :func:`block_amax` of ``x``) may be given: the per-block maxima
    reduced over the ranks that hold parts of a block, so each rank scales its part
    as the whole block would be."""
    dt, top = storage_dtype(fmt), FORMATS[fmt]
    amax = block_amax(x, block) if amax is None else amax
    scales = xp.where(amax > 0, amax / top, 1.0).astype(_wide(x.dtype))
    v = xp.clip(x / expand(scales, block, x.shape), -top, top)  # saturate: no inf
    q = xp.rint(v).astype(dt) if fmt.startswith("int") else v.astype(dt)
    return q, scales


def dequantize(q: Any, scales: Any, fmt: str, block: tuple[int, ...],
               shape: tuple[int, ...]) -> Any:
    """x ≈ q · scale, in the scales' dtype."""
    storage_dtype(fmt)
    return q.reshape(shape).astype(scales.dtype) * expand(scales, block, shape)


def pack_int4(q: Any) -> Any:
    """int4 values (an int8 array in [-8, 7]) two to a byte, first in the low nibble."""
    flat = q.reshape(-1).astype(xp.uint8) & 0x0F
    if flat.size % 2:
        flat = xp.concatenate([flat, xp.zeros(1, dtype=xp.uint8)])
    return flat[0::2] | (flat[1::2] << 4)


def unpack_int4(packed: Any, n: int) -> Any:
    """The first ``n`` int4 values of :func:`pack_int4`'s bytes, as int8 (sign restored)."""
    nib = xp.stack([packed & 0x0F, packed >> 4], axis=1).reshape(-1)[:n].astype(xp.int8)
    return xp.where(nib > 7, nib - 16, nib).astype(xp.int8)
