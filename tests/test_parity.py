"""The parity verdict (``minipar.parallel.parity``): correct runs "equal", bugs "different".

Unit tests of :func:`compare` and :func:`not_comparable` on hand-made arrays
(the rule of the module docstring, branch by branch), then ONE launch of
tests/mpi/parity_sweep.py on 8 ranks: every (strategy, world size 1-8) of
dp, ps (sync) and ZeRO 0-3 on models from ``RunSpec()`` to d_model 64 /
4 layers, seeds 0-2, the issue's model on 2 and 3 ranks, says "equal"; the
deliberately broken runs (no 1/N, a skipped bucket, a one-step-stale shard,
a dropped gradient) say "different"; the margins to the tolerance are
>= 100x on both sides; a run past the horizon is never called "different".
"""

from __future__ import annotations

import json
import math
from functools import cache
from pathlib import Path

import numpy as np
import pytest

from minipar import launch
from minipar.parallel import common
from minipar.parallel.parity import (
    BUG_FLOOR,
    CORRECT_CEILING,
    FP8_CORRECT_CEILING,
    FP8_EARLY_LOSS_TOLERANCE,
    FP8_HORIZON_STEPS,
    FP8_TOLERANCE,
    HORIZON_STEPS,
    TOLERANCE,
    compare,
    not_comparable,
)

MPI_DIR = Path(__file__).parent / "mpi"
STRATEGIES = ("dp", "ps", "zero0", "zero1", "zero2", "zero3")
BUGS = ("no 1/N", "bucket skipped", "stale shard", "gradient dropped")


def _run(steps: int = 3, param_gap: float = 0.0, loss_gap: float = 0.0, early_gap: float = 0.0,
         psi: int = 50, seed: int = 0):
    """A serial run that moved θ_0 by exactly 0.03 (max), and a 'parallel' one off by
    ``param_gap`` of that distance and ``loss_gap`` (late) / ``early_gap`` of the loss."""
    rng = np.random.default_rng(seed)
    theta0 = rng.standard_normal(psi)
    move = rng.uniform(-0.03, 0.03, psi)
    move[0] = 0.03
    serial = theta0 + move
    par = serial.copy()
    par[3] += param_gap * 0.03
    ser_losses = np.linspace(2.3, 2.0, steps)
    losses = ser_losses.copy()
    losses[-1] += loss_gap * 2.3
    losses[min(1, steps - 1)] += early_gap * 2.3
    return losses, ser_losses, par, serial, theta0


# -- the rule, branch by branch ------------------------------------------------------
def test_rounding_is_equal_and_a_bug_is_different() -> None:
    v = compare(*_run(param_gap=4e-12, loss_gap=1e-16))
    assert v.status == "equal" and v.ok and v.tolerance == TOLERANCE
    assert v.param_gap == pytest.approx(4e-12, rel=1e-3)
    assert v.max_param_diff == pytest.approx(1.2e-13, rel=1e-3)
    assert v.line() == ("final parameters: equal to the serial run (max |diff| 1.2e-13, "
                        "4e-12 of the distance trained; tolerance 1e-7)")
    bug = compare(*_run(param_gap=0.5, loss_gap=1e-3))
    assert bug.status == "different" and not bug.ok
    assert bug.line().startswith("final parameters: DIFFERENT from the serial run "
                                 "(max |diff| 0.015, 0.5 of the distance trained")
    assert "; losses 0.001 of the loss" in bug.line()


@pytest.mark.parametrize("gap", [0.5 * TOLERANCE, 2 * TOLERANCE])
def test_the_threshold_is_the_tolerance_for_params_and_for_losses(gap: float) -> None:
    equal = gap <= TOLERANCE
    assert (compare(*_run(param_gap=gap)).status == "equal") == equal
    assert (compare(*_run(loss_gap=gap)).status == "equal") == equal


def test_tolerance_is_the_geometric_middle_of_the_measured_ceiling_and_floor() -> None:
    middle = math.sqrt(CORRECT_CEILING * BUG_FLOOR)
    assert middle / 2 < TOLERANCE < middle * 2
    assert TOLERANCE / CORRECT_CEILING >= 100 and BUG_FLOOR / TOLERANCE >= 100


def test_past_the_horizon_rounding_growth_is_not_comparable_but_an_early_bug_is_different() -> None:
    long = HORIZON_STEPS + 20
    chaos = compare(*_run(steps=long, param_gap=1e-3, loss_gap=1e-4))
    assert chaos.status == "not comparable" and chaos.ok
    assert f"rerun with --steps {HORIZON_STEPS} or fewer" in chaos.reason
    assert chaos.line().startswith("final parameters: not comparable: after 30 steps")
    early_bug = compare(*_run(steps=long, param_gap=1e-3, early_gap=1e-4))
    assert early_bug.status == "different"
    short = compare(*_run(steps=HORIZON_STEPS, param_gap=1e-3, loss_gap=1e-4))
    assert short.status == "different"  # within the horizon rounding stays small: a bug


def test_fp8_runs_have_their_own_tolerance_and_horizon() -> None:
    """FP8 (FP32 parameters): the measured E4M3 flips are equal, a bug's O(1) param gap is
    different, and past 5 steps agreeing early losses make the run not comparable."""
    losses, ser, par, serial, theta0 = _run(param_gap=0.05, loss_gap=2e-5)
    f32 = [a.astype(np.float32) for a in (par, serial, theta0)]
    assert compare(losses, ser, *f32).status == "not comparable"  # float32 without fp8
    v = compare(losses, ser, *f32, fp8=True)
    assert v.status == "equal" and v.tolerance == FP8_TOLERANCE
    assert compare(*_run(param_gap=FP8_CORRECT_CEILING), fp8=True).status == "equal"
    assert compare(*_run(param_gap=1.0, loss_gap=3.9e-4), fp8=True).status == "different"
    assert compare(*_run(param_gap=0.05), fp8=False).status == "different"  # float64's rule
    long = FP8_HORIZON_STEPS + 5
    chaos = compare(*_run(steps=long, param_gap=0.3, loss_gap=1e-3), fp8=True)
    assert chaos.status == "not comparable" and f"--steps {FP8_HORIZON_STEPS}" in chaos.reason
    bug = compare(*_run(steps=long, param_gap=0.3, early_gap=2 * FP8_EARLY_LOSS_TOLERANCE),
                  fp8=True)
    assert bug.status == "different"
    assert FP8_CORRECT_CEILING < FP8_TOLERANCE < 1.0  # a bug's param gap: 1.0 to 2.0


def test_not_comparable_says_why_and_exits_0() -> None:
    v = not_comparable("asynchronous updates with staleness 2 apply stale gradients")
    assert v.status == "not comparable" and v.ok and math.isnan(v.max_param_diff)
    assert v.line() == ("final parameters: not comparable: asynchronous updates with "
                        "staleness 2 apply stale gradients")
    losses, ser_losses, par, serial, _ = _run(param_gap=0.1)
    w = not_comparable("bf16 sums", losses, ser_losses, par, serial)
    assert w.max_param_diff == pytest.approx(0.003) and w.max_loss_diff == 0.0
    assert w.line().endswith("not comparable: bf16 sums (max |diff| 0.003)")
    d = json.loads(json.dumps(w.as_dict(), allow_nan=False))
    assert d["status"] == "not comparable" and d["ok"] is True and d["tolerance"] is None
    with pytest.raises(ValueError, match="reason"):
        not_comparable("  ")


def test_narrow_params_are_not_comparable_and_nan_is_different() -> None:
    losses, ser_losses, par, serial, theta0 = _run()
    v = compare(losses, ser_losses, par.astype(np.float32), serial, theta0)
    assert v.status == "not comparable" and "float32 parameters" in v.reason
    par[7] = np.nan
    assert compare(losses, ser_losses, par, serial, theta0).status == "different"
    long = _run(steps=HORIZON_STEPS + 5)
    long[2][7] = np.inf  # not finite is broken, never "rounding grew past the horizon"
    v = compare(*long)
    assert v.status == "different"
    assert json.loads(json.dumps(v.as_dict(), allow_nan=False))["param_gap"] is None


def test_a_diverged_serial_run_is_not_comparable() -> None:
    """When the oracle itself is not finite (an absurd --lr), nothing can be compared; a
    parallel run that diverges while the serial one does not stays "different"."""
    losses, ser_losses, par, serial, theta0 = _run()
    ser_bad, par_bad = serial.copy(), par.copy()
    ser_bad[3], par_bad[3] = np.nan, np.nan
    v = compare(losses, ser_losses, par_bad, ser_bad, theta0)
    assert v.status == "not comparable" and "serial run itself diverged" in v.reason and v.ok
    assert compare(losses, ser_losses, par_bad, serial, theta0).status == "different"


def test_without_theta0_the_yardstick_is_the_parameters_size() -> None:
    losses, ser_losses, par, serial, _ = _run(param_gap=1e-6)
    v = compare(losses, ser_losses, par, serial, None)
    assert v.yardstick == "parameters' size" and "of the parameters' size" in v.line()
    assert v.param_gap == pytest.approx(v.max_param_diff / np.abs(serial).max())
    with pytest.raises(ValueError, match="not the same model"):
        compare(losses, ser_losses, par[:-1], serial, None)
    with pytest.raises(ValueError, match="same number of steps"):
        compare(losses[:-1], ser_losses, par, serial, None)


def test_common_parity_delegates_to_compare() -> None:
    # the report: 1.29e-13 apart after 3 steps, "DIFFERENT" under rtol 1e-12 / atol 1e-13
    losses, ser_losses, par, serial, theta0 = _run()
    serial[3], par[3] = 1e-3, 1e-3 + 1.29e-13
    assert not np.allclose(par, serial, rtol=common.PARITY_RTOL, atol=common.PARITY_ATOL)
    assert compare(losses, ser_losses, par, serial, theta0).status == "equal"
    assert common.parity(losses, ser_losses, par, serial, theta0)
    assert common.parity(losses, ser_losses, par, serial)
    assert not common.parity(*_run(param_gap=1e-3)[:4])
    assert not common.parity(losses, ser_losses, par.astype(np.float32), serial)  # not "equal"


# -- the sweep: one launch of 8 ranks ------------------------------------------------
@cache
def _sweep() -> dict:
    proc = launch.run(8, str(MPI_DIR / "parity_sweep.py"), timeout=240,
                      env={"MINIPAR_WATCHDOG_S": "60"})
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    line = [ln for ln in proc.stdout.splitlines() if ln.startswith("PARITY-SWEEP ")]
    assert line, proc.stdout[-3000:]
    return json.loads(line[0][len("PARITY-SWEEP "):])


def _gap(case: dict) -> float:
    v = case["verdict"]
    return max(v["param_gap"], v["loss_gap"])


def _correct() -> list[dict]:
    return [c for c in _sweep()["cases"] if c["bug"] is None and c["steps"] <= HORIZON_STEPS]


def test_sweep_every_correct_run_is_equal() -> None:
    cases = _correct()
    assert {(c["strategy"], c["w"]) for c in cases} == {
        (s, w) for s in STRATEGIES for w in range(1, 9) if (s, w) != ("ps", 1)}
    assert {(c["size"], c["seed"]) for c in cases} == {
        (size, seed) for size in ("default", "d24x2, 10 steps", "issue", "d64x4")
        for seed in (0, 1, 2)}
    for w in (2, 3):
        assert {c["strategy"] for c in cases if (c["w"], c["size"], c["seed"]) == (w, "issue", 0)} \
            == set(STRATEGIES)
    bad = [(c["strategy"], c["w"], c["size"], c["seed"], c["verdict"]["line"])
           for c in cases if c["verdict"]["status"] != "equal"]
    assert not bad, bad


def test_sweep_broken_runs_are_different_with_margins() -> None:
    broken = [c for c in _sweep()["cases"] if c["bug"] is not None]
    assert {c["bug"] for c in broken} == set(BUGS)
    assert {c["strategy"] for c in broken} == set(STRATEGIES)
    for c in broken:
        assert c["verdict"]["status"] == "different", c
        # visible in the early losses too, so the horizon rule can never hide it
        assert max(c["loss_diffs"][:HORIZON_STEPS]) / c["loss_scale"] >= 100 * TOLERANCE, c
    largest_correct, smallest_broken = max(map(_gap, _correct())), min(map(_gap, broken))
    assert largest_correct <= TOLERANCE / 100 <= TOLERANCE * 100 <= smallest_broken
    for s in STRATEGIES:  # per strategy, for the report
        ok = max(_gap(c) for c in _correct() if c["strategy"] == s)
        bad = min(_gap(c) for c in broken if c["strategy"] == s)
        print(f"{s}: largest correct gap {ok:.2g}, smallest broken gap {bad:.2g}")


def test_sweep_past_the_horizon_is_never_different() -> None:
    long = [c for c in _sweep()["cases"] if c["bug"] is None and c["steps"] > HORIZON_STEPS]
    assert long and all(c["verdict"]["ok"] for c in long), long
    for c in long:
        print(f"{c['steps']} steps, lr 0.1: {c['verdict']['line']}")
