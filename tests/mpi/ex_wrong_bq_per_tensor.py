"""Wrong block_quantize: one scale for the whole tensor (the older recipe), not one per tile."""

import ml_dtypes
import numpy as np


def to_e4m3(v):
    return np.clip(v, -448.0, 448.0).astype(ml_dtypes.float8_e4m3fn)


def quantize(x, block):
    grid = tuple(-(-n // b) for n, b in zip(x.shape, block))
    amax = np.abs(x).max()
    scale = amax / 448.0 if amax > 0 else 1.0
    return to_e4m3(x / scale), np.full(grid, scale)


def dequantize(q, scales, block, shape):
    return q.astype(np.float64) * scales.reshape(-1)[0]


def quant_step(comm, x, **case):
    from minipar.exercises.block_quantize.grader import quant_step as grade

    return grade((to_e4m3, quantize, dequantize), comm, x, **case)
