"""minipar.launch: more ranks than cores, and a timeout that leaves no process behind."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest

from minipar import launch

MPI_DIR = Path(__file__).parent / "mpi"


def test_more_ranks_than_cores() -> None:
    n = 8  # the CI machine has 2 cores
    proc = launch.run(n, str(MPI_DIR / "comm_hello.py"), timeout=90)
    assert proc.returncode == 0, proc.stderr[-3000:]
    lines = sorted(ln for ln in proc.stdout.splitlines() if ln.startswith("hello"))
    assert lines == sorted(
        f"hello from rank {r} of {n}, left neighbour {(r - 1) % n}" for r in range(n))


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            state = f.read().rsplit(")", 1)[1].split()[0]
    except FileNotFoundError:
        return False
    return state not in ("Z", "X")  # a zombie has already exited


def test_timeout_kills_every_rank(tmp_path: Path) -> None:
    with pytest.raises(launch.LaunchTimeout) as info:
        launch.run(4, str(MPI_DIR / "comm_sleep.py"), str(tmp_path), timeout=6)
    assert "did not finish within 6 s" in str(info.value)
    pids = set()
    for f in tmp_path.glob("pid.*"):
        pids.update(int(p) for p in f.read_text().split())
    assert len(list(tmp_path.glob("pid.*"))) == 4, "every rank should have started"
    deadline = time.monotonic() + 10
    while any(_alive(p) for p in pids) and time.monotonic() < deadline:
        time.sleep(0.1)
    left = [p for p in pids if _alive(p)]
    assert not left, f"processes left running after LaunchTimeout: {left}"
    assert os.getpid() not in pids


def test_bad_rank_count_is_a_value_error() -> None:
    with pytest.raises(ValueError, match="positive integer"):
        launch.run(0, str(MPI_DIR / "comm_hello.py"))
