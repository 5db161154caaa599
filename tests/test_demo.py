"""`minipar demo`: the README's first command; its numbers are the ring's formula."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from conftest import refused_before_mpi

from minipar import collectives, launch
from minipar.cli import demo
from minipar.exercises import EXERCISES


@pytest.mark.parametrize("n,elems", [(1, 5), (3, 10), (4, 1000)])
def test_demo_measures_the_ring_formula(n: int, elems: int) -> None:
    data, proc = launch.run_json(n, "minipar.cli.demo", {"elems": elems}, timeout=60)
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
    assert proc.stdout.rstrip().splitlines()[-1] == demo.NEXT


def test_demo_next_line_points_at_the_first_step_of_the_readme_path() -> None:
    """The demo's last line names notebook 01 and the ring exercise, which exist, and
    the README's learning path starts with the same two steps after the demo."""
    root = Path(__file__).resolve().parents[1]
    assert demo.NEXT.startswith("next: notebook 01_collectives ")
    assert (root / "notebooks" / "01_collectives.ipynb").is_file()
    assert "minipar exercise start ring_allreduce" in demo.NEXT and "ring_allreduce" in EXERCISES
    readme = (root / "README.md").read_text(encoding="utf-8")
    assert "## Learning path" in readme
    path = readme.split("## Learning path", 1)[1].split("\n## ", 1)[0]
    steps = [path.find(s) for s in ("minipar demo", "01_collectives", "ring_allreduce",
                                    "02_serial_model", "03_data_parallel", "dp_grad_sync",
                                    "04_zero", "zero1_step")]
    assert -1 not in steps and steps == sorted(steps), steps


@pytest.mark.parametrize("args,option", [
    (["-n", "0"], "-n/--ranks"), (["-n", "two"], "-n/--ranks"), (["--elems", "-1"], "--elems"),
    (["--timeout", "0"], "--timeout"), (["--hostfile", "/no/such/hosts"], "--hostfile"),
    (["--frobnicate"], "--frobnicate"),
])
def test_demo_rejects_bad_arguments_in_one_line(args: list[str], option: str,
                                                tmp_path: Path) -> None:
    line = refused_before_mpi(["demo", *args], tmp_path, timeout=30).stderr.strip()
    assert line.startswith("minipar demo: ") and option in line, line
