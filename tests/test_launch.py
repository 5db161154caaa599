"""minipar.launch: more ranks than cores, one JSON result, a failure in one line, whole
lines from every rank, and a launch that leaves nothing behind (no rank, no temporary
file) whatever happened: a timeout, Ctrl-C, or SIGTERM."""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path

import pytest

from minipar import launch
from minipar.cli.options import Terminated
from minipar.launch import failure

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
    data, proc = launch.run_json(3, "minipar.cli.demo", {"elems": 6}, timeout=60)
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


def _kill(pids: list[int]) -> None:
    for pid in pids:
        with contextlib.suppress(OSError):
            os.kill(pid, signal.SIGKILL)


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
        launch.run_json(2, "minipar.cli.demo", {}, check=True, timeout=60)


@pytest.mark.parametrize("sig,name", [(signal.SIGINT, "KeyboardInterrupt"),
                                      (signal.SIGTERM, "Terminated")])
def test_ctrl_c_or_sigterm_kills_every_rank_and_reraises(sig: int, name: str, parent_tmp: Path,
                                                         tmp_path: Path) -> None:
    """SIGINT is what Ctrl-C sends; SIGTERM what `kill`, `timeout` and schedulers send: a
    program that does not handle SIGTERM itself gets Terminated (a KeyboardInterrupt)."""
    code = textwrap.dedent(f"""
        import signal, sys
        from minipar import launch
        try:
            launch.run(3, {str(MPI_DIR / 'comm_sleep.py')!r}, {str(tmp_path)!r}, timeout=90)
        except KeyboardInterrupt as e:
            restored = signal.getsignal(signal.SIGTERM) == signal.SIG_DFL
            print(type(e).__name__, "re-raised; SIGTERM restored:", restored, flush=True)
            sys.exit(130)
    """)
    child = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 60
    while len(list(tmp_path.glob("pid.*"))) < 3 and time.monotonic() < deadline:
        time.sleep(0.1)
    pids = {int(p) for f in tmp_path.glob("pid.*") for p in f.read_text().split()}
    child.send_signal(sig)
    out, _ = child.communicate(timeout=30)
    left = _wait_gone(pids)
    _kill(left)  # so that a failure here does not slow down the tests that follow
    assert child.returncode == 130 and f"{name} re-raised; SIGTERM restored: True" in out
    assert len(list(tmp_path.glob("pid.*"))) == 3, "every rank should have started"
    assert not left, f"processes left running after {signal.Signals(sig).name}"
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
    assert sorted(proc.stdout.splitlines()) == [f"rank {r} MINIPAR_PROBE=from-args"
                                                for r in (0, 1)], proc.stdout
    assert log.read_text().startswith(f"-genv MINIPAR_PROBE from-args -hostfile {hosts} -n 2 ")


def test_bad_rank_count_timeout_or_hostfile_is_a_value_error() -> None:
    with pytest.raises(ValueError, match="positive integer"):
        launch.run(0, str(MPI_DIR / "comm_hello.py"))
    for timeout in (0, -1, float("nan"), 3e6, 1e10):  # past ~2.1e6 s the OS's wait overflows
        with pytest.raises(ValueError, match=r"timeout must be a number of seconds > 0 and at "
                                             r"most 1e6 \(11.6 days\)"):
            launch.run(1, str(MPI_DIR / "comm_hello.py"), timeout=timeout)
    with pytest.raises(ValueError, match="no such file"):
        launch.run(1, str(MPI_DIR / "comm_hello.py"), hostfile="/no/such/hostfile")


# -- SIGTERM to `minipar run`: every process of the launch and every file gone -------------
def _launch_processes(rank_pids: list[int]) -> dict[int, str]:
    """The ranks, their parents (MPICH's hydra_pmi_proxy) and grandparents (mpiexec):
    {pid: program name}."""
    found = {}
    for pid in rank_pids:
        for _ in range(3):
            with open(f"/proc/{pid}/stat") as f:
                name, rest = f.read().split("(", 1)[1].rsplit(")", 1)
            found[pid] = name
            pid = int(rest.split()[1])  # the parent
    return found


@pytest.mark.skipif(sys.platform != "linux", reason="reads /proc")
def test_sigterm_to_minipar_run_stops_every_rank_in_one_line(parent_tmp: Path) -> None:
    """`timeout 3 minipar run dp ...` used to exit 143 silently, leaving mpiexec, its proxy,
    both ranks, the launch's folder and MPICH's /tmp/hydra_hwloc_xmlfile_* behind."""
    child = subprocess.Popen([sys.executable, "-m", "minipar.cli", "run", "dp", "-n", "2",
                              "--steps", "100000"], stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, text=True,
                             env={**os.environ, "TMPDIR": str(parent_tmp)})
    procs: dict[int, str] = {}
    notes: list[dict] = []
    try:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and child.poll() is None:
            notes = []  # both ranks past MPI_Init: their hardware-map file noted
            for f in parent_tmp.glob(f"minipar-launch-*/{failure.RANKS_DIR}/*.json"):
                try:
                    notes.append(json.loads(f.read_text()))
                except (OSError, ValueError):
                    pass
            if len(notes) == 2 and all(n["hwloc"] for n in notes):
                break
            time.sleep(0.1)
        assert len(notes) == 2 and child.poll() is None, notes
        procs = _launch_processes([n["pid"] for n in notes])
        assert {"mpiexec", "hydra_pmi_proxy"} < set(procs.values()), procs
        hwloc = {f for n in notes for f in n["hwloc"]}
        child.send_signal(signal.SIGTERM)
        out, err = child.communicate(timeout=30)
    finally:  # whatever failed above: leave no process behind for the tests that follow
        if child.poll() is None:
            _kill([child.pid, *procs, *(n["pid"] for n in notes)])
        child.wait()
    left = _wait_gone(set(procs))
    _kill(left)  # the bug this test is for: do not leave it running
    assert (child.returncode, err, out) == (143, "minipar: terminated\n", "")
    assert not left, f"processes of the launch left running after SIGTERM: {procs}"
    assert [f for f in hwloc if os.path.exists(f)] == []
    assert list(parent_tmp.iterdir()) == []


# -- a failure in one line: the cause, not the last of MPI's messages -------------------
#: recorded: `minipar run dp --hostfile H`, H listing `nosuchhost`
HOSTS_STDERR = (
    "ssh: Could not resolve hostname nosuchhost: Name or service not known\n"
    "[mpiexec@vm] ui_cmd_cb (/mpich-5.0.2/src/pm/hydra/mpiexec/pmiserv_pmci.c:51): Launch "
    "proxy failed.\n"
    "[mpiexec@vm] HYDT_dmxu_poll_wait_for_event (/mpich-5.0.2/src/pm/hydra/lib/tools/demux/"
    "demux_poll.c:76): callback returned error status\n"
    "[mpiexec@vm] HYD_pmci_wait_for_completion (/mpich-5.0.2/src/pm/hydra/mpiexec/"
    "pmiserv_pmci.c:180): error waiting for event\n"
    "[mpiexec@vm] main (/mpich-5.0.2/src/pm/hydra/mpiexec/mpiexec.c:270): process manager "
    "error waiting for completion\n")
#: recorded: MINIPAR_MPIEXEC_ARGS=--bogus
BOGUS_STDERR = (
    "[mpiexec@vm] match_arg (/mpich-5.0.2/src/pm/hydra/lib/utils/args.c:166): unrecognized "
    "argument bogus\n"
    "[mpiexec@vm] HYDU_parse_array (/mpich-5.0.2/src/pm/hydra/lib/utils/args.c:181): argument "
    "matching returned error\n"
    "[mpiexec@vm] parse_args (/mpich-5.0.2/src/pm/hydra/mpiexec/get_parameters.c:318): error "
    "parsing input array\n"
    "[mpiexec@vm] HYD_uii_mpx_get_parameters (/mpich-5.0.2/src/pm/hydra/mpiexec/"
    "get_parameters.c:48): unable to parse user arguments\n"
    "[mpiexec@vm] main (/mpich-5.0.2/src/pm/hydra/mpiexec/mpiexec.c:49): error parsing "
    "parameters\n")


@pytest.mark.parametrize("stderr,cause", [
    (HOSTS_STDERR, "ssh: Could not resolve hostname nosuchhost: Name or service not known"),
    (BOGUS_STDERR, "unrecognized argument bogus"),
    ("=" * 40 + "\nmpirun was unable to launch the specified application\n",
     "mpirun was unable to launch the specified application"),
    ("", ""),
], ids=["unknown-host", "bad-mpiexec-option", "a-rule-first", "silent"])
def test_a_start_up_failure_is_named_by_its_cause(stderr: str, cause: str) -> None:
    said = f": {cause}" if cause else ""
    assert failure.describe(255, "", stderr, {}, []) == f"[minipar] mpiexec failed (exit 255){said}"
    ran = {7: {"pid": 7, "rank": 0, "size": 2, "host": "vm", "done": True}}
    assert failure.describe(255, "rank 0 printed this\n", stderr, ran, [7]) == (
        f"[minipar] the ranks failed (exit 255){said}")


def test_a_rank_that_ended_early_without_a_message_is_named() -> None:
    """os._exit(3) on rank 1: MPICH prints nothing; the exit order names the rank."""
    ranks = {11: {"pid": 11, "rank": 0, "size": 2, "host": "vm", "done": False},
             12: {"pid": 12, "rank": 1, "size": 2, "host": "vm", "done": False}}
    line = failure.describe(3, "rank 1 says hello\nrank 0 says hello\n", "", ranks, [12, 11])
    assert line == ("[minipar] rank 1 of 2 (pid 12 on vm) ended before finishing, with no "
                    "error message (mpiexec exit status 3)")



def test_a_rank_that_ended_the_job_is_named_when_its_output_was_lost() -> None:
    """CI, under load: rank 1's sys.exit(3) became MPI_Abort(3), and the job was killed before
    MPICH's "Abort(3) ... (rank 1 in comm 0)" or the rank's own line were forwarded (stdout
    and stderr empty).  The rank noted how it ended in its record first."""
    def ranks(**how: object) -> dict:
        return {11: {"pid": 11, "rank": 0, "size": 3, "host": "vm", "done": False},
                12: {"pid": 12, "rank": 1, "size": 3, "host": "vm", "done": False, **how}}
    assert failure.describe(3, "", "", ranks(aborted=3), [12, 11]) == (
        "[minipar] rank 1 ended the job with exit status 3 (MPI_Abort)")
    line = "[minipar] rank 1 of 3 failed: RuntimeError: deliberate failure on rank 1"
    assert failure.describe(1, "", "", ranks(raised=line), []) == line

#: what MPICH printed when rank 1 of 4 was killed by SIGKILL mid-step and rank 3, whose
#: message from rank 1 was being copied (CMA), got an MPI error and raised (seen 1 in 4
#: runs of tests/test_drills.py's CLI drill, before describe() read the exit order first)
KILLED_STDOUT = (
    "=" * 80 + "\n=   BAD TERMINATION OF ONE OF YOUR APPLICATION PROCESSES\n=   PID 326 RUNNING "
    "AT vm\n=   EXIT CODE: 9\n=   CLEANING UP REMAINING PROCESSES\n" + "=" * 80 + "\n"
    "YOUR APPLICATION TERMINATED WITH THE EXIT STRING: Killed (signal 9)\n")
SURVIVOR_STDERR = (
    "[minipar] rank 3 of 4 failed: Exception: Other MPI error, error stack:\n"
    "internal_Test(109).....: MPI_Test(request=0x7f10, flag=0x7ffc, status=0x7f10) failed\n"
    "copy_iovs(224).........: process_vm_readv failed (errno 3)\n")


def test_a_rank_killed_first_is_named_not_the_survivor_whose_mpi_call_failed() -> None:
    """The exit order decides: the rank that ended first was killed, and a survivor's MPI
    error (raised, then MPI_Abort) came after it; had the survivor ended first, its error
    would be the cause."""
    ranks = {p: {"pid": p, "rank": r, "size": 4, "host": "vm", "done": False}
             for r, p in enumerate((324, 325, 326, 327))}
    aborted = SURVIVOR_STDERR + "Abort(1) on node 3 (rank 3 in comm 0): application called\n"
    for stderr in (SURVIVOR_STDERR, aborted):
        assert failure.describe(9, KILLED_STDOUT, stderr, ranks, [325, 327, 324, 326]) == (
            "[minipar] rank 1 of 4 (pid 325 on vm) was killed by signal 9 (SIGKILL): out of "
            "memory (the kernel's OOM killer sends SIGKILL) or killed from outside")
        assert failure.describe(9, KILLED_STDOUT, stderr, ranks, [327, 325, 324, 326]) == (
            "[minipar] rank 3 of 4 failed: Exception: Other MPI error, error stack:")
    only_abort = "Abort(1) on node 3 (rank 3 in comm 0): application called\n"
    assert failure.describe(9, KILLED_STDOUT, only_abort, ranks, [325, 327]).startswith(
        "[minipar] rank 1 of 4 (pid 325 on vm) was killed by signal 9")
    assert failure.describe(9, KILLED_STDOUT, only_abort, ranks, [327, 325]) == (
        "[minipar] rank 3 ended the job with exit status 1 (MPI_Abort)")


def test_a_wrong_mpiexec_option_is_named_by_a_real_launch(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(launch.MPIEXEC_ARGS_VAR, "--bogus")
    proc = launch.run(2, str(MPI_DIR / "comm_hello.py"), timeout=60)
    assert proc.returncode != 0
    assert proc.failure == (f"[minipar] mpiexec failed (exit {proc.returncode}): unrecognized "
                            "argument bogus"), proc.failure


def test_mpiexec_that_cannot_start_is_a_launch_error(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(launch.MPIEXEC_VAR, "/nonexistent/mpiexec")
    with pytest.raises(launch.LaunchError, match=r"^cannot start '/nonexistent/mpiexec', named "
                                                 r"by MINIPAR_MPIEXEC: No such file"):
        launch.run(2, str(MPI_DIR / "comm_hello.py"), timeout=60)
    monkeypatch.setenv(launch.MPIEXEC_VAR, 'mpiexec "-n')
    with pytest.raises(launch.LaunchError, match="MINIPAR_MPIEXEC=.* cannot be split"):
        launch.run(2, str(MPI_DIR / "comm_hello.py"), timeout=60)
    assert issubclass(launch.LaunchTimeout, launch.LaunchError)  # one `except` for a command
    assert issubclass(launch.RanksFailed, launch.LaunchError)
    assert issubclass(Terminated, KeyboardInterrupt)


# -- whole lines: ranks printing at the same time do not mix inside a line -------------
LINE = re.compile(r"^rank (\d+) of (\d+) line (\d+) payload (?:abcdefghij)* end$")


def test_lines_of_many_ranks_stay_whole() -> None:
    """8 ranks print 1000 lines each, every print in pieces; PYTHONUNBUFFERED=1 in the
    environment (as many containers set it) must not split them either."""
    n, count = 8, 1000
    proc = launch.run(n, str(MPI_DIR / "launch_lines.py"), str(count), "ok", timeout=120,
                      env={"PYTHONUNBUFFERED": "1"})
    assert proc.returncode == 0, proc.stderr[-2000:]
    lines = proc.stdout.splitlines()
    broken = [ln for ln in lines if not LINE.match(ln)]
    assert broken == [], f"{len(broken)} broken lines, e.g. {broken[:3]}"
    seen = sorted((int(m[1]), int(m[3])) for m in map(LINE.match, lines))
    assert seen == [(r, i) for r in range(n) for i in range(count)]


def test_output_before_a_crash_is_kept_whole() -> None:
    """Rank 1 raises after printing, its last text still without a newline: MPI_Abort
    ends the job, and nothing printed before is lost or broken."""
    n, count = 4, 200
    proc = launch.run(n, str(MPI_DIR / "launch_lines.py"), str(count), "crash", timeout=60)
    assert proc.returncode != 0
    assert proc.failure == ("[minipar] rank 1 of 4 failed: RuntimeError: deliberate failure "
                            "after printing"), proc.failure
    assert "last words of rank 1" in proc.stdout
    complete = [ln for ln in proc.stdout.splitlines() if "last words" not in ln]
    assert [ln for ln in complete if not LINE.match(ln)] == []
    assert len(complete) == n * count
