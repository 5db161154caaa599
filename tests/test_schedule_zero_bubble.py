"""Zero-bubble schedules as data (Qi et al. 2023, arXiv 2401.10241), without MPI.

What the tests reproduce: the checker passes ZB-H1, ZB-H2 and ZB-V for every
p = 1..8, m = 1..32 (each F, B and W once, W after its B, every message matched,
no deadlock); on the simulated dedicated machine with T_F = T_B = T_W and free
messages the bubble (longest per-stage span − m(T_F + T_B + T_W)) is EXACTLY the
paper's Table 2; the micro-batches in flight are the paper's; a wrong split
schedule is named.
"""

from __future__ import annotations

import importlib
import re
from fractions import Fraction

import pytest

from minipar.parallel.pipeline.check import check_schedules, problems
from minipar.parallel.pipeline.measure import (
    bubble_fraction,
    bubble_time,
    bubble_time_ratio,
    chart,
    in_flight,
    iteration_time,
    synced_bubble_fraction,
    w_pending,
)
from minipar.parallel.pipeline.schedule import (
    forward_schedule,
    placement,
    schedules,
    stage_schedule,
)
from minipar.parallel.pipeline.simulate import Record, replay, split_cost, uniform_cost
from minipar.parallel.pipeline.stage_loop import (
    Backward,
    BackwardInput,
    BackwardWeight,
    Forward,
    OptimizerStep,
    RecvGrad,
    SendGrad,
    rank_of,
    virtual_stage,
)
from minipar.parallel.pipeline.zero_bubble import ZERO_BUBBLE, zero_bubble_cap
from minipar.plan.pipeline import bubble_formula, zero_bubble_formula, zero_bubble_holds

P, M = range(1, 9), range(1, 33)


def _v(kind: str) -> int:
    return 2 if kind == "zb-v" else 1


def _equal(kind: str):
    """T_F = T_B = T_W = 1 per stage (ZB-V: 1 per chunk-op, a stage's cost 2, so times
    stay integers); returns (cost, one stage's T)."""
    return (split_cost(2, 2, 2, v=2), 2) if kind == "zb-v" else (split_cost(1, 1, 1), 1)


@pytest.mark.parametrize("kind", ZERO_BUBBLE)
def test_every_zero_bubble_schedule_passes_the_checker(kind: str) -> None:
    """p = 1..8, m = 1..32: the checker (every dependency, matched messages, a replay that
    does not stick) finds nothing; each (micro-batch, chunk) has one F, one B, one W, no
    whole Backward, and its W comes after its B."""
    v = _v(kind)
    for p in P:
        for m in M:
            scheds = schedules(kind, p, m, v)
            assert problems(scheds, placement=placement(kind)) == [], (kind, p, m)
            want = [(i, c) for i in range(m) for c in range(v)]
            for ins in scheds:
                for op in (Forward, BackwardInput, BackwardWeight):
                    assert sorted((x.mb, x.chunk) for x in ins if isinstance(x, op)) == want
                assert not any(isinstance(x, Backward) for x in ins)
                where = {(type(x), x.mb, x.chunk): i for i, x in enumerate(ins)
                         if not isinstance(x, OptimizerStep)}
                assert all(where[BackwardInput, i, c] < where[BackwardWeight, i, c]
                           for i, c in want)
                assert ins[-1] == OptimizerStep() and ins.count(OptimizerStep()) == 1


@pytest.mark.parametrize("kind", ("1f1b", *ZERO_BUBBLE))
def test_the_simulator_gives_the_papers_table_2_exactly(kind: str) -> None:
    """Equal costs, free messages: 1F1B (p − 1)(T_F + T_B + T_W), ZB-H1 (p − 1)(T_F + T_B
    − T_W) for m >= p, ZB-H2 max(0, (p − 1)(T_F + T_B − 2T_W)) and ZB-V 0 for m >= 2p − 1,
    as exact integers; the fraction and ratio equal plan.pipeline's formula."""
    v = _v(kind)
    cost, T = _equal(kind)
    for p in P:
        for m in M:
            if not zero_bubble_holds(kind, p, m):
                continue
            tl = replay(schedules(kind, p, m, v), cost, placement=placement(kind))
            want = {"1f1b": 3 * (p - 1), "zb-h1": p - 1, "zb-h2": 0, "zb-v": 0}[kind]
            assert bubble_time(tl) == want * T, (kind, p, m)
            f = zero_bubble_formula(kind, p, m)
            assert f["bubble"] == want
            assert bubble_fraction(tl) == f["fraction"] and bubble_time_ratio(tl) == f["ratio"]
            assert bubble_formula(kind, p, m, v)["fraction"] == f["fraction"] or kind == "1f1b"
            assert iteration_time(tl) == (3 * m + want) * T


def test_below_the_papers_m_the_simulators_bubble_is_larger() -> None:
    """m < p (ZB-H1) or m < 2p − 1 (ZB-H2, ZB-V): not enough micro-batches to fill; the
    simulator's value, stated here for p = 4."""
    got = {}
    for kind in ZERO_BUBBLE:
        cost, T = _equal(kind)
        got[kind] = [bubble_time(replay(schedules(kind, 4, m, _v(kind)), cost,
                                        placement=placement(kind))) / T for m in (1, 2, 3)]
    assert got == {"zb-h1": [6, 5, 4], "zb-h2": [6, 5, 4],
                   "zb-v": [Fraction(11, 2), Fraction(7, 2), 2]}, got


def test_unequal_costs_zb_h1_and_zb_h2_still_follow_table_2() -> None:
    """T_F, T_B, T_W apart (each W no dearer than F and B): the same orders, replayed, give
    the paper's expressions exactly (the schedules are fixed data, not re-planned)."""
    for f, b, w in ((2, 2, 1), (2, 3, 2), (1, 2, 1), (3, 4, 2)):
        for kind in ("1f1b", "zb-h1", "zb-h2"):
            for p, m in ((2, 4), (2, 8), (4, 8), (4, 16)):
                tl = replay(schedules(kind, p, m), split_cost(f, b, w))
                assert bubble_time(tl) == zero_bubble_formula(kind, p, m, f, b, w)["bubble"]


def test_gpipe_1f1b_interleaved_bubbles_are_unchanged_by_the_span_measure() -> None:
    """Stage 0 spans their whole step, so the longest-span bubble is the makespan one."""
    for kind, v in (("gpipe", 1), ("1f1b", 1), ("interleaved", 2)):
        tl = replay(schedules(kind, 4, 8, v), uniform_cost(1, 2, v=v))
        assert bubble_fraction(tl) == synced_bubble_fraction(tl) == \
            bubble_formula(kind, 4, 8, v)["fraction"]


def test_a_synchronisation_before_the_step_brings_a_bubble_back() -> None:
    """ZB-H2, p = 4, m = 8: zero bubble per stage, but stage 3 ends 3 units after stage 0;
    waiting for every stage (a global gradient norm) costs P·3 of P·27: 1/9."""
    tl = replay(schedules("zb-h2", 4, 8), split_cost(1, 1, 1))
    assert bubble_fraction(tl) == 0 and synced_bubble_fraction(tl) == Fraction(1, 9)


@pytest.mark.parametrize("p", P)
def test_in_flight_is_the_papers(p: int) -> None:
    """Micro-batches between F and B on stage s: ZB-H1 p − s (1F1B's, p on stage 0 for
    m >= p); ZB-H2 2(p − s) − 1 (2p − 1 for m >= 2p − 1); ZB-V 2p chunk-activations on
    every rank (p micro-batches of a whole stage).  Between B and W (kept only for W):
    never more than the cap + 2p."""
    for m in (p, 2 * p - 1, 2 * p + 3, 32):
        for s in range(p):
            h1 = in_flight(stage_schedule("zb-h1", s, p, m))
            assert h1 == min(p - s, m), (p, m, s)
            if m >= 2 * p - 1:
                assert in_flight(stage_schedule("zb-h2", s, p, m)) == 2 * (p - s) - 1
                assert in_flight(stage_schedule("zb-v", s, p, m, 2)) == 2 * p
            for kind in ZERO_BUBBLE:
                ins = stage_schedule(kind, s, p, m, _v(kind))
                assert w_pending(ins) <= zero_bubble_cap(kind, s, p) + 2 * p
                assert w_pending(ins) >= 1


@pytest.mark.parametrize("p", P)
def test_zb_h1_holds_1f1bs_peak_from_f_to_w(p: int) -> None:
    """ZB-H1 (Qi et al. 2023, Fig. 3 top) keeps 1F1B's peak memory: stage s runs each W s
    B's late, so it holds p − s micro-batches to B and s more to W, min(p, m) from F to W on
    every stage — not the W's of every micro-batch piled up after the last F."""
    for m in M:
        for s in range(p):
            ins = stage_schedule("zb-h1", s, p, m)
            peak = in_flight(ins, until="W")
            assert peak == min(p, m), (p, m, s, peak)
            assert w_pending(ins) == min(s + 1, m), (p, m, s)  # counted right after a B


@pytest.mark.parametrize("p", P)
def test_zb_h2_holds_2p_minus_1_from_f_to_w(p: int) -> None:
    """ZB-H2 (Qi et al. 2023, Fig. 3 bottom, §3.2) holds 2p − 1 micro-batches on every
    stage from F to W: 2(p − s) − 1 to B, then one W before each later F — not the W's of
    every micro-batch piled up after the last F (the list scheduler's shape, m on every
    stage).  Below m = 2p − 1 no stage can hold more than m."""
    for m in M:
        for s in range(p):
            ins = stage_schedule("zb-h2", s, p, m)
            peak = in_flight(ins, until="W")
            if m >= 2 * p - 1:
                assert peak == 2 * p - 1, (p, m, s, peak)
                assert w_pending(ins) == 2 * s + 1, (p, m, s)  # counted right after a B
            else:
                assert peak <= m, (p, m, s, peak)


def test_zb_v_is_a_v() -> None:
    """Rank 0 holds virtual stages 0 and 2p − 1 (the loss), rank p − 1 stages p − 1 and p
    (it hands chunk 0's output to its own chunk 1); rank_of inverts virtual_stage."""
    p = 4
    assert [virtual_stage(s, 1, p, "v") for s in range(p)] == [7, 6, 5, 4]
    assert [rank_of(vs, p, "v") for vs in range(2 * p)] == [0, 1, 2, 3, 3, 2, 1, 0]
    assert [rank_of(vs, p) for vs in range(2 * p)] == [0, 1, 2, 3, 0, 1, 2, 3]
    first = schedules("zb-v", p, 8, 2)[0]
    assert not any(isinstance(x, (RecvGrad,)) and x.chunk == 1 for x in first)  # the loss
    assert not any(isinstance(x, SendGrad) and x.chunk == 0 for x in first)  # the embedding
    fw = [forward_schedule(s, p, 8, 2, "v") for s in range(p)]
    assert problems([f + [OptimizerStep()] for f in fw], placement="v") != []  # no B: named
    replay(fw, split_cost(2, 2, 2, v=2), placement="v")  # but it runs, without deadlock


def test_docstring_drawings_are_the_simulators() -> None:
    doc = importlib.import_module("minipar.parallel.pipeline.zero_bubble").__doc__
    for kind in ("1f1b", *ZERO_BUBBLE):
        cost, _ = _equal(kind)
        drawn = chart(replay(schedules(kind, 3, 6, _v(kind)), cost, placement=placement(kind)))
        pad = f"    {kind:<9}"
        lines = drawn.splitlines()
        block = "\n".join([pad + lines[0]] + [" " * len(pad) + x for x in lines[1:]])
        assert block in doc, kind


def _split(p: int = 2, m: int = 2) -> list[list]:
    return [list(s) for s in schedules("zb-h1", p, m)]


def _drop(sched: list, what: object) -> None:
    sched.remove(what)


def _w_first(sched: list) -> None:
    i, j = sched.index(BackwardInput(0)), sched.index(BackwardWeight(0))
    sched[i], sched[j] = sched[j], sched[i]


def _both(sched: list) -> None:
    sched.insert(-1, Backward(1))


@pytest.mark.parametrize(("edit", "needle"), [
    (lambda s: _drop(s[1], BackwardWeight(0)),
     "stage 1: BackwardWeight(mb=0, chunk=0) appears 0 times"),
    (lambda s: _w_first(s[0]), "stage 0: BackwardWeight(mb=0, chunk=0) at position"),
    (lambda s: _both(s[0]), "stage 0: Backward(mb=1, chunk=0) and a split B/W"),
    (lambda s: s[0].insert(0, s[0].pop(s[0].index(BackwardInput(0)))),
     "stage 0: BackwardInput(mb=0, chunk=0) at position 0 comes before Forward(mb=0, chunk=0)"),
])
def test_a_wrong_split_schedule_is_named(edit, needle: str) -> None:
    scheds = _split()
    edit(scheds)
    with pytest.raises(ValueError, match=re.escape(needle)):
        check_schedules(scheds)


def test_a_w_that_waits_for_nothing_cannot_deadlock_but_a_b_can() -> None:
    """Stage 1's B of micro-batch 0 moved before its own forward's input arrives: the
    checker's replay sticks and names the cycle."""
    scheds = _split()
    s1 = scheds[1]
    b = s1.index(BackwardInput(0))
    s1.insert(b - 1, s1.pop(s1.index(BackwardInput(1))))  # B1 before B0's slot
    found = problems(scheds)
    assert found, found


@pytest.mark.parametrize(("args", "needle"), [
    (("zb-v", 0, 2, 4, 1), "zb-v holds exactly 2 model chunks per rank"),
    (("zb-h1", 0, 2, 4, 2), "v=2 model chunks per rank needs the 'interleaved' schedule"),
])
def test_bad_input_is_one_clear_error(args: tuple, needle: str) -> None:
    with pytest.raises(ValueError, match=re.escape(needle)):
        stage_schedule(*args)


def test_a_short_instruction_still_shows_as_one_character() -> None:
    """Issue-25 fix: the wall-clock chart of ``minipar bubble --from-run`` (cells of
    end/60) drew nothing for an instruction shorter than a cell."""
    from minipar.cli.bubble import _chart

    recs = [Record(0, "forward", 0, 0, 0.0, 1.0), Record(0, "backward_weight", 0, 0, 1.0, 1.001),
            Record(0, "backward_input", 1, 0, 1.001, 3.0), Record(1, "forward", 1, 0, 3.0, 6.0)]
    drawn = _chart(recs)
    assert "W0" in drawn and "B1" in drawn and "F1" in drawn


def test_minipar_bubble_draws_b_and_w_and_gives_the_json(capsys, tmp_path) -> None:
    """``minipar bubble --schedule zb-h1|zb-h2|zb-v``: the chart with B and W, the paper's
    formula, ``--json`` with ``bubble_fraction`` and ``in_flight_max``; ``-o`` draws the
    schedule beside 1F1B; a wrong ``--chunks`` is one line, exit 2."""
    import json

    from minipar import cli

    assert cli.main(["bubble", "--schedule", "zb-h1", "--stages", "3", "--micro-batches", "6"]) == 0
    out = capsys.readouterr().out
    assert "B0W0F3B1W1F4B2W2F5B3W3B4W4B5W5" in out and "Qi et al. 2023, Table 2" in out
    assert "gradients kept), peak per stage: 1 2 3" in out  # each W s B's late on stage s
    assert "= 1/10 = 10.0% of the step" in out
    for kind, fl, frac in (("zb-h1", 4, 3 / 27), ("zb-h2", 7, 0.0), ("zb-v", 8, 0.0)):
        assert cli.main(["bubble", "--schedule", kind, "--json"]) == 0
        s = json.loads(capsys.readouterr().out)
        assert s["in_flight_max"] == fl and s["bubble_fraction"] == pytest.approx(frac), kind
        assert s["bubble_fraction_synced"] >= s["bubble_fraction"] and s["formula_holds"]
    # below m >= 2p - 1 Table 2 is not set against the simulator's bubble: it is stated
    assert cli.main(["bubble", "--schedule", "zb-h2", "--stages", "4", "--micro-batches",
                     "4"]) == 0
    assert "holds for m >= 2p - 1 only (here m = 4, p = 4)" in capsys.readouterr().out
    assert cli.main(["bubble", "--schedule", "zb-v", "--stages", "4", "--micro-batches", "4",
                     "--json"]) == 0
    s = json.loads(capsys.readouterr().out)
    assert s["formula_holds"] is False and s["bubble_fraction"] == pytest.approx(1 / 9)
    png = tmp_path / "zb.png"
    assert cli.main(["bubble", "--schedule", "zb-v", "-o", str(png)]) == 0
    assert png.stat().st_size > 0
    capsys.readouterr()
    assert cli.main(["bubble", "--schedule", "zb-v", "--chunks", "3"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "zb-v holds exactly 2 chunks" in err[0], err


def test_the_chrome_trace_names_b_and_w() -> None:
    from minipar.trace import pipeline_events

    tl = replay(schedules("zb-v", 2, 3, 2), split_cost(2, 2, 2, v=2), placement="v")
    names = {e["name"] for e in pipeline_events(tl) if e.get("ph") == "X"}
    assert {"F0", "B0", "W0", "f0", "b0", "w0"} <= names, names
