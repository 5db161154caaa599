"""``minipar bench collectives``: auto against MPI's Allreduce, in one run, tiny sizes.

The speed targets (auto >= 0.8x MPI's bus bandwidth from 64 KiB, >= 1.0x from
1 MiB) are measured by the bench, never asserted here (a shared machine);
this checks what the bench reports and that its summary is computed from its
own rows.
"""

from __future__ import annotations

import json

import pytest

from minipar import cli
from minipar.bench import collectives as bench
from minipar.collectives import choose_allreduce


def test_auto_against_mpi_in_one_run(capsys, tmp_path):
    png = tmp_path / "busbw.png"
    assert bench.main(["-n", "3", "--sizes", "8", "4096", "--iters", "2", "--collectives",
                       "allreduce", "--algorithms", "auto", "--json", "--timeout", "120",
                       "--plot", str(png)]) == 0
    out, err = capsys.readouterr()
    rows = json.loads(out.strip().splitlines()[-1])
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"  # the picture of these rows
    # stdout holds only the JSON; the progress bar (after 1 s, tests/test_bench_progress.py)
    # went to stderr, ending at 2 of 2 sizes
    assert err.splitlines()[-1].startswith(f"wrote {png}"), err  # says where the picture went
    assert all(ln.startswith("size ") for ln in err.splitlines()[:-1]), err
    bar = err.splitlines()[:-1]
    assert not bar or bar[-1].startswith("size 2/2 ["), err
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
    assert "busbw ratio from 64 KiB up: min 0.89 (below MPI's speed)" in table
    assert "busbw ratio from 1 MiB up: min 1.11 (at or above MPI's speed)" in table
    assert "1.00 = as fast as MPI's own collective" in table
    assert "target" not in table and "issue" not in table
    assert "latency at 8 B: auto takes 2.50x MPI's time" in table
    from minipar.collectives.auto import ring_threshold

    assert (f"auto on 4 ranks: recursive doubling below {int(ring_threshold(4)):,} B, the ring "
            "from there (the alpha-beta-gamma model") in table


def test_nothing_to_compare_is_refused(capsys):
    assert cli.main(["bench", "collectives", "--collectives", "reduce_scatter", "--algorithms",
                     "auto"]) == 2
    assert "no algorithm to compare" in capsys.readouterr().err


def _rows(n: int = 4) -> list[dict]:
    """Rows as the bench makes them: two collectives, MPI and two algorithms, three sizes."""
    rows = []
    for coll, algos in (("allreduce", ("mpi", "ring", "naive")), ("all_gather", ("mpi", "ring"))):
        for size in (1024, 65536, 1 << 20):
            for k, algo in enumerate(algos):
                t = size / 1e3 * (1 + k) + 10.0 * (k + 1)  # microseconds
                rows.append({"collective": coll, "algorithm": algo, "size": size,
                             "count": size // 4, "dtype": "float32", "ranks": n, "iters": 1,
                             "time_us": t, "algbw_GBs": size / t / 1e3,
                             "busbw_GBs": 1.5 * size / t / 1e3})
    for r in rows:
        mpi = next(m for m in rows if m["algorithm"] == "mpi" and m["size"] == r["size"]
                   and m["collective"] == r["collective"])
        r["x_mpi"] = r["busbw_GBs"] / mpi["busbw_GBs"]
    return rows


def test_legend_and_one_summary_line_per_collective():
    rows = _rows()
    table = bench.format_table(rows).splitlines()
    assert bench.LEGEND in table
    naive = [r for r in rows if r["algorithm"] == "naive"]
    best = max(naive + [r for r in rows if r["collective"] == "allreduce"
                        and r["algorithm"] == "ring"], key=lambda r: r["x_mpi"])
    worst = min(naive, key=lambda r: r["x_mpi"])
    line = next(ln for ln in table if ln.startswith("# allreduce: best"))
    assert line == (f"# allreduce: best x_mpi {best['x_mpi']:.2f} ({best['algorithm']} at "
                    f"{bench.human_size(best['size'])}), worst {worst['x_mpi']:.2f} "
                    f"(naive at {bench.human_size(worst['size'])})")
    assert sum(ln.startswith("# all_gather: best x_mpi ") for ln in table) == 1
    assert [bench.human_size(s) for s in (8, 1024, 65536, 1 << 20, 3000)] == [
        "8 B", "1 KiB", "64 KiB", "1 MiB", "3000 B"]


def test_plot_has_one_panel_per_collective_and_the_rows_as_lines(tmp_path):
    from minipar.bench.collectives_plot import plot_busbw

    rows, png = _rows(), tmp_path / "busbw.png"
    fig = plot_busbw(rows, png)
    assert png.stat().st_size > 1000 and png.read_bytes()[:4] == b"\x89PNG"
    assert [ax.get_title() for ax in fig.axes] == ["allreduce, 4 ranks", "all_gather, 4 ranks"]
    for ax, coll in zip(fig.axes, ("allreduce", "all_gather")):
        assert ax.get_xscale() == "log" and ax.get_yscale() == "log"
        for line in ax.get_lines():
            mine = sorted((r["size"], r["busbw_GBs"]) for r in rows
                          if r["collective"] == coll and r["algorithm"] == line.get_label())
            assert list(line.get_xdata()) == [m[0] for m in mine]
            assert list(line.get_ydata()) == [m[1] for m in mine]
        assert sorted(line.get_label() for line in ax.get_lines()) == sorted(
            {r["algorithm"] for r in rows if r["collective"] == coll})
    with pytest.raises(ValueError, match="busbw must be > 0"):
        plot_busbw([{**rows[0], "busbw_GBs": 0.0}])


def test_one_rank_is_refused_with_the_reason(capsys):
    assert cli.main(["bench", "collectives", "-n", "1"]) == 2
    err = capsys.readouterr().err
    assert err == f"minipar bench collectives: {bench.ONE_RANK}\n"
    assert "2(N-1)/N is 0" in err


def test_calibrate_writes_constants_the_model_reads(tmp_path, capsys):
    from minipar.collectives.cost_model import load_costs

    out = tmp_path / "cal.json"
    assert bench.main(["-n", "2", "--calibrate", str(out)]) == 0
    costs = load_costs(out)  # positive, finite: the checks of the committed file's reader
    assert "calibrate" in costs.measured and "2 ranks" in costs.measured
    assert f"wrote {out}" in capsys.readouterr().out
