"""block_quantize (notebook 12's exercise): the grader names each mistake the recipes warn of.

One launch grades a wrong file end to end (tests/test_exercises.py runs the reference
solution and the skeleton); the other mistakes are graded here in this process, case by
case, as the worker does (``quant_step``, ``oracle``, ``diagnose``): no MPI launch each.
"""

from __future__ import annotations

import math

import ml_dtypes
import numpy as np
import pytest

from minipar.exercises.block_quantize import grader, solution

SAT = 448.0


def _cast_sat(v):
    return np.clip(v, -SAT, SAT).astype(ml_dtypes.float8_e4m3fn)


def _quantizer(to_e4m3, grid_of=lambda n, b: -(-n // b), per_tensor=False):
    def quantize(x, block):
        grid = tuple(grid_of(n, b) for n, b in zip(x.shape, block))
        scales = np.ones(grid)
        for idx in np.ndindex(*grid):
            tile = tuple(slice(i * b, (i + 1) * b) for i, b in zip(idx, block))
            amax = np.abs(x[tile]).max()
            scales[idx] = amax / SAT if amax > 0 else 1.0
        if per_tensor:
            scales[...] = np.abs(x).max() / SAT
        full = grader._spread(scales, block, x.shape)
        if full.shape != x.shape:  # tiles lost: the tail left out of q
            full = np.pad(full, [(0, n - m) for n, m in zip(x.shape, full.shape)],
                          constant_values=np.inf)
        return np.asarray(to_e4m3(x / full), dtype=np.float64), scales
    return quantize


def _dequantize(q, scales, block, shape, divide=False):
    full = grader._spread(scales, block, shape)
    full = np.pad(full, [(0, n - m) for n, m in zip(shape, full.shape)], constant_values=1.0)
    return q.astype(np.float64) / full if divide else q.astype(np.float64) * full


def _said(fns) -> list[str]:
    """Each case graded as the worker grades it: None where right, else the named mistake."""
    out = []
    for case in grader.cases(1):
        x, kw = grader.make_input(case, 0, 1)
        got = grader.quant_step(fns, None, x.copy(), **kw)
        want, _ = grader.oracle(None, case, x.copy())
        assert got.shape == want.shape and got.dtype == want.dtype
        out.append(None if np.array_equal(got, want) else
                   grader.diagnose(case, 0, 1, x, got, want) or "unnamed")
    return out


def test_the_reference_solution_matches_on_every_case_in_process():
    fns = (solution.to_e4m3, solution.quantize, solution.dequantize)
    assert _said(fns) == [None] * len(grader.cases(1))


def test_the_hand_rounding_is_the_format_itself():
    """grader.e4m3 (the mistakes' arithmetic) equals ml_dtypes' E4M3 on every value, ties
    included: the spacing 2^(e-3), subnormals 2^-9, 448 the largest."""
    codes = np.arange(256, dtype=np.uint8).view(ml_dtypes.float8_e4m3fn).astype(np.float64)
    codes = np.unique(codes[np.isfinite(codes)])
    assert codes.max() == SAT and codes[codes > 0].min() == 2.0**-9
    mids = (codes[1:] + codes[:-1]) / 2
    v = np.concatenate([codes, mids, np.linspace(-460, 460, 20001)])
    assert np.array_equal(grader.e4m3(v), _cast_sat(v).astype(np.float64))


@pytest.mark.parametrize("name, fns, words", [
    ("truncation", (lambda v: grader.e4m3(v, "trunc"),), "truncated toward zero"),
    ("ties away", (lambda v: grader.e4m3(v, "away"),), "ties go away from zero"),
    ("no saturation", (lambda v: np.asarray(v).astype(ml_dtypes.float8_e4m3fn),),
     "no saturation: 470 became nan"),
])
def test_a_wrong_rounding_is_named(name, fns, words):
    (to_e4m3,) = fns
    said = _said((to_e4m3, _quantizer(to_e4m3), _dequantize))
    assert said[0] is not None and words in said[0], said
    if name != "no saturation":  # the tiles' own values are rounded the same wrong way
        assert said[-1] is not None and said[-1].startswith("q: ") and words in said[-1], said


def test_a_scale_per_tensor_is_named():
    said = _said((_cast_sat, _quantizer(_cast_sat, per_tensor=True), _dequantize))
    assert said[0] is None
    for s in said[1:4]:  # the three tensors with outliers
        assert s is not None and "one scale for the whole tensor" in s, said


def test_a_lost_tail_tile_is_named():
    said = _said((_cast_sat, _quantizer(_cast_sat, grid_of=lambda n, b: n // b), _dequantize))
    assert said[0] is None
    assert "the tail tile is lost: along axis 1 you have 2 tiles, floor(300 / 128)" in said[1]
    assert "ceil(300 / 128) = 3 tiles" in said[1]
    assert "the tail tile is lost" in said[2] and "the tail tile is lost" in said[3]


def test_a_dequantize_that_divides_is_named():
    said = _said((_cast_sat, _quantizer(_cast_sat),
                  lambda q, s, b, shape: _dequantize(q, s, b, shape, divide=True)))
    assert "dequantize divides by the scale" in said[1], said


def test_every_case_has_a_tail_but_the_exact_one():
    tails = [any(n % b for n, b in zip(c["shape"], c["block"])) for c in grader.cases(1)[1:]]
    assert tails == [True, True, True, False]
    assert all(c["length"] == len(c["shape"]) + math.prod(
        -(-n // b) for n, b in zip(c["shape"], c["block"])) + 2 * math.prod(c["shape"])
        for c in grader.cases(1)[1:])


def test_start_names_the_three_functions_and_check_runs_on_one_rank(tmp_path, capsys,
                                                                   monkeypatch):
    """``start`` names all three functions and the check it suggests; ``check`` without
    ``-n`` runs on the one rank the docstring says is enough (other exercises: 4)."""
    from minipar.exercises import cli as ex_cli
    from minipar.exercises import grading

    assert ex_cli.main(["start", "block_quantize", "--dir", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "fill in to_e4m3(), quantize() and dequantize(), then run" in out
    assert out.rstrip().endswith(f"check block_quantize {tmp_path / 'block_quantize.py'} -n 1")
    ranks = []

    def fake_check(name, file, n, **kw):
        ranks.append(n)
        raise ValueError("stop here")
    monkeypatch.setattr(grading, "check", fake_check)
    for name in ("block_quantize", "ring_allreduce"):
        assert ex_cli.main(["check", name, "--solution"]) == 2
    assert ranks == [1, 4]
