"""Pipeline-schedule exercises (gpipe_schedule, one_f_one_b, zb_h1_schedule, dualpipev_schedule):
references pass, wrong ones are named.

Most of the grading is pure (checker and simulator on the learner's lists), so
every wrong solution in tests/mpi/ex_wrong_gpipe_*.py / ex_wrong_1f1b_*.py /
ex_wrong_zbh1_*.py is judged in-process first; six launches then grade through the
real path (minipar.launch, the worker, the MPI pipeline executor on the ranks).
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest
from conftest import MPI_DIR, failed

from minipar.exercises import get
from minipar.exercises.gpipe_schedule import grader as common
from minipar.exercises.grading import check


def learner(path: Path):
    spec = importlib.util.spec_from_file_location(f"_learner_{path.stem}", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.schedule


KINDS = [("gpipe_schedule", "gpipe"), ("one_f_one_b", "1f1b"), ("zb_h1_schedule", "zb-h1"),
         ("dualpipev_schedule", "dualpipev")]


@pytest.mark.parametrize("name, kind", KINDS)
def test_reference_schedules_pass_every_rule_up_to_six_stages(name, kind):
    fn = learner(get(name).solution_path)
    for p in range(1, 7):
        assert common.findings(kind, fn, p) == {}, (name, p)
    assert not common.copied(fn)


def test_each_schedule_fails_the_others_rule():
    gpipe, one_f = (learner(get(n).solution_path) for n in ("gpipe_schedule", "one_f_one_b"))
    said = common.findings("1f1b", gpipe, 4)
    assert set(said) == {"rule"} and "stage 0 holds 8 micro-batches at once" in said["rule"]
    said = common.findings("gpipe", one_f, 4)
    assert set(said) == {"rule"} and "a Backward runs before all 8 Forwards" in said["rule"]
    said = common.findings("zb-h1", gpipe, 4)  # m in flight, and no B/W split
    assert set(said) == {"rule", "bubble"} and "between their F and their B" in said["rule"]
    said = common.findings("zb-h1", one_f, 4)  # 1F1B's memory, its backward whole
    assert set(said) == {"bubble"} and "every backward runs whole" in said["bubble"]


def test_zb_h1_reference_reaches_table_2_and_holds_p_from_f_to_w():
    """Qi et al. 2023, Table 2 on the simulator, exactly (T_F = T_B = T_W = 1): the bubble is
    (p - 1)(T_F + T_B - T_W) for m >= p; each stage lets s W's wait, so every stage holds
    at most p micro-batches from F to W (p - s to B, s more to W), 1F1B's peak."""
    from minipar.parallel.pipeline.measure import bubble_time
    from minipar.parallel.pipeline.stage_loop import BackwardWeight, Forward
    from minipar.parallel.pipeline.simulate import replay, split_cost
    from minipar.plan.pipeline import zero_bubble_formula

    fn = learner(get("zb_h1_schedule").solution_path)
    for p in range(1, 7):
        for m in range(1, 13):
            lists = [fn(s, p, m) for s in range(p)]
            if m >= p:
                assert bubble_time(replay(lists, split_cost(1, 1, 1))) == \
                    zero_bubble_formula("zb-h1", p, m)["bubble"] == p - 1, (p, m)
            for s, ins in enumerate(lists):
                held = peak = 0
                for x in ins:
                    held += isinstance(x, Forward) - isinstance(x, BackwardWeight)
                    peak = max(peak, held)
                assert peak == min(p, m), (p, m, s, peak)


def test_zb_h1_w_pileup_reaches_table_2_but_fails_the_memory_rule():
    """The W's piled up after the last F (minipar's own zb-h1 before d8a443b) fill the
    cool-down as well as ZB-H1's late W's do, so only the F-to-W count tells them apart."""
    from minipar.parallel.pipeline.measure import bubble_time
    from minipar.parallel.pipeline.measure import in_flight
    from minipar.parallel.pipeline.simulate import replay, split_cost

    fn = learner(MPI_DIR / "ex_wrong_zbh1_w_pileup.py")
    for p in range(2, 5):
        lists = [fn(s, p, 8) for s in range(p)]
        assert bubble_time(replay(lists, split_cost(1, 1, 1))) == p - 1  # Table 2
        assert [in_flight(ins, until="W") for ins in lists] == [8] * p
        assert common.bubble("zb-h1", lists, p, 8) is None
    ref = learner(get("zb_h1_schedule").solution_path)
    assert [in_flight(ref(s, 4, 8), until="W") for s in range(4)] == [4] * 4


def test_cases_name_the_schedule_they_grade():
    for name, kind in KINDS:
        cases = get(name).grader().cases(3)
        assert {c["kind"] for c in cases} == {kind}
        assert [c["p"] for c in cases if c["what"] == "rules"] == [1, 2, 3, 4]
        assert {c["p"] for c in cases if c["what"] == "run"} == {3}
    assert [c["m"] for c in get("one_f_one_b").grader().cases(4) if c["what"] == "run"] == \
        [1, 3, 9]  # fewer micro-batches than stages too


WRONG = [
    # file, kind, the finding (key), words in it
    ("ex_wrong_gpipe_no_recv_grad.py", "gpipe", "check", "RecvGrad(mb=0, chunk=0) appears 0 times"),
    ("ex_wrong_gpipe_deadlock.py", "gpipe", "check", "cycle of waiting stages: 0 -> 1 -> 0"),
    ("ex_wrong_gpipe_backward_order.py", "gpipe", "bubble", "the formula 3/11"),
    ("ex_wrong_gpipe_one_by_one.py", "gpipe", "rule", "a Backward runs before all 8 Forwards"),
    ("ex_wrong_1f1b_gpipe.py", "1f1b", "rule", "holds 8 micro-batches at once; 1F1B holds at most"),
    ("ex_wrong_1f1b_extra_warmup.py", "1f1b", "rule", "holds 5 micro-batches at once"),
    ("ex_wrong_1f1b_no_warmup.py", "1f1b", "bubble", "the formula 3/8"),
    ("ex_wrong_1f1b_backward_first.py", "1f1b", "check",
     "Backward(mb=0, chunk=0) at position 4 comes before RecvGrad(mb=0, chunk=0)"),
    ("ex_wrong_zbh1_deadlock.py", "zb-h1", "check",
     "p=2, m=2: deadlock: stage 0 waits at RecvGrad(mb=0, chunk=0) for stage 1; stage 1 waits "
     "at RecvAct(mb=1, chunk=0) for stage 0 (cycle of waiting stages: 0 -> 1 -> 0)\nEach stage "
     "in the cycle waits for a message its neighbour sends only later"),
    ("ex_wrong_zbh1_w_before_b.py", "zb-h1", "check",
     "stage 1: BackwardWeight(mb=0, chunk=0) at position 0 comes before BackwardInput(mb=0, "
     "chunk=0) at position 3\nA W reads what its own B kept"),
    ("ex_wrong_zbh1_1f1b.py", "zb-h1", "bubble",
     "p=4, m=8: on the simulator (T_F = T_B = T_W = 1) the bubble is 9 time units, ZB-H1's "
     "(p - 1)(F + B - W) = 3: your bubble is 1F1B's (p - 1)(F + B + W) = 9: move the W's into "
     "the cool-down / warm-up idle time"),
    ("ex_wrong_zbh1_w_in_steady.py", "zb-h1", "bubble",
     "the bubble is 6 time units, ZB-H1's (p - 1)(F + B - W) = 3: (p - 1)(F + B) = 6"),
    ("ex_wrong_zbh1_w_pileup.py", "zb-h1", "rule",  # Table 2's bubble, the memory of m
     "p=4, m=8: stage 0 holds 8 micro-batches between F and W (their inputs and output "
     "gradients kept for W); ZB-H1 holds at most p = 4, as 1F1B: run each W soon after its B, "
     "s B's late on stage s"),
    # DeepSeek-V3's DualPipe-V (two chunks in a V, m >= 2p)
    ("ex_wrong_dpv_no_pairs.py", "dualpipev", "rule",
     "p=4, m=14: rank 0 runs 0 overlapped pairs, DeepSeek's DualPipe-V 17: in the steady state"),
    ("ex_wrong_dpv_same_mb_pair.py", "dualpipev", "check",
     "ForwardBackward(forward=Forward(mb=3, chunk=0), backward=Backward(mb=3, chunk=1)) "
     "(position 13): the backward of micro-batch 3 needs its loss, which needs this very "
     "forward"),
    ("ex_wrong_dpv_w_before_b.py", "dualpipev", "check",
     "stage 0: BackwardWeight(mb=0, chunk=1) at position 8 comes before BackwardInput(mb=0, "
     "chunk=1) at position 9"),
    ("ex_wrong_dpv_backward_chunks.py", "dualpipev", "check",
     "(cycle of waiting stages: 1 -> 1)\nA rank that waits for itself ran a chunk out of turn"),
    ("ex_wrong_dpv_no_warmup.py", "dualpipev", "check",
     "deadlock: stage 0 waits at RecvAct(mb=0, chunk=1) for stage 1; stage 1 waits at "
     "RecvAct(mb=0, chunk=0) for stage 0 (cycle of waiting stages: 0 -> 1 -> 0)\nA pair "
     "receives both its inputs before it starts"),
    ("ex_wrong_dpv_whole_backwards.py", "dualpipev", "bubble",
     "rank 0 idles 14 time units; DualPipe-V's table gives (PP/2 - 1)(F&B + B - 3W) = 6 "
     "(PP = 2p = 8): no backward is split"),
]


@pytest.mark.parametrize("file, kind, key, words", WRONG, ids=[w[0] for w in WRONG])
def test_wrong_schedules_are_named(file, kind, key, words):
    fn = learner(MPI_DIR / file)
    said = {}
    for p in ((2, 3, 4) if key == "check" else (4, 3, 2)):  # as the judge reads them
        for k, v in common.findings(kind, fn, p).items():
            said.setdefault(k, v)
    assert key in said, (file, said)
    assert words in said[key], said[key]
    if file.startswith(("ex_wrong_zbh1_", "ex_wrong_dpv_")):
        assert set(said) == {key}, said  # one named reason, nothing else


def test_calling_the_packages_schedule_is_not_writing_it():
    fn = learner(MPI_DIR / "ex_wrong_1f1b_copied.py")
    assert common.copied(fn)
    assert common.findings("1f1b", fn, 4) == {}  # the list itself is right


# -- through the real path: launch, worker, the MPI executor --------------------------------------
@pytest.mark.parametrize("name, n", [("gpipe_schedule", 3), ("one_f_one_b", 4),
                                     ("zb_h1_schedule", 3), ("dualpipev_schedule", 2)])
def test_reference_solution_passes_on_real_ranks(name, n):
    report = check(name, get(name).solution_path, n, timeout=120)
    assert report.passed, report.text()
    assert all(c.ok for c in report.checks)  # nothing left ungraded
    assert "MPI executor" in report.checks[-1].name


def test_a_deadlocking_gpipe_is_named_and_not_run():
    report = check("gpipe_schedule", MPI_DIR / "ex_wrong_gpipe_deadlock.py", 2, timeout=120)
    assert not report.passed
    (bad,) = failed(report)
    assert bad.name.startswith("a correct schedule") and "deadlock" in bad.detail
    ungraded = [c for c in report.checks if c.ok is None]
    assert len(ungraded) == 3 and ungraded[-1].detail.startswith("not run on the ranks")


def test_a_copied_1f1b_fails_written_by_you_on_real_ranks():
    report = check("one_f_one_b", MPI_DIR / "ex_wrong_1f1b_copied.py", 2, timeout=120)
    (bad,) = failed(report)
    assert bad.name.startswith("written by you") and "write the list yourself" in bad.detail


def test_zb_h1_with_1f1b_bubble_runs_right_on_real_ranks_and_fails_the_bubble():
    """Correct and equal to the serial run on the ranks, but no faster than 1F1B: named."""
    report = check("zb_h1_schedule", MPI_DIR / "ex_wrong_zbh1_1f1b.py", 2, timeout=120)
    (bad,) = failed(report)
    assert bad.name.startswith("bubble on the simulator (T_F = T_B = T_W = 1")
    assert "your bubble is 1F1B's (p - 1)(F + B + W) = 9" in bad.detail
    assert bad.case == "p = 4 stages, m = 1..8 (checker and simulator)"
    assert report.checks[-1].ok and "MPI executor" in report.checks[-1].name


def test_a_list_of_something_else_is_named():
    said = common.findings("gpipe", lambda s, p, m: None, 2)
    assert said == {"check": "p=2, m=1: schedule(0, 2, 1) returned NoneType, not a list of "
                             "instructions"}
    said = common.findings("gpipe", lambda s, p, m: ["F0", "B0"], 2)
    assert "'F0' at position 0 is not a pipeline instruction" in said["check"]


def test_dualpipev_reference_is_deepseeks_schedule_and_its_table():
    """The reference is minipar's own dualpipev, rank by rank, for p = 1..6 and m from 2p;
    each rank idles at most the table's (PP/2 - 1)(F&B + B - 3W) = 2(p - 1) (F 1, B 2, W 1)."""
    from minipar.cli.bubble import idle_per_rank
    from minipar.parallel.pipeline.schedule import stage_schedule
    from minipar.parallel.pipeline.simulate import replay, split_cost

    fn = learner(get("dualpipev_schedule").solution_path)
    for p in range(1, 7):
        for m in (2 * p, 2 * p + 1, 3 * p + 2):
            lists = [fn(s, p, m) for s in range(p)]
            assert lists == [stage_schedule("dualpipev", s, p, m, 2) for s in range(p)]
            idle = idle_per_rank(replay(lists, split_cost(1, 1, 1), placement="v"))
            assert max(idle) == 2 * (p - 1), (p, m, idle)
