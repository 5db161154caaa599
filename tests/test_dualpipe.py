"""DeepSeek-V3's DualPipe and DualPipe-V (arXiv 2412.19437, §3.2.1) as data, without MPI.

The schedules pass the checker (every F, B, W once, messages matched, no deadlock with the
executor's non-blocking sends), hold the DualPipe table's PP + 1 micro-batches of
activations, contain the overlapped pairs, and their simulated idle time is the table's
bubble (PP/2 − 1)(F&B + B − 3W) — the formula written here, independently of the
scheduler — wherever ``minipar bubble --json`` says it holds.  ``minipar run pp`` refuses
bad input in one line before MPI starts.  The real runs (parity with the serial run, dp 2,
MoE, remat, offload, resume across schedules) are in tests/mpi/pp_check.py, with TP in
tests/mpi/hybrid_check.py.
"""

from __future__ import annotations

import json
from fractions import Fraction
from pathlib import Path

import pytest
from conftest import refused_before_mpi

from minipar.parallel.pipeline import dualpipe
from minipar.parallel.pipeline.check import check_schedules, problems
from minipar.parallel.pipeline.measure import chart, in_flight
from minipar.parallel.pipeline.schedule import placement, schedules, stage_schedule
from minipar.parallel.pipeline.simulate import replay, split_cost
from minipar.parallel.pipeline.stage_loop import Backward, Forward, ForwardBackward

CASES = [("dualpipe", p, m) for p, ms in ((2, (4, 6)), (4, (8, 10, 12)), (6, (12, 14)),
                                            (8, (16, 20))) for m in ms] + \
    [("dualpipev", p, m) for p, ms in ((1, (2, 3)), (2, (4, 5, 8)), (3, (6, 7)),
                                        (4, (8, 9, 12))) for m in ms]


def bubble_json(*args: str, capsys: pytest.CaptureFixture[str]) -> dict:
    from minipar.cli import bubble

    assert bubble.main([*args, "--json"]) == 0
    return json.loads(capsys.readouterr().out)


@pytest.mark.parametrize("kind,p,m", CASES)
def test_the_schedule_is_correct_holds_pp_plus_1_and_overlaps(kind: str, p: int,
                                                               m: int) -> None:
    scheds = schedules(kind, p, m, 2)
    check_schedules(scheds, placement=placement(kind))
    pp = p if kind == "dualpipe" else 2 * p
    assert max(in_flight(s) for s in scheds) == pp + 1 or p == 1
    pairs = [[i for i in s if isinstance(i, ForwardBackward)] for s in scheds]
    assert all(pairs), "every rank runs overlapped pairs (step 4)"
    for s in pairs:
        for pair in s:  # a forward of one micro-batch with the whole backward of another
            assert type(pair.forward) is Forward and type(pair.backward) is Backward
            assert (pair.forward.mb, pair.forward.chunk) != (pair.backward.mb,
                                                             pair.backward.chunk)


@pytest.mark.parametrize("kind,p,m", [("dualpipe", 2, 4), ("dualpipe", 4, 10),
                                      ("dualpipe", 6, 14), ("dualpipe", 8, 16),
                                      ("dualpipev", 2, 5), ("dualpipev", 3, 6),
                                      ("dualpipev", 4, 9)])
@pytest.mark.parametrize("costs", [(1, 2, 1, None), (2, 3, 1, None), (3, 5, 2, None),
                                   (1, 2, 1, 2), (2, 2, 1, Fraction(5, 2))])
def test_the_idle_is_the_tables_bubble_wherever_it_holds(kind: str, p: int, m: int, costs,
                                                         capsys) -> None:
    f, b, w, fb = costs
    text = ",".join(str(x) for x in costs if x is not None)
    s = bubble_json("--schedule", kind, "--stages", str(p), "--micro-batches", str(m),
                    "--costs", text, capsys=capsys)
    pp = p if kind == "dualpipe" else 2 * p          # the table's PP: the model's stages
    fb_ = f + b if fb is None else fb                # F&B: one core, F then B
    table = (Fraction(pp, 2) - 1) * (fb_ + b - 3 * w)
    assert s["formula_value"] == float(table)
    assert s["in_flight_formula"] == pp + 1 and s["params_stages"] == 2
    assert s["formula_holds"] == (f == b - w and fb_ == f + b)
    if s["formula_holds"]:
        assert max(s["idle_per_rank"]) == float(table), s["idle_per_rank"]
    assert s["formula_gap"] == max(s["idle_per_rank"]) - float(table)


def test_the_rank_pairs_of_dualpipe_mirror_each_other() -> None:
    """Rank s and rank p − 1 − s run the same steps with the directions swapped."""
    p, m = 6, 12
    for s in range(p):
        mine = dualpipe.dualpipe_order("dualpipe", s, p, m)
        other = dualpipe.dualpipe_order("dualpipe", p - 1 - s, p, m)

        def swap(i):
            if isinstance(i, ForwardBackward):
                return ForwardBackward(swap(i.forward), swap(i.backward))
            return type(i)(i.mb, 1 - i.chunk)
        assert [swap(i) for i in mine] == other


def test_dualpipe_v_is_dualpipe_folded() -> None:
    """DualPipe-V on p ranks runs on rank s what DualPipe on 2p ranks runs on rank s
    (phases as chunks: DeepSeek's ``dualpipev.py`` is ``dualpipe.py`` cut in half)."""
    for p, m in ((2, 4), (3, 6), (4, 8)):
        for s in range(p):
            assert dualpipe.dualpipe_order("dualpipev", s, p, m) == \
                dualpipe.dualpipe_order("dualpipe", s, 2 * p, 2 * m)


def test_the_drawing_in_the_docstring_is_the_simulators() -> None:
    tl = replay(schedules("dualpipe", 4, 8, 2), split_cost(1, 1, 1), placement="dual")
    drawn = "\n".join(ln.strip() for ln in chart(tl).splitlines())
    doc = "\n".join(ln.strip() for ln in dualpipe.__doc__.splitlines())
    assert drawn in doc


def test_the_checker_names_a_wrong_pair() -> None:
    scheds = schedules("dualpipe", 2, 4, 2)
    bad = [list(s) for s in scheds]
    i = next(k for k, x in enumerate(bad[0]) if isinstance(x, ForwardBackward))
    bad[0][i] = ForwardBackward(bad[0][i].forward, bad[0][i].forward)
    assert any("must pair a Forward with a Backward" in x for x in problems(bad,
                                                                         placement="dual"))


@pytest.mark.parametrize("args,words", [
    (("dualpipe", 3, 6, 2), "needs p and m even"),
    (("dualpipe", 4, 7, 2), "needs p and m even"),
    (("dualpipe", 4, 6, 2), "m >= 2p = 8"),
    (("dualpipe", 4, 8, 3), "exactly 2 model chunks"),
    (("dualpipev", 2, 3, 2), "m >= 2p = 4"),
])
def test_the_schedules_own_rules(args: tuple, words: str) -> None:
    kind, p, m, v = args
    with pytest.raises(ValueError, match=words):
        stage_schedule(kind, 0, p, m, v)


BAD_RUN = [
    (["-n", "3", "--schedule", "dualpipe"], "needs an even number of stages"),
    (["-n", "4", "--schedule", "dualpipe", "--micro-batches", "9"], "even --micro-batches"),
    (["-n", "4", "--schedule", "dualpipe", "--micro-batches", "6"], ">= 2 x stages"),
    (["-n", "4", "--schedule", "dualpipe", "--chunks", "3"], "not interleaved"),
    (["-n", "2", "--schedule", "dualpipev", "--micro-batches", "3"], "PP = 2 x 2 ranks = 4"),
    (["-n", "4", "--schedule", "dualpipev"], "use --layers >= 8"),
]


@pytest.mark.parametrize("args,words", BAD_RUN, ids=[" ".join(a) for a, _ in BAD_RUN])
def test_run_pp_bad_option_is_one_line_exit_2(args: list[str], words: str,
                                              capsys: pytest.CaptureFixture[str]) -> None:
    from minipar import run

    with pytest.raises(SystemExit) as e:
        run.options.parse(["pp", *args])
    assert e.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("minipar run: ") and words in err[0], err


def test_run_pp_refuses_dualpipe_before_mpi_starts(tmp_path: Path) -> None:
    proc = refused_before_mpi(["run", "pp", "-n", "3", "--schedule", "dualpipe"], tmp_path)
    assert "dualpipe" in proc.stderr


def test_bubble_bad_costs_is_one_line(capsys: pytest.CaptureFixture[str]) -> None:
    from minipar.cli import bubble

    for costs in ("1,2", "1,2,3", "0,2,1", "a,b,c", "1,2,1,0"):
        assert bubble.main(["--schedule", "dualpipe", "--costs", costs]) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and "--costs" in err[0], err


def test_bubble_from_a_recorded_dualpipe_step(tmp_path: Path,
                                              capsys: pytest.CaptureFixture[str]) -> None:
    """``minipar bubble --from-run``: a recorded dualpipe step (here a replay in seconds, as
    the executor records it: each pair as its forward's and its backward's records) is
    rebuilt, and the table is set against it with the step's own median costs."""
    from minipar.parallel.pipeline.measure import write_timeline

    recs = replay(schedules("dualpipe", 4, 8, 2), split_cost(0.001, 0.001, 0.001),
                  placement="dual")
    write_timeline(tmp_path / "t.json", recs, "dualpipe", 4, 8, 2)
    s = bubble_json("--from-run", str(tmp_path / "t.json"), capsys=capsys)
    assert s["source"] == "run" and s["schedule"] == "dualpipe" and s["pp"] == 4
    assert s["costs"]["F"] == pytest.approx(0.001) and s["costs"]["B"] == pytest.approx(0.002)
    assert max(s["idle_per_rank"]) == pytest.approx(s["formula_value"]) == pytest.approx(0.002)


def test_run_pp_prints_the_figure_of_its_own_schedule():
    """``run pp``'s p2p figure is counted from the schedule: DualPipe sends 2·m on a middle
    rank (each micro-batch runs one of its two chunks), not the 1F1B paper's 2·m·v = 4·m;
    DualPipe-V and ZB-V 4·m (the turn at rank p − 1 is a hand-off in memory); 1F1B 2·m and
    interleaved 2·m·v, the plan's figure."""
    from minipar.plan.pipeline import pipeline_p2p_bytes_per_rank
    from minipar.run.pp import schedule_sends

    p, m = 4, 8
    assert schedule_sends("dualpipe", p, m, 2) == [m, 2 * m, 2 * m, m]
    assert schedule_sends("dualpipev", p, m, 2) == [2 * m, 4 * m, 4 * m, 2 * m]
    assert schedule_sends("zb-v", p, m, 2) == [2 * m, 4 * m, 4 * m, 2 * m]
    for kind, v in (("1f1b", 1), ("interleaved", 2)):
        assert max(schedule_sends(kind, p, m, v)) == pipeline_p2p_bytes_per_rank(1, 1, 1, m, v, 1)
