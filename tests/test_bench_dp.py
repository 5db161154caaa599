"""``minipar bench dp`` runs end to end on a tiny model, and its timing helper measures.

No timing assertions (the machine is shared): the 1.7x target is the
benchmark's to report, not the test's to enforce.
"""

from __future__ import annotations

import json

import pytest

from minipar import cli
from minipar.bench import dp as bench_dp


def test_bench_dp_tiny_end_to_end(capsys: pytest.CaptureFixture[str]) -> None:
    rc = bench_dp.main(["--d-model", "16", "--layers", "1", "--heads", "2", "--seq", "8",
                        "--vocab", "16", "--batch", "4", "--steps", "1", "--rounds", "1",
                        "--bucket-mb", "0.001", "--json"])
    out = capsys.readouterr().out
    assert rc == 0, out
    row = json.loads(out)
    assert row["ranks"] == 2 and row["batch"] == 4 and len(row["round_speedups"]) == 1
    assert row["serial_s"] > 0 and row["dp_s"] > 0
    assert row["speedup"] == pytest.approx(row["serial_s"] / row["dp_s"])
    # the ceiling: N processes without messages; DP's share of it
    assert row["independent_s"] > 0
    assert row["ceiling"] == pytest.approx(row["serial_s"] / row["independent_s"])
    assert row["of_ceiling"] == pytest.approx(row["independent_s"] / row["dp_s"])
    assert len(row["round_ceilings"]) == 1 and row["config"]["d_model"] == 16
    assert bench_dp.ceiling_line(row).startswith(
        f"ceiling {row['ceiling']:.2f}x: 2 independent processes, each the serial step on B/2 rows")
    assert row["dp_samples_per_s"] == pytest.approx(4 / row["dp_s"])
    assert row["buckets"] > 1
    line = bench_dp.speedup_line(row, 1)
    assert line.startswith(f"speed-up {row['speedup']:.2f}x (best of 1; ideal 2x on 2 ranks)")
    assert "target" not in line
    psi_bytes = row["psi"] * 4  # float32
    assert row["bytes_per_step"] == pytest.approx(psi_bytes, rel=0.001)  # 2(N-1)/N x S, N = 2


def test_measure_step_time_is_the_median_after_warmup(monkeypatch: pytest.MonkeyPatch) -> None:
    """A scripted clock: step s lasts durations[s] seconds; the warm-up is left out."""
    durations = [5.0, 1.0, 3.0, 2.0]
    clock = {"now": 0.0}
    calls: list[int] = []

    class FakeTime:
        @staticmethod
        def perf_counter() -> float:
            return clock["now"]

    def step(s: int) -> None:
        calls.append(s)
        clock["now"] += durations[s]

    monkeypatch.setattr(bench_dp, "time", FakeTime)
    assert bench_dp.measure_step_time(step, steps=3, warmup=1) == 2.0
    assert calls == [0, 1, 2, 3]
    with pytest.raises(ValueError):
        bench_dp.measure_step_time(step, steps=0)


@pytest.mark.parametrize("args,option", [
    (["--bucket-mb", "0"], "--bucket-mb"), (["-n", "4", "--batch", "2"], "--batch"),
    (["--heads", "3"], "--heads"), (["--precision", "foo"], "--precision"),
    (["--timeout", "0"], "--timeout"), (["--rounds", "0"], "--rounds"), (["-n", "x"], "-n"),
])
def test_bad_options_are_one_line_and_exit_2(args: list[str], option: str,
                                             capsys: pytest.CaptureFixture[str]) -> None:
    """Checked in this process, before any rank starts."""
    assert cli.main(["bench", "dp", *args]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("minipar bench dp: ") and option in err[0], err
