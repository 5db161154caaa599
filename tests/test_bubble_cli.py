"""``minipar bubble``: the chart, the bubble against the formula, JSON, PNG, trace, a recorded run.

Everything runs in-process through ``minipar.cli.main`` (the verb is found in the
registry); bad input is one line on stderr and exit 2, before anything is simulated.
"""

from __future__ import annotations

import argparse
import json
import random
from fractions import Fraction

import pytest

from minipar import cli, trace
from minipar.cli import bubble
from minipar.cli.options import ArgumentParser
from minipar.parallel.pipeline import measure
from minipar.parallel.pipeline.measure import chart, write_timeline
from minipar.parallel.pipeline.measure import in_flight
from minipar.parallel.pipeline.schedule import schedules
from minipar.parallel.pipeline.simulate import replay, uniform_cost
from minipar.registry import VERBS


def call(capsys, *argv):
    code = cli.main(["bubble", *map(str, argv)])
    out, err = capsys.readouterr()
    return code, out, err


def test_the_verb_is_registered():
    assert VERBS["bubble"][0] == "minipar.cli.bubble"


def test_text_shows_the_simulators_chart_and_the_exact_bubble(capsys):
    code, out, err = call(capsys, "--stages", 4, "--micro-batches", 6, "--schedule", "gpipe")
    assert code == 0 and err == ""
    drawn = chart(replay(schedules("gpipe", 4, 6), uniform_cost(1, 2)))
    assert drawn in out  # the docstring's GPipe drawing, from the simulator
    assert ("bubble fraction (P·S − C)/(P·S), S the longest stage's span = 1/3 = 33.3% of "
            "the step") in out
    assert "formula (Huang et al. 2018): (p - 1)/(m + p - 1) = 0.3333" in out
    assert "peak per stage: 6 6 6 6" in out


@pytest.mark.parametrize("kind, p, m, v", [
    ("gpipe", 4, 8, 1), ("1f1b", 4, 8, 1), ("1f1b", 3, 2, 1), ("interleaved", 4, 8, 2),
    ("interleaved", 2, 4, 3), ("naive", 3, 2, 1)])
def test_json_bubble_equals_the_formula_exactly(capsys, kind, p, m, v):
    argv = ["--stages", p, "--micro-batches", m, "--schedule", kind, "--json"]
    code, out, _ = call(capsys, *argv, *(["--chunks", v] if kind == "interleaved" else []))
    assert code == 0
    s = json.loads(out)
    assert (s["schedule"], s["p"], s["m"], s["v"], s["source"]) == (kind, p, m, v, "theory")
    ratio = Fraction(p - 1) if kind == "naive" else Fraction(p - 1, v * m)
    assert Fraction(s["bubble_fraction_exact"]) == ratio / (1 + ratio)
    assert s["bubble_fraction"] == s["formula_value"] == float(ratio / (1 + ratio))
    assert s["bubble_time_ratio"] == s["formula_ratio_value"] == float(ratio)
    assert s["formula"] == bubble.FORMULA[kind][0]
    peaks = [in_flight(sc) for sc in schedules(kind, p, m, v)]
    assert s["in_flight"] == peaks and s["in_flight_max"] == max(peaks)
    if kind == "gpipe":
        assert s["in_flight_max"] == m
    if kind == "1f1b":
        assert s["in_flight"] == [min(p - st, m) for st in range(p)]


def test_defaults_are_1f1b_on_4_stages_8_micro_batches(capsys):
    code, out, _ = call(capsys, "--json")
    s = json.loads(out)
    assert code == 0 and (s["schedule"], s["p"], s["m"], s["v"]) == ("1f1b", 4, 8, 1)
    assert s["bubble_fraction_exact"] == "3/11" and s["in_flight_max"] == 4
    _, out, _ = call(capsys, "--schedule", "interleaved", "--json")
    assert json.loads(out)["v"] == 2


def test_png_and_trace_files(capsys, tmp_path):
    png, tr = tmp_path / "g.png", tmp_path / "g.json"
    code, out, _ = call(capsys, "--schedule", "gpipe", "--stages", 3, "--micro-batches", 4,
                        "-o", png, "--trace", tr)
    assert code == 0 and f"wrote {png}" in out and f"wrote {tr}" in out
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    data = json.loads(tr.read_text())
    assert trace.problems(data) == []
    n = len(replay(schedules("gpipe", 3, 4), uniform_cost(1, 2)))
    assert sum(e["ph"] == "X" for e in data["traceEvents"]) == n
    assert data["otherData"]["bubble_fraction"] == pytest.approx(2 / 6)


def _recorded(tmp_path, kind="1f1b", p=3, m=6, jitter=0.0):
    """A 'run': forward 10 ms, backward 20 ms per stage (± jitter), sends 0.1 ms."""
    rng = random.Random(1)

    def cost(ins, stage):
        base = {"Forward": 0.010, "Backward": 0.020}.get(type(ins).__name__, 0.0001)
        return base * (1 + jitter * rng.random())
    recs = replay(schedules(kind, p, m), cost, comm_cost=cost)
    path = tmp_path / "run.json"
    write_timeline(path, recs, kind, p, m)
    return path, recs


def test_from_run_rebuilds_the_timeline_and_compares_it_with_the_formula(capsys, tmp_path):
    path, _ = _recorded(tmp_path)
    code, out, _ = call(capsys, "--from-run", path, "--json")
    s = json.loads(out)
    assert code == 0 and s["source"] == "run"
    assert (s["schedule"], s["p"], s["m"], s["v"]) == ("1f1b", 3, 6, 1)
    # equal stages, sends 0.1 ms: the bubble is the formula's but for the sends' share
    assert s["bubble_fraction"] == pytest.approx(s["formula_value"], abs=0.02)
    assert s["bubble_fraction_wall"] == pytest.approx(s["bubble_fraction"], abs=1e-9)
    assert s["bubble_fraction_fastest"] == pytest.approx(s["formula_value"], abs=0.02)
    assert s["in_flight_measured"] == [3, 2, 1]
    code, out, _ = call(capsys, "--from-run", path)
    assert code == 0 and "measured, wall clock:" in out and "rebuilt by the simulator" in out
    assert "stage 2  " in out


def test_from_run_writes_both_timelines_to_the_trace(capsys, tmp_path):
    path, recs = _recorded(tmp_path, "gpipe", 2, 3, jitter=0.2)
    tr, png = tmp_path / "t.json", tmp_path / "t.png"
    code, _, _ = call(capsys, "--from-run", path, "--trace", tr, "-o", png)
    assert code == 0 and png.stat().st_size > 0
    events = json.loads(tr.read_text())["traceEvents"]
    assert {e["pid"] for e in events} == {0, 1}  # measured and rebuilt
    assert sum(e["ph"] == "X" and e["pid"] == 0 for e in events) == len(recs)


def test_fastest_costs_remove_the_stalls():
    """Two forwards stalled 50 units (another process took the core): the rebuilt timeline
    keeps them, the fastest-cost one does not: equal stages give the formula exactly."""
    recs = replay(schedules("gpipe", 2, 4), uniform_cost(1, 2))
    stalled = [r._replace(end=r.end + 50) if (r.what, r.micro_batch) == ("forward", 1) else r
               for r in recs]
    from minipar.parallel.pipeline.measure import bubble_fraction, rebuild

    assert bubble_fraction(rebuild(stalled, "gpipe", 2, 4)) == Fraction(53, 115)  # the stalls
    assert bubble_fraction(measure.rebuild_fastest(stalled, "gpipe", 2, 4)) == Fraction(1, 5)
    with pytest.raises(ValueError, match="no backward on stage 1"):
        measure.rebuild_fastest([r for r in recs if r[:2] != (1, "backward")], "gpipe", 2, 4)


def test_a_bare_list_of_records_is_read_too(tmp_path):
    recs = replay(schedules("gpipe", 2, 3), uniform_cost(1, 2))
    path = tmp_path / "bare.json"
    path.write_text(json.dumps([r._asdict() for r in recs]))
    meta, got = measure.load_run(path)
    assert (meta["p"], meta["m"], meta["v"]) == (2, 3, 1) and len(got) == len(recs)


BAD = [
    (["--stages", "0"], "--stages must be an integer from 1 to 64, got 0"),
    (["--micro-batches", "0"], "--micro-batches must be an integer from 1 to 1024, got 0"),
    (["--schedule", "zb"], "--schedule: invalid choice: 'zb'"),
    (["--schedule", "interleaved", "--micro-batches", "6"],
     "--micro-batches 6 is not a multiple of --stages 4"),
    (["--schedule", "gpipe", "--chunks", "2"], "--chunks 2 needs --schedule interleaved"),
    (["--chunks", "0"], "--chunks must be an integer from 1 to 16, got 0"),
    (["-o", "/no/such/folder/x.png"], "the folder /no/such/folder does not exist"),
    (["-o", "chart.txt"], "-o chart.txt: cannot draw a .txt file; name it .png, .pdf or .svg"),
    (["-o", "chart"], "-o chart: cannot draw a suffix-less file"),
    (["--from-run", "/no/such/run.json"], "--from-run /no/such/run.json: cannot read it"),
]


@pytest.mark.parametrize("argv, words", BAD, ids=[" ".join(a) for a, _ in BAD])
def test_bad_input_is_one_line_and_exit_2(capsys, argv, words):
    code, out, err = call(capsys, *argv)
    assert code == 2 and out == ""
    assert err.count("\n") == 1 and err.startswith("minipar bubble: ") and words in err, err


def test_a_broken_or_disagreeing_run_file_is_one_line(capsys, tmp_path):
    path, _ = _recorded(tmp_path)
    code, _, err = call(capsys, "--from-run", path, "--stages", 4)
    assert code == 2 and "--stages 4 disagrees with the recorded run's 3" in err
    junk = tmp_path / "junk.json"
    for text, words in (("{", "not JSON"), ('{"records": []}', "no records"),
                        ('[{"stage": 0}]', "lacks stage, what, start or end")):
        junk.write_text(text)
        code, _, err = call(capsys, "--from-run", junk)
        assert code == 2 and err.count("\n") == 1 and words in err, err
    data = json.loads(path.read_text())
    data["records"] = [r for r in data["records"] if r["what"] != "backward" or r["stage"]]
    junk.write_text(json.dumps(data))
    code, _, err = call(capsys, "--from-run", junk)
    assert code == 2 and "no record of Backward" in err, err


def test_every_option_has_help_that_shows_its_default(monkeypatch):
    seen = []
    monkeypatch.setattr(ArgumentParser, "parse_args",
                        lambda self, *a, **k: seen.append(self) or (_ for _ in ()).throw(
                            SystemExit(0)))
    assert cli.main(["bubble", "--help"]) == 0
    (p,) = seen
    options = [a for a in p._actions if a.option_strings and
               not isinstance(a, argparse._HelpAction)]
    assert len(options) == 9
    for a in options:
        assert "default" in (a.help or ""), a.option_strings
