"""Grader of block_quantize: the learner's E4M3 rounding and tiles against minipar's quantizer.

EN block-wise quantization grader · RU проверка поблочного квантования · ZH 分块量化评分

Two kinds of case.  ``cast``: values chosen for the rounding (ties, subnormals, values
beyond ±448), the oracle the E4M3 cast with saturation (``np.clip`` to ±448, then
``ml_dtypes.float8_e4m3fn``: round to nearest even).  ``tiles``: a tensor (outliers, a
tail shorter than a block, a tile of zeros, a flat buffer) quantized with a block shape;
the oracle :func:`minipar.quantize.quantize` and :func:`~minipar.quantize.dequantize`
(format ``e4m3``).  A tiles result travels as one float64 array: the scales' grid shape
(one number per axis), the scales, q, and x dequantized, each cut or padded (NaN) to the
expected size, so a wrong grid is a wrong value, not a wrong length, and can be named.
Compared exactly: the scale is amax / 448 and q = E4M3(x / scale), one rounding each.

``diagnose`` recomputes the mistakes the recipes warn about and names the one that gives
the learner's numbers: one scale for the whole tensor, truncation or ties away from
zero instead of nearest even, no saturation (inf or NaN beyond ±448), the tail tile lost
(floor(n / b) tiles instead of ceil).
"""

from __future__ import annotations

import math
from typing import Any

import ml_dtypes
import numpy as np
from mpi4py import MPI

from minipar import quantize as Q
from minipar.exercises.grading import Check
from minipar.exercises.judging import Records, contract_checks

E4M3_MAX = 448.0
SEED = 2412_19437  # DeepSeek-V3's arXiv number
FIRST_STEP = (
    "to_e4m3() (TODO 1), then quantize() and dequantize() (TODOs 2-4): THE GOAL in the "
    "file's docstring says what each returns; the grid of tiles is ceil(n / b) per axis."
)
#: (name, shape, block, outliers): a tail on every tiled case but the exact one
TILES = (
    ("activations, 1x128 tiles", (4, 300), (1, 128), True),
    ("weights, 4x8 blocks", (10, 20), (4, 8), True),
    ("flat buffer, tiles of 128", (300,), (128,), True),
    ("scale 1: ties", (2, 16), (1, 8), False),
)


def cases(n: int) -> list[dict]:
    cast = [{"kind": "cast", "name": "ties, subnormals, beyond ±448", "shape": [64],
             "block": [], "length": 64, "dtype": "float64"}]
    tiles = [{"kind": "tiles", "name": name, "shape": list(shape), "block": list(block),
              "length": _length(shape, block), "dtype": "float64"}
             for name, shape, block, _ in TILES]
    return cast + tiles


def _grid(shape: tuple[int, ...], block: tuple[int, ...]) -> tuple[int, ...]:
    return tuple(math.ceil(n / b) for n, b in zip(shape, block))


def _length(shape: tuple[int, ...], block: tuple[int, ...]) -> int:
    return len(shape) + math.prod(_grid(shape, block)) + 2 * math.prod(shape)


def label(case: dict) -> str:
    if case["kind"] == "cast":
        return f"to_e4m3: {case['name']}"
    shape = "x".join(map(str, case["shape"]))
    return f"{case['name']} ({shape}, block {tuple(case['block'])})"


def _cast_values() -> np.ndarray:
    """Ties (to even: down and up), subnormals and their ties, exact values, beyond 448."""
    ties = [1.0625, 1.1875, -1.0625, -1.1875, 3.25, 3.75, 13.0, 15.0, 288.0, 416.0,
            1.5 * 2**-9, 2.5 * 2**-9, -2.5 * 2**-9, 0.5 * 2**-9]
    exact = [0.0, 1.0, -1.125, 448.0, -448.0, 2**-9, 7 * 2**-9, 2**-6]
    beyond = [449.0, 470.0, 500.0, -600.0, 1e6, -1e6]
    rng = np.random.default_rng(SEED)
    rest = rng.standard_normal(64 - len(ties) - len(exact) - len(beyond)) * 20.0
    return np.array(ties + exact + beyond + list(rest), dtype=np.float64)


def _tensor(case: dict) -> np.ndarray:
    shape, i = tuple(case["shape"]), [t[0] for t in TILES].index(case["name"])
    rng = np.random.default_rng([SEED, i])
    if not TILES[i][3]:  # every tile's amax is 448 (scale 1): the ties stay ties
        x = rng.choice([1.0625, 1.1875, 3.25, 3.75, -13.0, 0.3], size=shape)
        x[..., 0] = 448.0
        return x
    x = rng.standard_normal(shape)
    flat = x.reshape(-1)
    flat[rng.choice(flat.size, 3, replace=False)] *= 300.0  # a few outliers
    if len(shape) == 2 and shape[0] > 8:
        x[8:] = 0.0  # the last row of blocks: tiles of zeros (scale 1)
    return x


def make_input(case: dict, rank: int, size: int) -> tuple[np.ndarray, dict]:
    """The values (cast) or the tensor (tiles), and the case."""
    x = _cast_values() if case["kind"] == "cast" else _tensor(case)
    return x, {"kind": case["kind"], "block": tuple(case["block"])}


def _fit(a: Any, shape: tuple[int, ...]) -> np.ndarray:
    """``a`` as float64 of ``shape``: the overlap copied, the rest NaN."""
    out = np.full(shape, np.nan)
    try:
        a = np.asarray(a, dtype=np.float64)
    except (TypeError, ValueError):
        return out
    if a.ndim != len(shape):
        a = a.reshape(-1)[:math.prod(shape)] if a.size == math.prod(shape) else a
        if a.ndim != len(shape):
            return out
        a = a.reshape(shape)
    cut = tuple(slice(0, min(m, n)) for m, n in zip(a.shape, shape))
    out[cut] = a[cut]
    return out


def _pack(scales: Any, q: Any, back: Any, x: np.ndarray, block: tuple[int, ...]) -> np.ndarray:
    grid = _grid(x.shape, block)
    have = np.shape(scales) if np.ndim(scales) == x.ndim else (np.nan,) * x.ndim
    return np.concatenate([np.asarray(have, dtype=np.float64), _fit(scales, grid).ravel(),
                           _fit(q, x.shape).ravel(), _fit(back, x.shape).ravel()])


def quant_step(fns: tuple, comm: Any, x: np.ndarray, kind: str,
               block: tuple[int, ...]) -> np.ndarray:
    """The learner's functions on this case: to_e4m3's values, or pack(grid, scales, q, x back)."""
    to_e4m3, quantize, dequantize = fns
    if kind == "cast":
        return _fit(to_e4m3(x.copy()), x.shape)
    q, scales = quantize(x.copy(), tuple(block))
    back = dequantize(q, scales, tuple(block), x.shape)
    return _pack(scales, q, back, x, tuple(block))


def oracle(raw: MPI.Comm, case: dict, x: np.ndarray) -> tuple[np.ndarray, None]:
    if case["kind"] == "cast":
        return np.clip(x, -E4M3_MAX, E4M3_MAX).astype(ml_dtypes.float8_e4m3fn).astype(
            np.float64), None
    block = tuple(case["block"])
    q, scales = Q.quantize(x, "e4m3", block)
    return _pack(scales, q, Q.dequantize(q, scales, "e4m3", block, x.shape), x, block), None


# -- naming the mistake (rank side, no message sent) ---------------------------------------
def e4m3(v: np.ndarray, rounding: str = "even", saturate: bool = True) -> np.ndarray:
    """E4M3 by hand: the spacing 2^(e-3) in [2^e, 2^(e+1)), 2^-9 below 2^-6 (subnormals);
    ``rounding`` "even" (the format's), "away" (ties away from zero), "trunc" (toward 0)."""
    a = np.abs(v)
    e = np.maximum(np.floor(np.log2(np.where(a > 0, a, 1.0))), -6.0)
    ulp = 2.0 ** (e - 3)
    m = a / ulp
    r = {"even": np.rint, "away": lambda t: np.floor(t + 0.5), "trunc": np.floor}[rounding](m)
    out = np.sign(v) * r * ulp
    if saturate:
        return np.clip(out, -E4M3_MAX, E4M3_MAX)
    return np.where(np.abs(out) > E4M3_MAX, np.sign(v) * np.inf, out)


ROUNDINGS = {
    "trunc": "your values are truncated toward zero (the next E4M3 value below |v|): E4M3 "
             "rounds to the NEAREST value, ties to the even mantissa (1.0625 -> 1, "
             "1.1875 -> 1.25); truncation biases every value toward zero",
    "away": "your ties go away from zero (1.0625 -> 1.125, np.floor(m + 0.5) or Python's "
            "round-half-up): E4M3 rounds ties to the EVEN mantissa (1.0625 -> 1, "
            "1.1875 -> 1.25; np.rint, or ml_dtypes' cast), so the errors do not drift",
}


def _rounding_mistake(v: np.ndarray, got: np.ndarray) -> str | None:
    finite = np.isfinite(got)
    beyond = (np.abs(v) > E4M3_MAX) & (~finite | (np.abs(got) > E4M3_MAX))
    if beyond.any():
        i = int(np.flatnonzero(beyond)[0])
        return (f"no saturation: {v[i]:g} became {got[i]:g}. E4M3 (the fn variant) has no "
                "infinity: past its largest value, 448, a cast gives NaN (ml_dtypes, from "
                "464 on) or inf; the recipes clip to ±448 first (np.clip), so a value past "
                "a stale scale stays a number.")
    for rounding, words in ROUNDINGS.items():
        if np.array_equal(got, e4m3(v, rounding)):
            return words + "."
    return None


def diagnose(case: dict, rank: int, size: int, x: np.ndarray, out: np.ndarray,
             expected: np.ndarray) -> str | None:
    if out.shape != expected.shape:
        return None
    if case["kind"] == "cast":
        return _rounding_mistake(x, out)
    shape, block = x.shape, tuple(case["block"])
    grid, nd = _grid(shape, block), x.ndim
    k = math.prod(grid)
    have, scales = out[:nd], out[nd:nd + k].reshape(grid)
    q, back = out[nd + k:nd + k + x.size].reshape(shape), out[nd + k + x.size:].reshape(shape)
    want_scales = expected[nd:nd + k].reshape(grid)
    floor = tuple(n // b for n, b in zip(shape, block))
    lost = [ax for ax in range(nd) if have[ax] == floor[ax] != grid[ax]]
    if lost:
        ax = lost[0]
        return (f"the tail tile is lost: along axis {ax} you have {floor[ax]} tiles, "
                f"floor({shape[ax]} / {block[ax]}); the last {shape[ax] % block[ax]} values "
                f"are a tile of their own, ceil({shape[ax]} / {block[ax]}) = {grid[ax]} "
                "tiles (range(0, n, b), not range(n // b)).")
    tensor = np.abs(x).max() / E4M3_MAX
    if np.allclose(scales, tensor, rtol=1e-12, atol=0) and not np.allclose(
            want_scales, tensor, rtol=1e-12, atol=0):
        return (f"one scale for the whole tensor ({tensor:.4g} = its amax / 448) instead of "
                f"one per tile: the outliers set it for every value, and the small ones "
                "fall into E4M3's subnormals or to zero. Each tile's own amax / 448 "
                "(DeepSeek-V3's 1x128 tiles and 128x128 blocks).")
    if not np.array_equal(scales, want_scales):
        return None
    full = _spread(want_scales, block, shape)
    if not np.array_equal(q, expected[nd + k:nd + k + x.size].reshape(shape)):
        mistake = _rounding_mistake(x / full, q)
        return "q: " + mistake if mistake else None
    if np.allclose(back, q / full, rtol=1e-12, atol=0):
        return ("dequantize divides by the scale: x is q TIMES its tile's scale "
                "(quantize divided by it).")
    return None


def _spread(scales: np.ndarray, block: tuple[int, ...], shape: tuple[int, ...]) -> np.ndarray:
    for ax, b in enumerate(block):
        scales = np.repeat(scales, b, axis=ax)
    return scales[tuple(slice(0, n) for n in shape)]


def judge(n: int, cases: list[dict], records: Records) -> list[Check]:
    checks = contract_checks(cases, records, label, "quantizer")
    for c in checks:
        c.name = c.name.replace(
            "returns a new array with the input's shape and dtype",
            "returns arrays the grader can read").replace(
            "result equals MPI's quantizer",
            "equals minipar's quantizer: E4M3 nearest-even, saturated, a scale per tile")
    # the input is copied before your functions see it, and no message is sent
    return [c for c in checks if not c.name.startswith(("leaves the input", "built from"))]
