"""`minipar bench cp`: every kind of context parallelism at tiny sizes, three growing
sequence lengths; the bytes and the activation memory are exact (no timing is asserted:
the machine is shared)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from conftest import refused_before_mpi, run_minipar

TINY = ["--seqs", "16", "32", "64", "--d-model", "16", "--heads", "4", "--kv-heads", "2",
        "--layers", "1", "--steps", "1", "--precision", "float64"]


def test_bench_cp_runs_every_kind_and_counts_exactly() -> None:
    proc = run_minipar("bench", "cp", "-n", "4", *TINY, "--json", timeout=180)
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout)
    rows = out["rows"]
    assert [(r["kind"], r["seq"]) for r in rows] == [
        (k, s) for s in (16, 32, 64) for k in ("ring", "allgather", "ulysses", "usp")]
    for r in rows:
        assert r["step_s"] > 0 and r["bytes_per_step"] == r["bytes_formula"], r
        assert r["activation_per_layer"] == r["activation_formula"] < r["serial_activation"], r
    big = {r["kind"]: r for r in rows if r["seq"] == 64}
    # the ring and USP keep no s² term; the all-gather keeps the whole sequence's K and V
    assert big["ring"]["activation_per_layer"] < big["allgather"]["activation_per_layer"]
    assert big["usp"]["activation_per_layer"] < big["ulysses"]["activation_per_layer"]


@pytest.mark.parametrize("args,option", [
    (["--seqs", "12", "24", "48"], "--seq 12"), (["--seqs", "64", "32", "16"], "--seqs"),
    (["--kv-heads", "3"], "--kv-heads 3"),
])
def test_bench_cp_refuses_bad_options_in_one_line(args: list[str], option: str,
                                                 tmp_path: Path) -> None:
    line = refused_before_mpi(["bench", "cp", "-n", "4", *TINY, *args], tmp_path).stderr.strip()
    assert line.startswith("minipar bench cp: ") and option in line, line
