"""The moe_dispatch exercise: the reference passes on 1-4 ranks, wrong ones fail, named.

Each grading run is one launch through minipar.launch.run (bounded by a
timeout); the wrong solutions live in tests/mpi/ex_wrong_moe_*.py.  The
generic checks every exercise gets (start, untouched skeleton) are in
tests/test_exercises.py, which iterates over EXERCISES.
"""

from __future__ import annotations

import numpy as np
import pytest
from conftest import MPI_DIR, assert_caught, failed

from minipar.exercises import get
from minipar.exercises.grading import check
from minipar.exercises.moe_dispatch import grader

NAME = "moe_dispatch"


@pytest.mark.parametrize("n", [2, 3, 4])
def test_reference_solution_passes(n):
    report = check(NAME, get(NAME).solution_path, n, timeout=90)
    assert report.passed, report.text()
    assert not failed(report) and all(c.ok for c in report.checks)
    assert report.verdict.startswith("PASS")
    (b,) = [c for c in report.checks if c.name.startswith("bytes per rank")]
    big = max(grader.cases(n), key=lambda c: c["C"] * c["d"])
    S = big["E"] * big["C"] * big["d"] * 8
    assert f"e.g. {2 * (n - 1) * S // n} bytes per rank for S = {S}" in b.detail


WRONG = [
    # file, failing check (substring), message (substrings)
    ("ex_wrong_moe_mapping.py", "result equals MPI's Alltoall",
     ["4 of 6 cases wrong", "Wrong expert-to-rank mapping", "rank e % N (strided)"]),
    ("ex_wrong_moe_everything.py", "bytes per rank = 2(N-1)/N x S",
     ["rank 0 sent 1966080 bytes = 3.75 x S (S = 524288", "the whole buffer to every rank"]),
    ("ex_wrong_moe_no_reverse.py", "result equals MPI's Alltoall",
     ["6 of 6 cases wrong", "Forgot the reverse permutation",
      "rank 1's experts that rank 0 got back are those of rank 2's tokens"]),
    ("ex_wrong_moe_no_combine.py", "result equals MPI's Alltoall",
     ["The combine all-to-all is missing"]),
    ("ex_wrong_moe_self_send.py", "bytes per rank = 2(N-1)/N x S",
     ["rank 0 sent 262144 bytes to itself", "stays on the rank"]),
    ("ex_wrong_moe_local_ids.py", "runs without error",
     ["rank 0 raised ValueError", "holds only experts 0..1", "expert 4 lives on rank 2",
      "ex_wrong_moe_local_ids.py:17: y = expert(i * n + r"]),
    ("ex_wrong_moe_send_cycle.py", "no deadlock",
     ["case: E 8, C 64, d 128", "waited more than 3 s for Send to rank",
      "ex_wrong_moe_send_cycle.py:14: comm.Send("]),
]


@pytest.mark.parametrize("file, check_name, words", WRONG, ids=[w[0] for w in WRONG])
def test_wrong_solution_is_caught(file, check_name, words):
    report = check(NAME, MPI_DIR / file, 4, timeout=60, watchdog=3)
    assert_caught(report, check_name, words)


def test_only_the_named_check_fails_when_the_result_is_right():
    """Whole buffer to everyone: the values are right, only the byte count fails."""
    report = check(NAME, MPI_DIR / "ex_wrong_moe_everything.py", 2, timeout=60)
    assert [c.name for c in failed(report)] == [report.checks[-1].name], report.text()
    assert "the whole buffer to every rank" in failed(report)[0].detail


# -- in process: cases, oracle pieces, the named mistakes -----------------------------------
@pytest.mark.parametrize("n", [1, 2, 3, 4])
def test_cases_divide_the_experts_and_the_routed_case_has_padding(n):
    cs = grader.cases(n)
    assert all(c["E"] % n == 0 for c in cs)
    (routed,) = [c for c in cs if c["values"] == "routed"]
    x = grader.buffers(routed, 0, n)
    assert x.shape == (routed["E"], routed["C"], routed["d"])
    filled = x.any(axis=2).sum()  # the rest is padding: experts that got fewer than C tokens
    assert 0 < filled <= grader.ROUTED_TOKENS * n < x.shape[0] * x.shape[1]
    assert np.array_equal(x, np.round(x))  # integer tokens: exact in any order


def test_expert_callable_refuses_experts_this_rank_does_not_hold():
    ex = grader.Experts(rank=1, size=4, E=8, d=4)
    t = np.ones((3, 4))
    assert np.array_equal(ex(2, t), t @ grader.weights(2, 4))
    with pytest.raises(ValueError, match="holds only experts 2..3.*expert 5 lives on rank 2"):
        ex(5, t)
    with pytest.raises(ValueError, match=r"\(rows, d = 4\)"):
        ex(3, np.ones(4))


def test_diagnose_names_each_mistake_and_is_silent_otherwise():
    n, case = 4, {"E": 8, "C": 3, "d": 4, "values": "random"}
    out = grader._outcomes(case, n)
    xs = [grader.buffers(case, q, n) for q in range(n)]
    right = grader.serial(case, xs[1])

    def said(got):
        return grader.diagnose(case, 1, n, xs[1], got, right) or ""

    assert "no expert ran" in said(out["no experts"](1))
    assert "Wrong expert-to-rank mapping" in said(out["mapping"](1))
    assert "combine all-to-all is missing" in said(out["no combine"](1))
    swapped = right.copy()
    swapped[4:6] = grader.serial(case, xs[3])[4:6]  # rank 2's experts, rank 3's tokens
    assert "rank 2's experts that rank 1 got back are those of rank 3's tokens" in said(swapped)
    noise = right.copy()
    noise[0, 0, 0] += 1
    assert said(noise) == ""


# -- loss_free_balancing: DeepSeek-V3's routing step (issue 34) -----------------------------
def test_loss_free_reference_passes_and_one_ranks_loads_are_named():
    from minipar.exercises.loss_free_balancing import grader as lf

    report = check("loss_free_balancing", get("loss_free_balancing").solution_path, 3,
                   timeout=90)
    assert report.passed, report.text()
    (b,) = [c for c in report.checks if c.name.startswith("exactly 1 all-reduce")]
    e = lf.cases(3)[-1]["E"]
    assert f"2(N-1)·S = {2 * 2 * 8 * e} bytes" in b.detail
    report = check("loss_free_balancing", MPI_DIR / "ex_wrong_lf_local_loads.py", 2,
                   timeout=60)
    assert_caught(report, "result equals the serial routing",
                  ["comes from THIS rank's loads only", "summed over every rank's tokens"])


def test_loss_free_diagnose_names_each_mistake_and_is_silent_otherwise():
    from minipar.exercises.loss_free_balancing import grader as lf
    from minipar.nn.moe_routing import choose, update_bias

    n, rank = 3, 1
    case = lf.cases(n)[1]
    scores, bias = lf._full(case["tokens"], case["E"], case["step"])
    mine = scores[lf._rows(case, rank)]
    k, u, e = case["k"], case["rate"], case["E"]
    right = lf.serial(case, rank)
    m = mine.shape[0] * k

    def said(out):
        return lf.diagnose(case, rank, n, mine, out, right) or ""

    order = right[:m].reshape(-1, k).astype(np.int64)
    biased = np.take_along_axis(mine + bias, order, axis=1)
    wrong = right.copy()
    wrong[m:2 * m] = (biased / biased.sum(axis=1, keepdims=True)).ravel()
    assert "the gates hold the bias" in said(wrong)
    plain = choose(mine, k)
    chosen = np.take_along_axis(mine, plain, axis=1)
    wrong = np.concatenate([plain.ravel().astype(np.float64),
                            (chosen / chosen.sum(axis=1, keepdims=True)).ravel(), right[2 * m:]])
    assert "chosen by s alone" in said(wrong)
    loads = np.bincount(choose(scores, k, bias).reshape(-1), minlength=e).astype(np.float64)
    wrong = np.concatenate([right[:2 * m], update_bias(bias, loads, -u)])
    assert "the sign is reversed" in said(wrong)
    noise = right.copy()
    noise[-1] += 1.0
    assert said(noise) == ""
