"""``minipar run ps --straggler-ms``: every worker's measured computing and waiting time.

No timing is asserted beyond what the code guarantees: each worker reports one
figure per step it ran (``steps`` = ``--steps``), both times are >= 0, the
straggler's computing time holds at least its sleeps (``time.sleep`` never
returns early), and the text prints one line per worker with the same figures.
Sync and async side by side are read in notebook 03, not asserted here.
"""

from __future__ import annotations

import json

import pytest

from minipar import run


def test_straggler_run_reports_each_workers_waiting_and_computing(
        capsys: pytest.CaptureFixture[str]) -> None:
    rc = run.main(["ps", "-n", "3", "--steps", "4", "--straggler-ms", "3", "--async",
                   "--staleness", "1", "--json"])
    out = capsys.readouterr().out
    assert rc == 0, out
    s = json.loads(out[out.index("{"):])
    t = s["worker_timings"]
    assert [w["rank"] for w in t] == [1, 2]  # rank 0 is the server
    for w in t:
        assert w["steps"] == 4 and w["computing_s"] > 0 and w["waiting_s"] >= 0
    assert t[0]["computing_s"] >= 4 * 0.003  # the straggler's sleeps are inside its computing
    lines = [n for n in s["notes"] if n.startswith("worker ")]
    assert len(lines) == 2 and "(the straggler: +3 ms per step)" in lines[0]
    assert "the straggler" not in lines[1]
    for w, line in zip(t, lines):
        assert f"{w['steps']} steps, computing {w['computing_s'] * 1e3:,.1f} ms" in line
        assert f"waiting for the pull {w['waiting_s'] * 1e3:,.1f} ms" in line
