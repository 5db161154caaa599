"""TracedComm: counters, the deadlock watchdog, and a failing rank ending the job.

Every run goes through minipar.launch.run with a timeout: if the watchdog or
the abort did not work, the launch would raise LaunchTimeout and the test fail.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from minipar import launch

MPI_DIR = Path(__file__).parent / "mpi"


@pytest.mark.parametrize("n", [1, 2, 4])
def test_counters_per_op_per_peer_split_reset(n: int) -> None:
    proc = launch.run(n, str(MPI_DIR / "comm_counters.py"), timeout=60)
    assert proc.returncode == 0, proc.stdout + proc.stderr[-3000:]
    assert f"COMM-COUNTERS-OK N={n}" in proc.stdout


def test_watchdog_names_rank_operation_peer_and_tag() -> None:
    # watchdog 2 s; the launch timeout (30 s) fails the test if it never fires
    proc = launch.run(2, str(MPI_DIR / "comm_deadlock.py"), timeout=30,
                      env={"MINIPAR_WATCHDOG_S": "2"})
    out = proc.stdout + proc.stderr
    assert proc.returncode != 0, out
    assert "DeadlockError" in out, out[-3000:]
    assert "operation 'exchange'" in out
    assert ("rank 0 (world rank 0)" in out) or ("rank 1 (world rank 1)" in out), out[-3000:]
    assert ("Recv from rank 1 (tag 7)" in out) or ("Recv from rank 0 (tag 7)" in out)
    assert "waited more than 2 s" in out
    assert "unreachable" not in out


def test_exception_on_one_rank_ends_the_job_naming_the_rank() -> None:
    # the other ranks wait on rank 2 with a 60 s watchdog: only the abort can end
    # the job before the 30 s launch timeout
    proc = launch.run(4, str(MPI_DIR / "comm_raise.py"), timeout=30,
                      env={"MINIPAR_WATCHDOG_S": "60"})
    out = proc.stdout + proc.stderr
    assert proc.returncode != 0, out
    assert "[minipar] rank 2 of 4 failed: RuntimeError: deliberate failure" in out, out[-3000:]
    assert "rank 2 in comm 0" in out  # MPICH's own abort line


def test_bench_wait_output_shape(capsys: pytest.CaptureFixture[str]) -> None:
    import json

    from minipar.bench import wait

    assert wait.main(["-n", "3", "--work", "2", "--repeat", "1", "--json"]) == 0
    res = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert res["ranks"] == 3 and res["work"] == 2
    for mode in ("mpi", "traced"):
        assert res[mode]["compute_wall_s"] > 0 and res[mode]["waiters_cpu_s"] >= 0
    assert res["alone_wall_s"] > 0
    assert "TracedComm polling (after)" in wait.format_table(res)
