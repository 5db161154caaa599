"""Exercise: FP8 with a scale per tile, DeepSeek-V3's block scaling (ends notebook 12).

EN block-wise quantization · RU поблочное квантование · ZH 分块量化

Grade it (1 rank is enough: quantization is arithmetic on each rank, no message is
sent, so comm.Send and its friends are not needed here):

    minipar exercise check block_quantize block_quantize.py -n 1

THE SETTING (DeepSeek-V3, arXiv 2412.19437, §3.3; Micikevicius et al. 2022, arXiv 2209.05433)
    E4M3 is an 8-bit float: 1 sign bit, 4 exponent bits (bias 7), 3 mantissa bits.
    Its normal numbers are (1 + m/8)·2^e for m = 0..7 and e = -6..8; below 2^-6 the
    subnormals are k·2^-9 (k = 0..7); its largest finite value is 448 = 1.75·2^8 (the
    "fn" variant has no infinity: 1111.111 is NaN).  So between 1 and 2 it holds only
    1, 1.125, 1.25, ..., 1.875, and nothing above 448.

    To train in FP8 a tensor is multiplied into that range first: x ≈ q · scale with
    q in E4M3.  One scale for the whole tensor (the older recipe) is set by its largest
    value: a few outliers make every other value tiny in E4M3, where its 3 bits of
    mantissa become fewer (subnormals) or none (zero).  DeepSeek-V3 gives every TILE
    its own scale: 1x128 tiles of activations, 128x128 blocks of weights.

THE GOAL (three functions; numpy and ml_dtypes are allowed, minipar is not)
    * to_e4m3(v): each value of the float64 array v rounded to the nearest E4M3
      value, ties to the even mantissa (1.0625, halfway between 1 and 1.125, gives 1;
      1.1875 gives 1.25), and SATURATED: anything beyond ±448 becomes ±448, never
      inf or NaN (the recipes clip; a stale scale must not turn a value into NaN).
      Returned as float64 (or as an ml_dtypes float8_e4m3fn array).
      ml_dtypes.float8_e4m3fn rounds to nearest even, but turns values beyond 464
      into NaN: it does not saturate for you.
    * quantize(x, block) -> (q, scales): ``block`` is a tuple as long as x.ndim,
      e.g. (1, 128) or (128, 128).  Tiles are cut from the start of each axis; a tail
      shorter than a block is a tile of its own, so ``scales`` has shape
      ceil(n_i / b_i) per axis.  Each tile's scale = amax / 448 (amax = the largest
      |x| in the tile; a tile of zeros gets scale 1), and q = to_e4m3(x / scale),
      x's shape, the division done per element by its tile's scale.
    * dequantize(q, scales, block, shape) -> x: q times its tile's scale (float64).

WHAT THE GRADER MEASURES
    * to_e4m3 on values chosen for it: ties, subnormals, values beyond ±448;
    * quantize and dequantize on tensors with outliers, with tails (300 columns in
      1x128 tiles: 128 + 128 + 44), tiles of zeros, a flat buffer in tiles of 128:
      your scales, q and x back, all compared exactly with minipar's quantizer.
    A wrong result is named: a scale per tensor instead of per tile, a wrong
    rounding (truncation, ties away from zero), no saturation, a tail tile lost.
    Stuck?  minipar exercise hint block_quantize   (level 1, 2, 3)
"""

from __future__ import annotations

import numpy as np

E4M3_MAX = 448.0


def to_e4m3(v: np.ndarray) -> np.ndarray:
    """v rounded to the nearest E4M3 value (ties to even), saturated to ±448."""
    # TODO 1: round to E4M3's grid (ties to even) and saturate at ±E4M3_MAX
    raise NotImplementedError("TODO: round to E4M3, saturating")


def quantize(x: np.ndarray, block: tuple[int, ...]) -> tuple[np.ndarray, np.ndarray]:
    """(q, scales): one scale amax / 448 per tile (tails too), q = to_e4m3(x / scale)."""
    # TODO 2: the tile grid, ceil(n_i / b_i) per axis; each tile's amax and scale
    # TODO 3: each element divided by its tile's scale, rounded with to_e4m3
    raise NotImplementedError("TODO: a scale per tile, then q")


def dequantize(q: np.ndarray, scales: np.ndarray, block: tuple[int, ...],
               shape: tuple[int, ...]) -> np.ndarray:
    """q times its tile's scale, float64, of ``shape``."""
    # TODO 4: each element of q times the scale of its tile
    raise NotImplementedError("TODO: back to float64")


# -- the grader calls this on every rank: leave it as it is -----------------------------------
def quant_step(comm, x, **case):
    """Your functions on this case, as the grader reads them."""
    from minipar.exercises.block_quantize.grader import quant_step as grade

    return grade((to_e4m3, quantize, dequantize), comm, x, **case)
