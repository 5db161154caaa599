"""Drills: whatever ends the ``minipar`` process, its launch ends with it.

SIGHUP (a closed terminal) is handled like SIGTERM: the launcher stops its
ranks, removes its folder and exits 129.  SIGKILL (``kill -9``, a crash)
gives the launcher no chance: the ranks see their connection to it end and a
reaper kills mpiexec, its hydra proxy and every rank, then removes the
launch's folder (:func:`minipar.launch.rank.watch_launcher`).  Each drill
waits on events (the ranks' notes exist; the processes are gone), with
deadlines, never on a fixed sleep, and is repeated to show it holds every time.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from minipar.launch.failure import MPIEXEC_PID, RANKS_DIR

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"),
                                reason="reads /proc; signals to a child need POSIX")

N = 4
START_DEADLINE_S = 90.0  # four ranks starting on a loaded machine
GONE_DEADLINE_S = 10.0
REPEATS = 3
TINY = ["--layers", "1", "--d-model", "8", "--heads", "2", "--batch", "4", "--seq", "4"]
#: 1.8 MB of gradients (Ψ = 226,560, float64): a survivor's message to the killed rank can be
#: in flight (MPICH copies large ones from the sender's memory, CMA) and fail on its own
LARGE = ["--layers", "2", "--d-model", "96", "--heads", "2", "--batch", "4", "--seq", "8"]


def _running(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] not in ("Z", "X")  # a zombie has ended
    except FileNotFoundError:
        return False


def _parent(pid: int) -> int | None:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return int(f.read().rsplit(")", 1)[1].split()[1])
    except (FileNotFoundError, ValueError):
        return None


def _poll(condition, deadline_s: float) -> bool:
    deadline = time.monotonic() + deadline_s
    while not condition():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.05)
    return True


def _start(parent_tmp: Path, model: list[str] = TINY
           ) -> tuple[subprocess.Popen[str], Path, set[int], set[str]]:
    """``minipar run dp -n 4`` with an endless run; returns it once all 4 ranks are noted,
    with its launch folder, the processes to end (mpiexec, the hydra proxy, the ranks) and
    MPICH's hardware-map files (``/tmp/hydra_hwloc_xmlfile_*``) to be removed."""
    env = {**os.environ, "TMPDIR": str(parent_tmp)}
    proc = subprocess.Popen([sys.executable, "-m", "minipar.cli", "run", "dp", "-n", str(N),
                             "--steps", "1000000", "--timeout", "600", *model],
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                            env=env)

    def noted() -> list[Path]:
        return [f for d in parent_tmp.glob("minipar-launch-*")
                for f in (d / RANKS_DIR).glob("*.json")]

    def records() -> list[dict]:
        out = []
        for f in noted():
            with contextlib.suppress(OSError, ValueError):  # replaced as it is read
                out.append(json.loads(f.read_text()))
        return out

    # every rank noted, past MPI_Init (its note then names MPICH's hardware map)
    if not _poll(lambda: sum(bool(r["hwloc"]) for r in records()) == N and proc.poll() is None,
                 START_DEADLINE_S):
        proc.kill()
        _, err = proc.communicate()
        pytest.fail(f"{N} ranks not noted within {START_DEADLINE_S:g} s: {err[-2000:]}")
    (folder,) = parent_tmp.glob("minipar-launch-*")
    ranks = {r["pid"] for r in records()}
    hwloc = {f for r in records() for f in r["hwloc"]}
    mpiexec = int((folder / MPIEXEC_PID).read_text())
    proxies = {_parent(p) for p in ranks} - {None}
    assert all(_parent(p) == mpiexec for p in proxies), "ranks should be mpiexec's grandchildren"
    return proc, folder, ranks | proxies | {mpiexec}, hwloc


def _drill(sig: int, parent_tmp: Path) -> list[float]:
    """Signal the launcher REPEATS times; the seconds until nothing was left, each time."""
    took = []
    for _ in range(REPEATS):
        proc, folder, pids, hwloc = _start(parent_tmp)
        assert all(map(_running, pids))
        t0 = time.monotonic()
        proc.send_signal(sig)
        gone = _poll(lambda pids=pids, folder=folder: not any(map(_running, pids))
                     and not folder.exists(), GONE_DEADLINE_S)
        took.append(time.monotonic() - t0)
        left = [p for p in pids if _running(p)]
        for p in left:  # so that a failure here does not slow the tests that follow
            with contextlib.suppress(OSError):
                os.kill(p, signal.SIGKILL)
        _, err = proc.communicate(timeout=60)
        assert gone, (f"after {signal.Signals(sig).name} to minipar: still running {left}, "
                      f"folder left: {folder.exists()}")
        assert list(parent_tmp.iterdir()) == []
        assert [f for f in hwloc if os.path.exists(f)] == []
        if sig == signal.SIGHUP:
            assert proc.returncode == 129 and err.splitlines()[-1:] == ["minipar: hung up"], err
            assert "Traceback" not in err
        else:
            assert proc.returncode == -sig
    return took


@pytest.fixture
def parent_tmp(tmp_path: Path) -> Path:
    parent = tmp_path / "parent-tmp"
    parent.mkdir()
    return parent


def test_sighup_to_minipar_ends_every_rank_and_removes_its_folder(parent_tmp: Path) -> None:
    """A closed terminal: the launcher handles SIGHUP as SIGTERM, stops its ranks, exits 129."""
    took = _drill(signal.SIGHUP, parent_tmp)
    print(f"SIGHUP: all gone after {', '.join(f'{t:.2f}' for t in took)} s")


def test_sigkill_to_minipar_ends_every_rank_and_removes_its_folder(parent_tmp: Path) -> None:
    """``kill -9`` of the launcher: no handler runs, yet mpiexec, the proxy and every rank
    end, and the launch's folder is removed, by the ranks' reaper."""
    took = _drill(signal.SIGKILL, parent_tmp)
    print(f"SIGKILL: all gone after {', '.join(f'{t:.2f}' for t in took)} s")


def test_sigkill_of_one_rank_names_that_rank_every_time(parent_tmp: Path) -> None:
    """``kill -9`` of one rank (each of ranks 1, 2, 3 in turn, then again): the job ends by
    itself and its one line names the killed rank, never a survivor whose MPI call failed
    after it (1 in 4 CLI kills blamed a survivor before the exit order decided; not seen
    again here with that rule undone, 12 of 12 right under load: a regression drill, and
    ``test_launch.py``'s captured output is the test that failed before)."""
    took = []
    for victim_rank in (1, 2, 3) * 2:
        proc, folder, pids, _ = _start(parent_tmp, LARGE)
        notes = [json.loads(f.read_text()) for f in (folder / RANKS_DIR).glob("*.json")]
        victim = next(r for r in notes if r["rank"] == victim_rank)
        t0 = time.monotonic()
        os.kill(victim["pid"], signal.SIGKILL)
        try:
            _, err = proc.communicate(timeout=60)
        finally:
            if proc.poll() is None:
                proc.kill()
        took.append(time.monotonic() - t0)
        assert proc.returncode == 1, err
        assert err.splitlines() == [
            f"[minipar] rank {victim_rank} of {N} (pid {victim['pid']} on {victim['host']}) was "
            "killed by signal 9 (SIGKILL): out of memory (the kernel's OOM killer sends SIGKILL) "
            "or killed from outside (--debug shows every rank's output)"], err
        assert _poll(lambda pids=pids: not any(map(_running, pids)), GONE_DEADLINE_S)
        assert list(parent_tmp.iterdir()) == []
    print(f"rank SIGKILL: right rank named 6 of 6, job ended after "
          f"{', '.join(f'{t:.2f}' for t in took)} s")
