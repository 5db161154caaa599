"""Helpers the test files share (pytest imports this before them)."""

from __future__ import annotations

from pathlib import Path

import pytest

MPI_DIR = Path(__file__).parent / "mpi"


def summary_of(proc, tag: str) -> dict[str, str]:
    """The fields of the ``TAG-SUMMARY N=.. checks=.. failures=..`` line a rank-side
    script printed (tests/mpi/mpi_checks.py), after asserting the launch succeeded."""
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-3000:]
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith(f"{tag}-SUMMARY")]
    assert lines, proc.stdout[-4000:] + proc.stderr[-3000:]
    return dict(kv.split("=") for kv in lines[0].split()[1:])


@pytest.fixture
def mpi_dir() -> Path:
    return MPI_DIR
