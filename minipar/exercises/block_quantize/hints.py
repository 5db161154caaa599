"""Hints for block_quantize, one level at a time (``minipar exercise hint block_quantize``)."""

HINTS = (
    """Three small steps.  to_e4m3: clip first (saturation), then round; ml_dtypes can
round for you.  quantize: the tile grid is ceil(n / b) per axis -- with 300 columns and
tiles of 128 that is 3 tiles, the last one 44 wide.  dequantize: the same grid, q times
each tile's scale.""",
    """to_e4m3: np.clip(v, -448, 448).astype(ml_dtypes.float8_e4m3fn) rounds to nearest
even (by hand: the spacing in [2^e, 2^(e+1)) is 2^(e-3), 2^-9 below 2^-6; np.rint rounds
ties to even, np.floor(m + 0.5) does not).  A tile's scale: one np.abs(x[tile]).max() per
tile, each tile on its own -- not np.abs(x).max() of the whole tensor.  Spread the scales
back over the elements with np.repeat along each axis, then cut to x's shape.""",
    """Step by step:
    grid = tuple(-(-n // b) for n, b in zip(x.shape, block))
    scales = np.ones(grid)
    for idx in np.ndindex(*grid):
        tile = tuple(slice(i * b, (i + 1) * b) for i, b in zip(idx, block))
        amax = np.abs(x[tile]).max()
        scales[idx] = amax / 448 if amax > 0 else 1.0
    full = scales
    for ax, b in enumerate(block):
        full = np.repeat(full, b, axis=ax)
    full = full[tuple(slice(0, n) for n in x.shape)]
    return to_e4m3(x / full), scales""",
)
