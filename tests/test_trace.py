"""Timelines as Chrome trace events (minipar.trace): the JSON Perfetto and chrome://tracing open."""

from __future__ import annotations

import json

import pytest

from minipar import trace
from minipar.parallel.pipeline.schedule import schedules
from minipar.parallel.pipeline.simulate import replay, uniform_cost


def _x(events):
    return [e for e in events if e["ph"] == "X"]


def test_pipeline_events_one_complete_event_per_record_in_microseconds():
    tl = replay(schedules("1f1b", 2, 3), uniform_cost(1, 2))
    events = trace.pipeline_events(tl, seconds=1e-3, name="1F1B")
    assert trace.problems({"traceEvents": events}) == []
    x = _x(events)
    assert len(x) == len(tl)
    by_name = {(e["tid"], e["name"]): e for e in x}
    f0 = by_name[(0, "F0")]
    assert (f0["ts"], f0["dur"], f0["pid"], f0["cat"]) == (0, 1000, 0, "forward")  # 1 unit = 1 ms
    b0 = by_name[(1, "B0")]  # stage 1: receives F0 at 1, forwards 1..2, backward 2..4
    assert (b0["ts"], b0["dur"], b0["args"]) == (2000, 2000, {"micro_batch": 0, "chunk": 0})
    assert by_name[(0, "optimizer")]["args"] == {"micro_batch": None, "chunk": None}
    assert {e["name"] for e in x if e["cat"] == "send_act"} == {"send_act 0", "send_act 1",
                                                                 "send_act 2"}
    names = {(e["name"], e.get("tid"), e["args"]["name"]) for e in events if e["ph"] == "M"
             and "name" in e["args"]}
    assert names == {("process_name", None, "1F1B"), ("thread_name", 0, "stage 0"),
                     ("thread_name", 1, "stage 1")}


def test_odd_chunks_are_lower_case_and_times_start_at_zero():
    tl = replay(schedules("interleaved", 2, 2, 2), uniform_cost(1, 2, v=2))
    shifted = [r._replace(start=r.start + 100, end=r.end + 100) for r in tl]
    events = _x(trace.pipeline_events(shifted, seconds=1e-3))
    assert min(e["ts"] for e in events) == 0
    assert {e["name"] for e in events if e["cat"] == "forward"} == {"F0", "F1", "f0", "f1"}
    assert {e["dur"] for e in events if e["cat"] == "backward"} == {1000}  # 2/v units


def test_ddp_timelines_one_process_per_rank_two_lanes():
    tls = [{"rank": 0, "compute": [("head", 0.5, 0.6), ("block 0", 0.6, 0.8),
                                   ("optimizer", 0.9, 0.95)],
            "comm": [(0, 0.6, 0.7), (1, 0.8, 0.9)]},
           {"rank": 1, "compute": [("head", 0.52, 0.61)], "comm": [(0, 0.61, 0.7)]}]
    events = trace.ddp_events(tls)
    assert trace.problems(trace.chrome_trace(events)) == []
    x = _x(events)
    assert len(x) == 7
    head = next(e for e in x if e["pid"] == 0 and e["name"] == "head")
    assert (head["ts"], head["dur"], head["tid"]) == (0, 1e5, 0)
    bucket = next(e for e in x if e["pid"] == 0 and e["name"] == "bucket 1")
    assert (bucket["ts"], bucket["dur"], bucket["tid"]) == (3e5, 1e5, 1)
    assert {(e["pid"], e["tid"], e["args"]["name"]) for e in events
            if e["name"] == "thread_name"} == {(r, 0, "compute") for r in (0, 1)} | {
        (r, 1, "bucket all-reduce") for r in (0, 1)}


def test_write_gives_a_json_file_with_trace_events_and_metadata(tmp_path):
    tl = replay(schedules("gpipe", 3, 4), uniform_cost(1, 2))
    path = trace.write(tmp_path / "t.json", trace.pipeline_events(tl), schedule="gpipe", p=3)
    data = json.loads(path.read_text())
    assert set(data) == {"traceEvents", "displayTimeUnit", "otherData"}
    assert data["otherData"] == {"schedule": "gpipe", "p": 3}
    assert trace.problems(data) == []
    assert len(_x(data["traceEvents"])) == len(tl)


def test_problems_name_what_a_viewer_would_refuse():
    good = {"name": "F0", "ph": "X", "ts": 0, "dur": 1, "pid": 0, "tid": 0, "args": {}}
    assert trace.problems({"traceEvents": [good]}) == []
    assert trace.problems({"events": []}) == ["no 'traceEvents' list"]
    for bad in ({**good, "dur": -1}, {**good, "ts": "0"}, {**good, "pid": None},
                {**good, "ph": "B"}, {"name": "thread_name", "ph": "M", "pid": 0}):
        (msg,) = trace.problems({"traceEvents": [bad]})
        assert msg.startswith("event 0:"), msg


def test_bad_input_is_one_clear_error():
    tl = replay(schedules("gpipe", 2, 1), uniform_cost(1, 2))
    with pytest.raises(ValueError, match="seconds per time unit must be > 0"):
        trace.pipeline_events(tl, seconds=0)
    broken = [tl[0]._replace(end=tl[0].start - 1)]
    with pytest.raises(ValueError, match="ends .* before it starts"):
        trace.pipeline_events(broken)


@pytest.mark.parametrize("argv", [["dp", "-n", "2"], ["pp", "-n", "2", "--micro-batches", "2"],
                                  ["sp", "-n", "2", "--tp-overlap", "--json"]],
                         ids=["dp", "pp", "sp-overlap"])
def test_minipar_run_writes_a_chrome_trace(argv, tmp_path, capsys):
    """``minipar run dp|pp|sp --trace FILE``: a well-formed trace of the last step's timeline
    (TP's: its compute and its f / g messages, with the share hidden in the summary)."""
    from minipar import run

    path = tmp_path / "trace.json"
    assert run.main([*argv, "--steps", "1", "--trace", str(path)]) == 0
    written = json.loads(path.read_text())
    assert trace.problems(written) == []
    lanes = {e["cat"] for e in written["traceEvents"] if e["ph"] == "X"}
    assert lanes >= ({"forward", "backward"} if argv[0] == "pp" else {"compute", "comm"})
    out = capsys.readouterr().out
    assert f"trace written to {path}" in out
    if argv[0] == "sp":  # the decomposed rings' messages move while chunks multiply
        s = json.loads(out)
        assert 0 < s["hidden_fraction"] <= 1 and len(s["hidden_fraction_per_rank"]) == 2
        names = {e["name"] for e in written["traceEvents"] if e.get("cat") == "comm"}
        assert names >= {"sp_f", "sp_g"}, names
