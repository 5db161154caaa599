"""Exercises tp_mlp and ring_attention_merge: the references pass on 1-4 ranks, wrong ones
are caught with the mistake named.

Every grading run is one launch through minipar.launch.run; the wrong solutions live in
tests/mpi/ex_wrong_tp_*.py and tests/mpi/ex_wrong_ringattn_*.py.  (Listing, starting and the
untouched skeletons of every exercise are tested in tests/test_exercises.py.)
"""

from __future__ import annotations

from itertools import pairwise

import numpy as np
import pytest
from conftest import MPI_DIR, failed

from minipar.exercises import get
from minipar.exercises.grading import check
from minipar.exercises.ring_attention_merge import grader as ra
from minipar.exercises.ring_attention_merge import solution as ra_sol
from minipar.exercises.tp_mlp import grader as tp


# -- in-process: the maths the graders rely on -----------------------------------------------
def test_tp_shards_of_the_serial_mlp_add_up():
    """Σ_r GELU(x W1_r + b1_r) W2_r + b2 is the serial y; the dx partials sum to the serial dx."""
    for n in (1, 2, 3):
        for case in tp.cases(n):
            if case["part"] != "forward":
                continue
            f, (y, dx, _) = tp._full(case), tp.serial(case)
            parts, dxs = [], []
            for r in range(n):
                x, kw = tp.make_input(case, r, n)
                a = x @ kw["w1"] + kw["b1"]
                parts.append(tp.gelu(a) @ kw["w2"])
                da = (f["dy"] @ kw["w2"].T) * tp.gelu_grad(a)
                dxs.append(da @ kw["w1"].T)
            np.testing.assert_allclose(sum(parts) + f["b_out"], y, rtol=0, atol=1e-13)
            np.testing.assert_allclose(sum(dxs), dx, rtol=0, atol=1e-13)



def test_tp_reference_solution_is_the_packages_parallel_mlp():
    """The reference solution (communication written out) and minipar's own ParallelMLP
    (f and g through minipar.mappings) give the same y and gradients (1 rank: one code
    path for the math; the grader's runs check the solution on 2-4 ranks)."""
    from mpi4py import MPI

    from minipar.comm import TracedComm
    from minipar.exercises.tp_mlp import solution
    from minipar.parallel.tensor_parallel.transformer import ParallelMLP

    comm = TracedComm(MPI.COMM_SELF)
    for case in tp.cases(1):
        x, kw = tp.make_input(case, 0, 1)
        dy = tp._full(case)["dy"]
        p = {"w_in": kw["w1"], "b_in": kw["b1"], "w_out": kw["w2"], "b_out": kw["b2"]}
        mlp = ParallelMLP(comm)
        y, saved = mlp.forward(p, x)
        dx, g = mlp.backward(p, saved, dy)
        args = (x, kw["w1"], kw["b1"], kw["w2"], kw["b2"])
        np.testing.assert_allclose(solution.forward(comm, *args), y, rtol=0, atol=1e-12)
        for mine, core in zip(solution.backward(comm, *args, dy),
                              (dx, g["w_in"], g["b_in"], g["w_out"], g["b_out"])):
            np.testing.assert_allclose(mine, core, rtol=0, atol=1e-12)

def test_merging_blocks_in_any_order_is_full_attention():
    g = np.random.default_rng(0)
    q, k, v = (g.standard_normal((2, 6, 3)) for _ in range(3))
    full, lse_full = ra_sol.attention_block(q, k, v)
    for cut in ([0, 2, 6], [0, 1, 3, 6], [0, 5, 6]):
        blocks = [ra_sol.attention_block(q, k[:, a:b], v[:, a:b]) for a, b in pairwise(cut)]
        o, lse = np.zeros(q.shape), np.full(q.shape[:-1], -np.inf)
        for part in reversed(blocks):
            o, lse = ra_sol.merge(o, lse, *part)
        np.testing.assert_allclose(o, full, rtol=0, atol=1e-14)
        np.testing.assert_allclose(lse, lse_full, rtol=0, atol=1e-14)
    # a fully masked block adds nothing; the plain average does not equal the merge
    o0, l0 = ra_sol.attention_block(q, k, v, np.zeros((6, 6), bool))
    assert np.all(o0 == 0) and np.all(l0 == -np.inf)
    o, lse = ra_sol.merge(full, lse_full, o0, l0)
    np.testing.assert_array_equal(o, full)
    halves = [ra_sol.attention_block(q, k[:, a:b], v[:, a:b])[0] for a, b in ((0, 3), (3, 6))]
    assert np.abs((halves[0] + halves[1]) / 2 - full).max() > 1e-3


def test_every_named_ring_mistake_differs_from_the_right_answer():
    """Each mistake the diagnosis names changes the output (else naming it would be luck)."""
    n = 4
    for case in ra.cases(n):
        want = ra.serial(case)[..., ra.rows(case, 2), :]
        np.testing.assert_allclose(ra.rerun(case, 2, n, ra._right, ra._right_mask), want,
                                   rtol=0, atol=1e-13)
        for name, (fn, _) in ra.MERGES.items():
            got = ra.rerun(case, 2, n, fn, ra._right_mask, average=name == "average")
            assert np.abs(got - want).max() > 1e-6, name
        if case["causal"] and case["block"] > 1:  # blocks of 1: the diagonal is 1 x 1, unmasked
            for name, (fn, _) in ra.MASKS.items():
                assert np.abs(ra.rerun(case, 2, n, ra._right, fn) - want).max() > 1e-6, name
    assert any(c["causal"] and c["block"] > 1 for c in ra.cases(n))


# -- reference solutions on 2-4 ranks -----------------------------------------------------------
@pytest.mark.parametrize("name, n", [(e, n) for e in ("tp_mlp", "ring_attention_merge")
                                     for n in (2, 3, 4)])
def test_reference_solution_passes(name, n):
    report = check(name, get(name).solution_path, n, timeout=90)
    assert report.passed and not failed(report), report.text()
    assert not [c for c in report.checks if c.ok is None], report.text()
    assert report.verdict.startswith("PASS")


# -- wrong solutions: caught, the mistake named -------------------------------------------------
RESULT_TP = "result equals the serial MLP"
RESULT_RA = "result equals full attention"
WRONG = [
    # file, exercise, ranks, failing checks (substrings, first one carries the words), words
    ("ex_wrong_tp_hidden_allreduce.py", "tp_mlp", 4, [RESULT_TP, "forward: exactly 1"],
     ["you all-reduced after the first (column-parallel) linear", "GELU is applied to it locally",
      "2 of 4 cases wrong. First: forward"]),
    ("ex_wrong_tp_no_dx_allreduce.py", "tp_mlp", 2, [RESULT_TP, "backward: exactly 1"],
     ["you forgot the all-reduce of dx", "First: backward"]),
    ("ex_wrong_tp_bias_every_rank.py", "tp_mlp", 3, [RESULT_TP],
     ["y is off by exactly (N-1) x b2 (N = 3)", "add b2 once, after the all-reduce"]),
    ("ex_wrong_tp_weight_grads.py", "tp_mlp", 4, [RESULT_TP, "backward: exactly 1"],
     ["dw1 is the sum of the N ranks' shards", "each rank owns a different shard"]),
    ("ex_wrong_ringattn_average.py", "ring_attention_merge", 4, [RESULT_RA],
     ["4 of 4 cases wrong", "the plain average of the blocks' partial outputs"]),
    ("ex_wrong_ringattn_no_rescale.py", "ring_attention_merge", 3, [RESULT_RA],
     ["the running o was not rescaled", "exp(lse_old - lse_new)"]),
    ("ex_wrong_ringattn_diagonal_mask.py", "ring_attention_merge", 4, [RESULT_RA],
     ["2 of 4 cases wrong. First: causal", "every block was masked with the lower triangle"]),
    ("ex_wrong_ringattn_future_seen.py", "ring_attention_merge", 2, [RESULT_RA],
     ["2 of 4 cases wrong. First: causal", "blocks from later ranks (src > r)"]),
]


@pytest.mark.parametrize("file, name, n, checks, words", WRONG, ids=[w[0] for w in WRONG])
def test_wrong_solution_is_caught(file, name, n, checks, words):
    report = check(name, MPI_DIR / file, n, timeout=60)
    assert not report.passed and report.verdict.startswith("FAIL")
    bad = failed(report)
    assert len(bad) == len(checks), report.text()  # exactly these checks fail
    for c, want in zip(bad, checks):
        assert want in c.name, report.text()
    for w in words:
        assert w in bad[0].detail, report.text()
