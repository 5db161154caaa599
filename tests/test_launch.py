"""minipar.launch: more ranks than cores, one JSON result, a failure in one line, and a
launch that leaves nothing behind (no rank, no temporary file) whatever happened."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path

import pytest

from minipar import launch

MPI_DIR = Path(__file__).parent / "mpi"
PROBE = str(MPI_DIR / "launch_probe.py")


def test_more_ranks_than_cores() -> None:
    n = 8  # the CI machine has 2 cores
    proc = launch.run(n, str(MPI_DIR / "comm_hello.py"), timeout=90)
    assert proc.returncode == 0 and proc.failure is None, proc.stderr[-3000:]
    lines = sorted(ln for ln in proc.stdout.splitlines() if ln.startswith("hello"))
    assert lines == sorted(
        f"hello from rank {r} of {n}, left neighbour {(r - 1) % n}" for r in range(n))


def test_run_json_returns_what_rank_0_served() -> None:
    data, proc = launch.run_json(3, "minipar.demo", {"elems": 6}, timeout=60)
    assert proc.returncode == 0 and data["ranks"] == 3 and data["elems"] == 6
    assert sum(ln.startswith(launch.RESULT_PREFIX) for ln in proc.stdout.splitlines()) == 1
    assert launch.is_worker(["--worker", "{}"]) and not launch.is_worker(["--json"])


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            state = f.read().rsplit(")", 1)[1].split()[0]
    except FileNotFoundError:
        return False
    return state not in ("Z", "X")  # a zombie has already exited


def _wait_gone(pids: set[int]) -> list[int]:
    deadline = time.monotonic() + 10
    while any(_alive(p) for p in pids) and time.monotonic() < deadline:
        time.sleep(0.1)
    return [p for p in pids if _alive(p)]


def test_timeout_kills_every_rank(tmp_path: Path) -> None:
    with pytest.raises(launch.LaunchTimeout) as info:
        launch.run(4, str(MPI_DIR / "comm_sleep.py"), str(tmp_path), timeout=6)
    assert "did not finish within 6 s" in str(info.value)
    pids = set()
    for f in tmp_path.glob("pid.*"):
        pids.update(int(p) for p in f.read_text().split())
    assert len(list(tmp_path.glob("pid.*"))) == 4, "every rank should have started"
    assert not _wait_gone(pids), "processes left running after LaunchTimeout"
    assert os.getpid() not in pids


@pytest.fixture
def parent_tmp(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """An empty folder as this process's (and the ranks') parent temporary folder."""
    parent = tmp_path / "parent-tmp"
    parent.mkdir()
    monkeypatch.setenv("TMPDIR", str(parent))
    monkeypatch.setattr(tempfile, "tempdir", str(parent))
    return parent


@pytest.mark.parametrize("mode", ["raise", "sleep"])
def test_a_failed_or_timed_out_launch_leaves_no_file(mode: str, parent_tmp: Path,
                                                     tmp_path: Path) -> None:
    """The ranks' own temporary files and MPICH's /tmp/hydra_hwloc_xmlfile_* are gone."""
    out = tmp_path / "out"
    out.mkdir()
    if mode == "sleep":
        with pytest.raises(launch.LaunchTimeout):
            launch.run(3, PROBE, mode, str(out), timeout=6)
    else:
        assert launch.run(3, PROBE, mode, str(out), timeout=60).returncode != 0
    noted = [f for p in out.glob("left.*") for f in p.read_text().split()]
    assert len(list(out.glob("left.*"))) == 3, "every rank should have noted its files"
    assert all(not f.startswith(str(parent_tmp)) or "minipar-launch-" in f for f in noted)
    if sys.platform == "linux":
        assert any(f.startswith("/tmp/hydra_hwloc_xmlfile_") for f in noted), noted
    assert [f for f in noted if os.path.exists(f)] == []
    assert list(parent_tmp.iterdir()) == []


@pytest.mark.parametrize("mode,expected", [
    ("raise", "[minipar] rank 1 of 3 failed: RuntimeError: deliberate failure on rank 1"),
    ("kill", "[minipar] rank 1 of 3 (pid "),
    ("exit", "[minipar] rank 1 ended the job with exit status 3 (MPI_Abort)"),
])
def test_a_failed_rank_is_named_in_one_line(mode: str, expected: str, tmp_path: Path) -> None:
    proc = launch.run(3, PROBE, mode, str(tmp_path), timeout=60)
    assert proc.returncode != 0
    assert proc.failure.startswith(expected) and "\n" not in proc.failure, proc.failure
    if mode == "kill":
        assert "killed by signal 9 (SIGKILL)" in proc.failure


def test_run_json_check_raises_the_one_line() -> None:
    one_line = r"^\[minipar\] rank \d of 2 failed: KeyError: 'elems'$"
    with pytest.raises(launch.RanksFailed, match=one_line):
        launch.run_json(2, "minipar.demo", {}, check=True, timeout=60)


def test_ctrl_c_kills_every_rank_and_reraises(parent_tmp: Path, tmp_path: Path) -> None:
    code = textwrap.dedent(f"""
        import sys
        from minipar import launch
        try:
            launch.run(3, {str(MPI_DIR / 'comm_sleep.py')!r}, {str(tmp_path)!r}, timeout=90)
        except KeyboardInterrupt:
            print("KeyboardInterrupt re-raised", flush=True)
            sys.exit(130)
    """)
    child = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 60
    while len(list(tmp_path.glob("pid.*"))) < 3 and time.monotonic() < deadline:
        time.sleep(0.1)
    pids = {int(p) for f in tmp_path.glob("pid.*") for p in f.read_text().split()}
    child.send_signal(signal.SIGINT)  # what Ctrl-C sends to the launcher's process group
    out, _ = child.communicate(timeout=30)
    assert child.returncode == 130 and "KeyboardInterrupt re-raised" in out
    assert len(list(tmp_path.glob("pid.*"))) == 3, "every rank should have started"
    assert not _wait_gone(pids), "processes left running after Ctrl-C"
    assert list(parent_tmp.iterdir()) == []


def test_another_mpiexec_and_its_arguments(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """MINIPAR_MPIEXEC names the launcher (here a wrapper that logs its command line),
    MINIPAR_MPIEXEC_ARGS adds options; --hostfile passes through."""
    log = tmp_path / "mpiexec.log"
    wrapper = tmp_path / "my-mpiexec"
    wrapper.write_text(f'#!/bin/sh\necho "$@" > {log}\nexec {launch.find_mpiexec()} "$@"\n')
    wrapper.chmod(0o755)
    hosts = tmp_path / "hosts"
    hosts.write_text("localhost\n")
    monkeypatch.setenv(launch.MPIEXEC_VAR, str(wrapper))
    monkeypatch.setenv(launch.MPIEXEC_ARGS_VAR, "-genv MINIPAR_PROBE from-args")
    proc = launch.run(2, PROBE, "ok", str(tmp_path), timeout=60, hostfile=hosts)
    assert proc.returncode == 0, proc.stderr
    for r in (0, 1):  # (two ranks' lines may interleave mid-line)
        assert proc.stdout.count(f"rank {r} MINIPAR_PROBE=from-args") == 1, proc.stdout
    assert log.read_text().startswith(f"-genv MINIPAR_PROBE from-args -hostfile {hosts} -n 2 ")


def test_bad_rank_count_timeout_or_hostfile_is_a_value_error() -> None:
    with pytest.raises(ValueError, match="positive integer"):
        launch.run(0, str(MPI_DIR / "comm_hello.py"))
    with pytest.raises(ValueError, match="timeout must be > 0"):
        launch.run(1, str(MPI_DIR / "comm_hello.py"), timeout=0)
    with pytest.raises(ValueError, match="no such file"):
        launch.run(1, str(MPI_DIR / "comm_hello.py"), hostfile="/no/such/hostfile")
