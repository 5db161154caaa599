"""`minipar bench tp`: runs at a tiny size and counts the bytes the formula predicts.

No timing is asserted (the machine is shared); the bytes are exact: 4 ring
all-reduces of b·s·h elements per block, 2(t-1)/t of each per rank.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest
from conftest import refused_before_mpi, run_minipar

TINY = ["--d-model", "32", "--heads", "4", "--seq", "16", "--batch", "2", "--steps", "1"]


def _bench(*args: str) -> subprocess.CompletedProcess[str]:
    return run_minipar("bench", "tp", *args, timeout=120)


def test_bench_tp_times_both_and_counts_the_ring_bytes() -> None:
    proc = _bench(*TINY, "--sp", "--json")
    assert proc.returncode == 0, proc.stderr
    row = json.loads(proc.stdout)
    assert row["serial_s"] > 0 and row["tp_s"] > 0 and row["speedup"] > 0
    assert row["bytes_per_block_per_rank"] == [row["bytes_formula"]] * 2 == [4 * 2 * 16 * 32 * 4] * 2
    # blocking and overlapped (--tp-overlap's layers), with and without SP: the same bytes;
    # the blocking forms hide nothing by construction (no timing asserted beyond that)
    blocks = row["blocks"]
    assert set(blocks) == {"TP", "TP overlap", "TP+SP", "TP+SP overlap"}
    for name, b in blocks.items():
        assert b["bytes_per_rank"] == row["bytes_per_block_per_rank"], name
        assert b["seconds"] > 0 and all(p > 0 for p in b["peak_bytes_per_rank"])
        assert b["hidden_fraction"] == 0.0 if "overlap" not in name else (
            0.0 <= b["hidden_fraction"] <= 1.0), (name, b)
    # the planner's minipar-on-this-machine term beside each overlapped row: the blocking
    # row's step minus the recorded share of its seconds in messages
    from minipar.plan.here import HERE_OVERLAP

    for name, kind in (("TP", "tp"), ("TP+SP", "tp_sp")):
        block = blocks[name]
        assert block["comm_seconds"] > 0 and "plan_seconds" not in block
        want = block["seconds"] - HERE_OVERLAP[kind] * min(block["comm_seconds"],
                                                          block["seconds"])
        assert blocks[name + " overlap"]["plan_seconds"] == pytest.approx(want, rel=1e-12)
    text = _bench(*TINY)
    assert text.returncode == 0 and "speed-up" in text.stdout and "16,384" in text.stdout
    assert "ideal 2x on 2 ranks" in text.stdout and "target" not in text.stdout
    assert "plan s: the planner's minipar-on-this-machine term" in text.stdout


@pytest.mark.parametrize("args,option", [
    (["--heads", "3"], "--heads"), (["-n", "3"], "-n"), (["-n", "1"], "-n/--ranks"),
])
def test_bench_tp_refuses_bad_options_in_one_line(args: list[str], option: str,
                                                 tmp_path: Path) -> None:
    line = refused_before_mpi(["bench", "tp", *TINY, *args], tmp_path).stderr.strip()
    assert line.startswith("minipar bench tp: ") and option in line, line
