"""`minipar demo`: the README's first command; its numbers are the ring's formula."""

from __future__ import annotations

import subprocess
import sys

import pytest

from minipar import collectives, launch


@pytest.mark.parametrize("n,elems", [(1, 5), (3, 10), (4, 1000)])
def test_demo_measures_the_ring_formula(n: int, elems: int) -> None:
    data, proc = launch.run_json(n, "minipar.demo", {"elems": elems}, timeout=60)
    assert proc.returncode == 0 and data is not None, proc.stderr
    assert data["ranks"] == n and data["bytes"] == 8 * elems
    for row in data["rows"]:
        r = row["rank"]
        assert row["equal_to_mpi"]
        assert row["ring_sent"] == collectives.ring_allreduce_bytes_sent(elems, 8, n, r)
        assert row["ring_peers"] == ([] if n == 1 else [(r + 1) % n])
    root = data["rows"][0]
    assert root["naive_recv"] == (n - 1) * 8 * elems  # the parameter server's in-link


def test_demo_cli_prints_a_table() -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "minipar.cli", "demo", "-n", "2", "--elems", "64"],
        capture_output=True, text=True, timeout=90, check=False,
    )
    assert proc.returncode == 0, proc.stderr
    assert "2(N-1)/N x S = 512 bytes per rank" in proc.stdout
    assert "equal MPI's own Allreduce on every rank" in proc.stdout


@pytest.mark.parametrize("args,option", [
    (["-n", "0"], "-n/--ranks"), (["-n", "two"], "-n/--ranks"), (["--elems", "-1"], "--elems"),
    (["--timeout", "0"], "--timeout"), (["--hostfile", "/no/such/hosts"], "--hostfile"),
    (["--frobnicate"], "--frobnicate"),
])
def test_demo_rejects_bad_arguments_in_one_line(args: list[str], option: str) -> None:
    proc = subprocess.run([sys.executable, "-m", "minipar.cli", "demo", *args],
                          capture_output=True, text=True, timeout=30, check=False)
    assert proc.returncode == 2, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("minipar demo: ") and option in lines[0], lines
    assert "Traceback" not in proc.stderr and proc.stdout == ""
