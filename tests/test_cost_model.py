"""The alpha-beta-gamma model of an all-reduce (minipar.collectives.cost_model): its
formulas, its choice, the committed calibration file and the bad files it refuses."""

from __future__ import annotations

import json
import math

import pytest

from minipar.collectives import cost_model as M

COSTS = M.LinkCosts(alpha_s=10e-6, beta_s_per_byte=1e-9, gamma_s_per_byte=2e-10)


def test_formulas_of_thakur_rabenseifner_gropp() -> None:
    a, b, g, s = 10e-6, 1e-9, 2e-10, 1 << 20
    assert M.allreduce_time("ring", s, 4, COSTS) == pytest.approx(6 * a + 1.5 * s * b + 0.75 * s * g)
    assert M.allreduce_time("recursive_doubling", s, 4, COSTS) == pytest.approx(2 * (a + s * b + s * g))
    # N = 3 is not a power of two: one round among 2, plus the fold in and out
    assert M.allreduce_time("recursive_doubling", s, 3, COSTS) == pytest.approx(
        (a + s * b + s * g) + 2 * a + 2 * s * b + s * g)
    assert M.allreduce_time("ring", s, 1, COSTS) == 0.0


def test_two_ranks_the_additions_decide_from_2_alpha_over_gamma() -> None:
    cross = 2 * COSTS.alpha_s / COSTS.gamma_s_per_byte
    assert M.choose_by_model(int(cross) - 8, 2, COSTS) == "recursive_doubling"
    assert M.choose_by_model(int(cross) + 8, 2, COSTS) == "ring"
    no_gamma = M.LinkCosts(10e-6, 1e-9, 1e-30)
    assert M.choose_by_model(1 << 30, 2, no_gamma) == "recursive_doubling"  # alpha-beta alone


def test_once_the_ring_wins_it_wins_for_every_larger_size() -> None:
    for n in range(2, 17):
        picks = [M.choose_by_model(1 << k, n, COSTS) for k in range(40)]
        first = picks.index("ring")
        assert set(picks[first:]) == {"ring"} and set(picks[:first]) <= {"recursive_doubling"}


def test_the_committed_calibration_loads() -> None:
    c = M.load_costs()
    assert all(math.isfinite(v) and v > 0 for v in (c.alpha_s, c.beta_s_per_byte,
                                                    c.gamma_s_per_byte))
    assert "calibrate" in c.measured
    assert M.choose_by_model(8, 2) == "recursive_doubling"


@pytest.mark.parametrize("content,match", [
    ("not json", "not JSON"), ("[1, 2]", "alpha_s must be"),
    (json.dumps({"alpha_s": 1e-5, "beta_s_per_byte": -1, "gamma_s_per_byte": 1e-10}),
     "beta_s_per_byte must be"),
])
def test_a_bad_calibration_file_is_one_clear_error(tmp_path, content, match) -> None:
    f = tmp_path / "cal.json"
    f.write_text(content)
    with pytest.raises(ValueError, match=match):
        M.load_costs(f)
    with pytest.raises(ValueError, match="cannot read"):
        M.load_costs(tmp_path / "missing.json")


def test_bad_arguments() -> None:
    with pytest.raises(ValueError):
        M.allreduce_time("tree", 8, 2, COSTS)
    with pytest.raises(ValueError):
        M.allreduce_time("ring", -1, 2, COSTS)
