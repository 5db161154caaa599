"""minipar.quantize against the formats' definitions (OCP FP8 E4M3/E5M2, symmetric int8/int4).

The representable values are built here from the bit layout (sign, exponent, mantissa,
bias), not read from ``ml_dtypes``, so the quantizer is checked against the definition.
"""

from __future__ import annotations

import itertools

import numpy as np
import pytest

from minipar.quantize import (
    FORMATS,
    block_amax,
    dequantize,
    expand,
    pack_int4,
    quantize,
    storage_dtype,
    unpack_int4,
)

#: exponent bits, mantissa bits, bias; E4M3 (fn) has no inf: only S.1111.111 is nan
LAYOUT = {"e4m3": (4, 3, 7), "e5m2": (5, 2, 15)}


def representable(fmt: str) -> np.ndarray:
    """Every finite non-negative value of the format, sorted, from its bit layout."""
    e_bits, m_bits, bias = LAYOUT[fmt]
    vals = set()
    for e, m in itertools.product(range(2**e_bits), range(2**m_bits)):
        if fmt == "e4m3" and e == 2**e_bits - 1 and m == 2**m_bits - 1:
            continue  # nan
        if fmt == "e5m2" and e == 2**e_bits - 1:
            continue  # inf, nan
        if e == 0:
            vals.add(m / 2**m_bits * 2.0 ** (1 - bias))  # subnormal
        else:
            vals.add((1 + m / 2**m_bits) * 2.0 ** (e - bias))
    return np.array(sorted(vals))


@pytest.mark.parametrize("fmt", ["e4m3", "e5m2"])
def test_largest_finite_value_is_the_formats(fmt):
    grid = representable(fmt)
    assert grid[-1] == FORMATS[fmt] == {"e4m3": 448.0, "e5m2": 57344.0}[fmt]
    # every representable value survives quantization with scale 1 exactly
    x = np.concatenate([-grid[::-1], grid, [FORMATS[fmt]]])  # the last pins amax = max
    q, s = quantize(x, fmt, (x.size,))
    assert s.tolist() == [1.0]
    assert np.array_equal(q.astype(np.float64), x)


@pytest.mark.parametrize("fmt", ["e4m3", "e5m2"])
def test_round_to_nearest_even_at_every_midpoint(fmt):
    grid = representable(fmt)
    lo, hi = grid[:-1], grid[1:]
    mid = (lo + hi) / 2
    x = np.concatenate([mid, [FORMATS[fmt]]])  # max pins the scale to 1
    q, _ = quantize(x, fmt, (x.size,))
    got = q.astype(np.float64)[:-1]
    even = np.array([np.frombuffer(np.array(v).astype(storage_dtype(fmt)).tobytes(),
                                   np.uint8)[0] % 2 == 0 for v in lo])
    assert np.array_equal(got, np.where(even, lo, hi))  # the tie goes to the even code
    # a hair off the midpoint (below float32's resolution) rounds to the nearer side
    nudge = np.spacing(mid) * 4
    q_up, _ = quantize(np.concatenate([mid + nudge, [FORMATS[fmt]]]), fmt, (x.size,))
    q_dn, _ = quantize(np.concatenate([mid - nudge, [FORMATS[fmt]]]), fmt, (x.size,))
    assert np.array_equal(q_up.astype(np.float64)[:-1], hi)
    assert np.array_equal(q_dn.astype(np.float64)[:-1], lo)


@pytest.mark.parametrize("fmt", ["e4m3", "e5m2", "int8", "int4"])
def test_saturates_never_inf(fmt):
    top = FORMATS[fmt]
    # scale fixed by amax given: values beyond it saturate to ±max, not inf/nan
    x = np.array([0.5, 3.0, -1e9, 1e9, 2.0])
    q, s = quantize(x, fmt, (5,), amax=np.array([1.0]))
    v = q.astype(np.float64)
    assert np.all(np.isfinite(v)) and v[2] == -top and v[3] == top and v[1] == top
    assert s[0] == 1.0 / top


def test_integers_round_half_to_even_and_clip():
    x = np.array([0.5, 1.5, 2.5, -0.5, -2.5, 127.0, 6.5])
    q, s = quantize(x, "int8", (7,))
    assert s[0] == 1.0 and q.dtype == np.int8
    assert q.tolist() == [0, 2, 2, 0, -2, 127, 6]
    q4, s4 = quantize(np.array([7.0, 3.5, -2.5, 0.5]), "int4", (4,))
    assert s4[0] == 1.0 and q4.tolist() == [7, 4, -2, 0]


def test_blocks_tails_and_scales_shape():
    rng = np.random.default_rng(0)
    x = rng.standard_normal((5, 300))
    x[3, 260] = 40.0  # an outlier in the tail block of row 3
    q, s = quantize(x, "e4m3", (2, 128))
    assert s.shape == (3, 3)  # ceil(5/2), ceil(300/128): tails are blocks of their own
    amax = block_amax(x, (2, 128))
    for i, j in itertools.product(range(3), range(3)):
        blk = x[2 * i:2 * i + 2, 128 * j:128 * j + 128]
        assert amax[i, j] == np.abs(blk).max()
        assert s[i, j] == blk.__abs__().max() / 448
    assert s[1, 2] == 40.0 / 448  # only the outlier's block is coarse
    # a block of zeros gets scale 1
    z = np.zeros((3, 4))
    z[0, 0] = 1
    assert quantize(z, "e4m3", (1, 4))[1].ravel().tolist() == [1 / 448, 1.0, 1.0]
    # 1×128 tiles of a row shorter than 128: one tile per row
    assert quantize(x[:, :100], "e4m3", (1, 128))[1].shape == (5, 1)


@pytest.mark.parametrize("fmt", ["e4m3", "e5m2", "int8", "int4"])
@pytest.mark.parametrize("block", [(1, 128), (128, 128), (7, 33)])
def test_error_bound_per_block(fmt, block):
    """|x − deq(q)| <= scale·ulp/2 element-wise, ulp the format's spacing at x/scale."""
    rng = np.random.default_rng(1)
    x = rng.standard_normal((200, 300)) * np.exp(rng.uniform(-6, 6, (200, 1)))
    q, s = quantize(x, fmt, block)
    back = dequantize(q, s, fmt, block, x.shape)
    scale = np.repeat(np.repeat(s, block[0], 0), block[1], 1)[:200, :300]
    v = np.abs(x / scale)
    if fmt.startswith("int"):
        ulp = np.ones_like(v)
    else:
        e_bits, m_bits, bias = LAYOUT[fmt]
        e = np.maximum(np.floor(np.log2(np.maximum(v, 1e-300))), 1 - bias)
        ulp = 2.0 ** (e - m_bits)
    slack = 4 * np.finfo(np.float64).eps * np.abs(x)  # the division and the product
    assert np.all(np.abs(x - back) <= scale * ulp / 2 + slack)
    # and no block loses its largest element by more than half the coarsest step
    assert np.all(np.abs(x - back) <= scale * ulp.max() / 2 + slack)


def test_dtypes_and_float32_scales():
    x = np.linspace(-3, 3, 256, dtype=np.float32).reshape(2, 128)
    q, s = quantize(x, "e4m3", (1, 128))
    assert q.dtype == storage_dtype("e4m3") and q.dtype.itemsize == 1
    assert s.dtype == np.float32
    assert dequantize(q, s, "e4m3", (1, 128), x.shape).dtype == np.float32
    assert quantize(x, "e5m2", (1, 128))[0].dtype == storage_dtype("e5m2")


def test_int4_pack_round_trip():
    rng = np.random.default_rng(2)
    for n in (0, 1, 2, 7, 128, 129):
        q = rng.integers(-8, 8, n).astype(np.int8)
        packed = pack_int4(q)
        assert packed.dtype == np.uint8 and packed.size == (n + 1) // 2
        assert np.array_equal(unpack_int4(packed, n), q)
    x = rng.standard_normal(301)
    q, s = quantize(x, "int4", (128,))
    assert np.array_equal(unpack_int4(pack_int4(q), q.size), q)


def test_bad_block_and_format():
    with pytest.raises(ValueError, match="positive"):
        quantize(np.ones((2, 2)), "e4m3", (0, 2))
    with pytest.raises(ValueError, match="positive"):
        quantize(np.ones((2, 2)), "e4m3", (2,))
    with pytest.raises(ValueError, match="format"):
        quantize(np.ones(2), "fp4", (2,))


def test_a_block_longer_than_the_tensor_costs_only_the_tensor():
    """A block beyond an axis is one block along it: the same scales, and no B x B
    padding (--fp8-block 100000 once asked for 75 GB)."""
    x = np.random.default_rng(0).standard_normal((5, 7))
    for block in [(10**6, 10**6), (1, 10**6), (10**6, 1)]:
        whole = tuple(min(b, n) for b, n in zip(block, x.shape))
        q, s = quantize(x, "e4m3", block)
        q2, s2 = quantize(x, "e4m3", whole)
        assert s.shape == s2.shape and np.array_equal(s, s2)
        assert np.array_equal(q.astype(np.float64), q2.astype(np.float64))
        assert expand(s, block, x.shape).shape == x.shape
