"""``minipar bench collectives``: auto against MPI's Allreduce, in one run, tiny sizes.

The speed targets (auto >= 0.8x MPI's bus bandwidth from 64 KiB, >= 1.0x from
1 MiB) are measured by the bench, never asserted here (a shared machine);
this checks what the bench reports and that its summary is computed from its
own rows.
"""

from __future__ import annotations

import json

import pytest

from minipar.bench import collectives as bench
from minipar.collectives import choose_allreduce


def test_auto_against_mpi_in_one_run(capsys):
    assert bench.main(["-n", "3", "--sizes", "8", "4096", "--iters", "2", "--collectives",
                       "allreduce", "--algorithms", "auto", "--json", "--timeout", "120"]) == 0
    rows = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert [(r["algorithm"], r["size"]) for r in rows] == [
        ("mpi", 8), ("auto", 8), ("mpi", 4096), ("auto", 4096)]
    for r in rows:
        assert r["ranks"] == 3 and r["time_us"] > 0
        assert r["busbw_GBs"] == pytest.approx(r["algbw_GBs"] * 4 / 3, rel=1e-12)
        if r["algorithm"] == "auto":
            assert r["chosen"] == choose_allreduce(r["size"], 3) == "recursive_doubling"
            mpi = next(m for m in rows if m["algorithm"] == "mpi" and m["size"] == r["size"])
            assert r["x_mpi"] == pytest.approx(r["busbw_GBs"] / mpi["busbw_GBs"])
            assert r["x_mpi_time"] == pytest.approx(mpi["time_us"] / r["time_us"])
    s = bench.auto_summary(rows)
    assert s["latency_size"] == 8
    assert s["latency_ratio"] == pytest.approx(rows[1]["time_us"] / rows[0]["time_us"])
    assert s["min_x_mpi_from_65536"] is None  # nothing measured that large


def test_table_reports_chosen_algorithm_and_targets():
    rows = [{"collective": "allreduce", "algorithm": a, "size": s, "count": s // 4,
             "dtype": "float32", "ranks": 4, "iters": 1, "time_us": t,
             "algbw_GBs": s / t / 1e3, "busbw_GBs": 1.5 * s / t / 1e3}
            for a, s, t in [("mpi", 8, 100.0), ("auto", 8, 250.0),
                            ("mpi", 65536, 400.0), ("auto", 65536, 450.0),
                            ("mpi", 1 << 20, 4000.0), ("auto", 1 << 20, 3600.0)]]
    for r in rows:
        mpi = next(m for m in rows if m["algorithm"] == "mpi" and m["size"] == r["size"])
        r["x_mpi"] = r["busbw_GBs"] / mpi["busbw_GBs"]
        if r["algorithm"] == "auto":
            r["chosen"] = choose_allreduce(r["size"], 4)
    table = bench.format_table(rows)
    auto8 = next(ln for ln in table.splitlines() if ln.split()[:1] == ["8"] and " auto " in ln)
    assert auto8.endswith("  recursive_doubling")  # the auto row names its choice
    assert "busbw ratio from 64 KiB up: min 0.89 (target 0.8: met)" in table
    assert "busbw ratio from 1 MiB up: min 1.11 (target 1.0: met)" in table
    assert "latency at 8 B: auto takes 2.50x MPI's time" in table


def test_nothing_to_compare_is_refused(capsys):
    assert bench.main(["--collectives", "reduce_scatter", "--algorithms", "auto"]) == 2
    assert "no algorithm to compare" in capsys.readouterr().err
