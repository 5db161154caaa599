"""Runs across hosts, tried on one machine: a cluster of network namespaces (issue 38).

The cluster (tests/cluster.py): two hosts of two ranks, each host a network namespace with
its own hostname, processes and ``/tmp``, joined by a bridge to a login namespace where
``minipar`` runs; MPICH's process manager reaches the hosts through ``-launcher ssh
-launcher-exec``.  Skipped, with the one-line reason, where the machine refuses namespaces.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import time
from pathlib import Path

import pytest
from cluster import Cluster, refusal, running

from minipar.launch.failure import MPIEXEC_PID
from minipar.parallel import checkpoint
from minipar.parallel.checkpoint import MANIFEST, step_dir

REFUSED = refusal()

#: one model every layout here can cut (hybrid's own defaults differ: given in full)
TINY = ["--layers", "1", "--d-model", "8", "--heads", "2", "--batch", "8", "--vocab", "8",
        "--seq", "4"]


@pytest.fixture(scope="module")
def cluster():
    """Two hosts of two ranks; every test that uses it is skipped, with the one-line reason,
    where the machine cannot host it."""
    if REFUSED is not None:
        pytest.skip(REFUSED)
    c = Cluster(hosts=2, slots=2)
    try:
        yield c
    finally:
        c.close()
    assert c.gone() == [], f"the cluster left {c.gone()}"


def test_a_machine_that_cannot_host_the_cluster_says_why_in_one_line(
        monkeypatch: pytest.MonkeyPatch) -> None:
    import cluster as simulated

    monkeypatch.setattr(simulated.os, "geteuid", lambda: 1000)
    assert simulated.refusal() == "a simulated cluster needs root (ip netns add)"
    monkeypatch.setattr(simulated.sys, "platform", "darwin")
    assert simulated.refusal() == "a simulated cluster needs Linux network namespaces"


def across(cluster: Cluster, *argv: str) -> dict:
    """``minipar run ARGV -n 4 --json`` on the cluster's two hosts: its summary, after
    asserting it succeeded with nothing but the JSON on stdout and left nothing on a host."""
    proc = cluster.minipar("run", *argv, "-n", "4", "--hostfile", str(cluster.hostfile),
                           *TINY, "--json", "--timeout", "100")
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    summary = json.loads(proc.stdout)  # the JSON and nothing else
    assert cluster.wait_empty(10), cluster.leftovers()
    return summary


def test_a_run_across_two_hosts_equals_the_serial_run(cluster: Cluster) -> None:
    """Each host's ranks know they share it (MPI's shared-memory split): h1 holds ranks 0
    and 1, h2 ranks 2 and 3."""
    s = across(cluster, "dp", "--steps", "2")
    assert s["parity"] is True, s["verdict"]
    hosts = s["hosts"]
    assert hosts["names"] == ["h1", "h2"] and hosts["host_of_rank"] == [0, 0, 1, 1], hosts
    assert hosts["placement"] == ["h1: ranks 0, 1", "h2: ranks 2, 3",
                                  "no axis inside a host; across hosts: dp"], hosts


def test_a_checkpoint_saved_across_hosts_resumes_on_another_layout(cluster: Cluster) -> None:
    """ZeRO-3 on dp 4 saves into the shared folder (each rank its shard, from either host);
    hybrid dp 2 x tp 2, across the same hosts, resumes it, equal to the serial run resumed,
    its tensor-parallel pairs inside a host (Megatron's placement) and dp across hosts."""
    ck = str(cluster.shared / "ck")
    saved = across(cluster, "zero", "--stage", "3", "--steps", "2", "--save", ck)
    assert saved["parity"] is True, saved["verdict"]
    resumed = across(cluster, "hybrid", "--dp", "2", "--tp", "2", "--steps", "4",
                     "--resume", ck)
    assert resumed["start"] == 2 and resumed["parity"] is True, resumed["verdict"]
    hosts = resumed["hosts"]
    assert hosts["placement"] == ["h1: ranks 0, 1", "h2: ranks 2, 3",
                                  "inside a host: tp; across hosts: dp"], hosts
    for axes in hosts["bytes_by_axis_per_rank"]:
        assert axes["tp"]["inter"] == 0 < axes["tp"]["intra"], axes
        assert axes["dp"]["intra"] == 0 < axes["dp"]["inter"], axes


# ----------------------------------------------------------------------------- the drills
#: a run that would go on for ever, a checkpoint every step into the shared folder
ENDLESS = ["dp", "-n", "4", *TINY, "--steps", "1000000", "--save-every", "1",
           "--timeout", "300", "--debug"]
START_DEADLINE_S = 90.0  # four ranks starting on two hosts of a loaded machine
GONE_DEADLINE_S = 15.0
REPEATS = 3
SILENCE_S = "2"  # MINIPAR_HEARTBEAT_S of the drills: a host silent 2 s is lost


def _poll(condition, deadline_s: float) -> bool:
    end = time.monotonic() + deadline_s
    while not condition():
        if time.monotonic() > end:
            return False
        time.sleep(0.02)
    return True


def _ns_pid(pid: int) -> int:
    """A process's id inside its host (its pid namespace), as MPI and the rank see it."""
    status = Path(f"/proc/{pid}/status").read_text()
    return int(next(ln for ln in status.splitlines() if ln.startswith("NSpid:")).split()[-1])


def _rank_of(pid: int) -> int:
    env = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
    return int(next(e for e in env if e.startswith(b"PMI_RANK=")).split(b"=")[1])


class Drill:
    """``minipar run dp`` across the two hosts until stopped, saving every step; started
    once its first checkpoint is complete (every rank runs: the event to act on)."""

    def __init__(self, cluster: Cluster, tmp: Path, n: int) -> None:
        self.cluster, self.tmp = cluster, tmp / f"launcher-tmp-{n}"  # the launcher's own /tmp
        self.tmp.mkdir()
        self.ck = cluster.shared / f"ck-{tmp.name}-{n}"
        self.proc = cluster.start("run", *ENDLESS, "--hostfile", str(cluster.hostfile),
                                  "--save", str(self.ck),
                                  env={"MINIPAR_HEARTBEAT_S": SILENCE_S,
                                       "TMPDIR": str(self.tmp)})
        if not _poll(lambda: (step_dir(self.ck, 1) / MANIFEST).exists()
                     or self.proc.poll() is not None, START_DEADLINE_S):
            self.proc.kill()
        if self.proc.poll() is not None:
            out, err = self.proc.communicate()
            pytest.fail(f"the run did not start: {err[-3000:]}")
        (self.folder,) = self.tmp.glob("minipar-launch-*")
        self.mpiexec = int((self.folder / MPIEXEC_PID).read_text())
        self.ranks = {h: cluster.ranks(h) for h in cluster.names}
        assert [len(r) for r in self.ranks.values()] == [2, 2], self.ranks

    def end(self) -> tuple[int, str]:
        """Wait for minipar's end: its exit status and its stderr."""
        try:
            _, err = self.proc.communicate(timeout=120)
        finally:
            if self.proc.poll() is None:
                self.proc.kill()
                self.proc.communicate()
        return self.proc.returncode, err

    def nothing_left(self) -> None:
        """Nothing runs on any host, mpiexec is gone, the launcher's folder too, and the last
        complete checkpoint loads."""
        assert self.cluster.wait_empty(GONE_DEADLINE_S), self.cluster.leftovers()
        assert _poll(lambda: not running(self.mpiexec)  # a zombie has ended
                     and list(self.tmp.iterdir()) == [], GONE_DEADLINE_S), (
            list(self.tmp.iterdir()))
        latest = checkpoint.latest(self.ck)
        assert latest is not None
        meta, tensors = checkpoint.full_tensors(latest, "param")[1:]
        assert meta["step"] >= 1 and tensors, meta
        shutil.rmtree(self.ck)


def test_a_rank_killed_on_another_host_is_named_with_its_host(cluster: Cluster,
                                                               tmp_path: Path) -> None:
    """``kill -9`` of rank 3, 2, then 1 (on h2, h2, h1): the one line names the rank, its
    process id on that host and the host (MPICH alone said ``assert (!closed) failed``)."""
    took = []
    for i, victim_rank in enumerate((3, 2, 1)):
        d = Drill(cluster, tmp_path, i)
        host = "h2" if victim_rank >= 2 else "h1"
        victim = next(p for p in d.ranks[host] if _rank_of(p) == victim_rank)
        pid = _ns_pid(victim)
        t0 = time.monotonic()
        os.kill(victim, signal.SIGKILL)
        code, err = d.end()
        took.append(time.monotonic() - t0)
        assert code == 1 and err.splitlines()[-1] == (
            f"[minipar] rank {victim_rank} of 4 (pid {pid} on {host}) ended first, before "
            "finishing and without an error message: killed (kill -9, the kernel's OOM killer), "
            "crashed or exited early"), err
        d.nothing_left()
    print(f"remote rank SIGKILL: named, ended after {', '.join(f'{t:.2f}' for t in took)} s")


def test_a_rank_that_raises_on_another_host_is_named_by_its_own_line(cluster: Cluster) -> None:
    """Rank 2 (on h2) raises; its peers are then killed by MPI_Abort and end before it may:
    the line is still the raising rank's own (MPICH prints no bad termination for an
    abort, so the order of ends does not decide)."""
    script = Path(__file__).parent / "mpi" / "comm_raise.py"
    proc = cluster.python(f"from minipar import launch\np = launch.run(4, {str(script)!r}, "
                          f"timeout=60, hostfile={str(cluster.hostfile)!r})\nprint(p.failure)")
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.splitlines() == [
        "[minipar] rank 2 of 4 failed: RuntimeError: deliberate failure on one rank"], proc.stdout
    assert cluster.wait_empty(GONE_DEADLINE_S), cluster.leftovers()


def test_the_launcher_killed_outright_leaves_nothing_on_any_host(cluster: Cluster,
                                                                 tmp_path: Path) -> None:
    """``kill -9`` of minipar: its guard kills mpiexec and removes its folder; each remote
    rank sees its connection to the launcher end and ends itself and its host's proxy."""
    took = []
    for i in range(REPEATS):
        d = Drill(cluster, tmp_path, i)
        t0 = time.monotonic()
        d.proc.kill()
        code, _ = d.end()
        assert code == -signal.SIGKILL
        d.nothing_left()
        took.append(time.monotonic() - t0)
    print(f"launcher SIGKILL: nothing left after {', '.join(f'{t:.2f}' for t in took)} s")


def test_a_host_cut_off_ends_the_job_and_its_ranks_end_by_their_watchdog(
        cluster: Cluster, tmp_path: Path) -> None:
    """h2's link down: the launcher hears nothing from h2 for 2 s and stops the job, naming
    h2 and since when; h2's ranks, which nothing can reach, end by their own watchdog (the
    link stays down until they are gone, then it is restored for the next run)."""
    took = []
    for i in range(REPEATS):
        d = Drill(cluster, tmp_path, i)
        t0 = time.monotonic()
        cluster.cut("h2")
        try:
            code, err = d.end()
            took.append(time.monotonic() - t0)
            assert code == 1, err
            line = err.splitlines()[-1]
            assert re.fullmatch(
                r"\[minipar\] host h2 \(10\.254\.38\.12\) unreachable since \d\d:\d\d:\d\d UTC: "
                r"no heartbeat from its ranks 2, 3 for 2 s; the job was stopped, but what runs "
                r"there could not be killed from here: its ranks 2, 3 end by their own watchdog "
                r"after 2 s without the launcher",
                line), err
            assert cluster.wait_empty(GONE_DEADLINE_S), cluster.leftovers()  # link still down
        finally:
            cluster.restore("h2")
        d.nothing_left()
    print(f"h2 cut off: job ended after {', '.join(f'{t:.2f}' for t in took)} s")


def test_doctor_checks_every_host_of_a_hostfile(cluster: Cluster) -> None:
    """``minipar doctor --hostfile``: both hosts reached, the same install, a 1 MiB all-reduce
    right across them; a host that cannot be reached is named by the launch's one line."""
    proc = cluster.minipar("doctor", "--hostfile", str(cluster.hostfile), "--json")
    assert proc.returncode == 0, proc.stderr
    hosts = json.loads(proc.stdout)["hosts"]
    assert [f["host"] for f in hosts["reached"]] == ["h1", "h2"], hosts
    assert hosts["differ"] == [] and hosts["allreduce"]["ok"] is True, hosts
    assert hosts["allreduce"]["bytes"] == 2**20
    bad = cluster.shared / "bad-hosts"
    bad.write_text(cluster.hostfile.read_text() + "10.254.38.99:2\n")
    proc = cluster.minipar("doctor", "--hostfile", str(bad))
    assert proc.returncode == 0, proc.stderr
    line = next(ln for ln in proc.stdout.splitlines() if ln.startswith("hosts "))
    assert line.endswith("cannot run on them all: [minipar] mpiexec failed (exit 255): ssh: "
                         "Could not resolve hostname 10.254.38.99"), line
    assert cluster.wait_empty(GONE_DEADLINE_S), cluster.leftovers()
