"""Helpers the test files share (pytest imports this before them)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from minipar import launch

MPI_DIR = Path(__file__).parent / "mpi"

#: the browser tests' Chromium (Debian's chromium, chromium-driver: .ci/run installs them),
#: its flags on a closed network, and where screenshots are kept (git-ignored build/)
CHROMIUM, DRIVER = Path("/usr/bin/chromium"), Path("/usr/bin/chromedriver")
FLAGS = ("--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
         "--disable-background-networking", "--disable-component-update", "--disable-sync",
         "--disable-dev-shm-usage", "--window-size=1400,1800")
SHOTS = Path(__file__).resolve().parent.parent / "build" / "browser-test"

#: what the stand-in of :func:`fake_mpiexec` leaves in its folder when it is started
STARTED = "mpiexec-was-started"


def summary_of(proc, tag: str) -> dict[str, str]:
    """The fields of the ``TAG-SUMMARY N=.. checks=.. failures=..`` line a rank-side
    script printed (tests/mpi/mpi_checks.py), after asserting the launch succeeded."""
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-3000:]
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith(f"{tag}-SUMMARY")]
    assert lines, proc.stdout[-4000:] + proc.stderr[-3000:]
    return dict(kv.split("=") for kv in lines[0].split()[1:])


def launch_checks(n: int, script: str, tag: str, timeout: float,
                  watchdog_s: float, backend: str = "numpy") -> dict[str, str]:
    """One launch of ``tests/mpi/<script>`` on ``n`` ranks (the watchdog at ``watchdog_s``,
    the array backend ``backend``: "strict" is the device stand-in): the fields of its
    summary line, after asserting it ran on n ranks and no check failed."""
    proc = launch.run(n, str(MPI_DIR / script), timeout=timeout,
                      env={"MINIPAR_WATCHDOG_S": str(watchdog_s), "MINIPAR_BACKEND": backend})
    fields = summary_of(proc, tag)
    assert fields["N"] == str(n) and fields["failures"] == "0", proc.stdout[-4000:]
    return fields


def run_minipar(*argv: str, env: dict[str, str] | None = None,
                timeout: float = 120) -> subprocess.CompletedProcess[str]:
    """``python -m minipar.cli *argv`` in a child process (``env`` added to this one's)."""
    return subprocess.run([sys.executable, "-m", "minipar.cli", *argv], capture_output=True,
                          text=True, timeout=timeout, check=False,
                          env={**os.environ, **(env or {})})


def fake_mpiexec(folder: Path) -> Path:
    """A stand-in for mpiexec (to name in ``MINIPAR_MPIEXEC``) that only leaves
    ``folder / STARTED`` and exits 99: a refusal before MPI leaves no such file."""
    fake = folder / "fake-mpiexec"
    fake.write_text(f"#!/bin/sh\ntouch {folder / STARTED}\nexit 99\n")
    fake.chmod(0o755)
    return fake


def refused_before_mpi(argv: list[str], folder: Path,
                       timeout: float = 60) -> subprocess.CompletedProcess[str]:
    """:func:`run_minipar` with mpiexec replaced by :func:`fake_mpiexec`: asserts exit 2,
    one line on stderr, no traceback, nothing on stdout and mpiexec never started; returns
    the process (its one line: ``proc.stderr.strip()``)."""
    proc = run_minipar(*argv, env={launch.MPIEXEC_VAR: str(fake_mpiexec(folder))},
                       timeout=timeout)
    lines = proc.stderr.strip().splitlines()
    assert proc.returncode == 2, proc.stderr
    assert len(lines) == 1 and "Traceback" not in proc.stderr, proc.stderr
    assert proc.stdout == "", proc.stdout
    assert not (folder / STARTED).exists(), "mpiexec was started for a bad option"
    return proc


def failed(report) -> list:
    """The checks of a grading report (minipar.exercises.grading) that failed."""
    return [c for c in report.checks if c.ok is False]


def assert_caught(report, check_name: str, words: list[str]) -> None:
    """A wrong solution's report: FAIL, and a failed check whose name holds ``check_name``
    and whose detail says every one of ``words``."""
    assert not report.passed and report.verdict.startswith("FAIL"), report.text()
    hits = [c for c in failed(report) if check_name in c.name]
    assert hits, report.text()
    for w in words:
        assert w in hits[0].detail, report.text()


@pytest.fixture
def mpi_dir() -> Path:
    return MPI_DIR
