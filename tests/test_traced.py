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


@pytest.mark.parametrize("n", [1, 2, 3, 4])
def test_names_shared_stats_free_traced_once_counted_once(n: int) -> None:
    """tests/mpi/comm_names.py: Split/Dup names and one Stats, bytes by communicator,
    Free, traced(plain) returning one wrapper, a request waited twice counted once."""
    proc = launch.run(n, str(MPI_DIR / "comm_names.py"), timeout=60,
                      env={"MINIPAR_WATCHDOG_S": "20"})
    assert proc.returncode == 0, proc.stdout + proc.stderr[-3000:]
    assert f"COMM-NAMES-OK N={n}" in proc.stdout


# -- in-process (one rank) ------------------------------------------------------------
#: where each public name of the communication layer lives (no re-exports between them)
HOMES = {"waiting": ["WATCHDOG_ENV", "POLL_MAX_ENV", "DEFAULT_WATCHDOG_S", "DEFAULT_POLL_MAX_S",
                     "SPIN_ENV", "YIELD_ENV", "SPIN_S", "NAP_MIN_S", "ANY_SOURCE", "ANY_TAG",
                     "TracedRequest"],
         "errors": ["DeadlockError", "CommUsageError", "CollectiveMismatchError",
                    "install_excepthook"],
         "stats": ["OpStats", "Stats"], "traced": ["TracedComm", "traced"],
         "staging": ["as_bytes", "outgoing", "incoming", "HostBuffers", "mpi_collective"]}
COMM_NAMES = ["CommUsageError", "DeadlockError", "OpStats", "Stats", "TracedComm",
              "TracedRequest", "install_excepthook"]


def test_every_name_in_one_home_and_every_file_short() -> None:
    import importlib

    import minipar.comm

    tr = importlib.import_module("minipar.comm.traced")
    assert minipar.comm.traced is tr  # the module: no function of the same name shadows it
    for home, names in HOMES.items():
        mod = importlib.import_module(f"minipar.comm.{home}")
        for name in names:
            assert hasattr(mod, name), (home, name)
    for name in COMM_NAMES:
        assert hasattr(minipar.comm, name), name
    for f in ("traced", "stats", "waiting", "errors", "tags", "staging"):
        lines = (Path(tr.__file__).parent / f"{f}.py").read_text().count("\n")
        assert lines <= 310, (f, lines)


def test_stats_by_operation_communicator_and_peer() -> None:
    from minipar.comm import Stats

    s = Stats()
    s.record_send("ring", "tp", 3, 100)
    s.record_send("ring", "dp", 5, 40)
    s.record_send("p2p", "tp", 3, 1)
    s.record_recv("ring", "tp", 2, 100)
    s.record_recv("ring", "dp", None, 7)  # source unknown: no peer entry
    s.record_call("ring", "tp", 0.5)
    assert s.bytes_sent() == 141 and s.bytes_sent("ring") == 140
    assert s.bytes_sent(comm="tp") == 101 and s.bytes_sent("ring", comm="dp") == 40
    assert s.bytes_sent_by_comm() == {"tp": 101, "dp": 40}
    assert s.bytes_recv_by_comm() == {"tp": 100, "dp": 7}
    assert s.msgs_sent("ring") == 2 and s.msgs_recv(comm="dp") == 1
    assert s.peers_sent("ring") == {3: 100, 5: 40} and s.peers_recv() == {2: 100}
    assert s.seconds("ring", comm="tp") == 0.5 and s.seconds(comm="dp") == 0.0
    d = s.as_dict()
    assert d["bytes_sent_by_comm"] == {"tp": 101, "dp": 40}
    assert d["comms"]["tp"]["ring"]["calls"] == 1 and d["ops"]["ring"]["bytes_sent"] == 140
    s.reset()
    assert s.bytes_sent() == 0 and s.bytes_sent_by_comm() == {} and s.peers_sent() == {}


class _SpyComm:
    """A one-rank communicator whose groups the test can see after TracedComm used them."""

    def __init__(self) -> None:
        from mpi4py import MPI

        self.groups: list = []
        self._world = MPI.COMM_WORLD

    def Get_group(self):
        g = self._world.Get_group()
        self.groups.append(g)
        return g

    def Get_rank(self) -> int:
        return 0

    def Get_size(self) -> int:
        return 1

    def Get_name(self) -> str:
        return "spy"


def test_groups_made_for_rank_translation_are_freed() -> None:
    from mpi4py import MPI

    from minipar.comm.traced import TracedComm, _world_ranks

    a, b = _SpyComm(), _SpyComm()
    assert _world_ranks(a, b) == [0]
    assert a.groups and b.groups and all(g == MPI.GROUP_NULL for g in a.groups + b.groups)
    c = _SpyComm()
    t = TracedComm(c)
    assert t.name == "spy" and t.world_ranks == [0]
    assert c.groups and all(g == MPI.GROUP_NULL for g in c.groups)


def test_traced_wraps_a_plain_communicator_once() -> None:
    import numpy as np
    from mpi4py import MPI

    import minipar.collectives as C
    from minipar.comm import TracedComm
    from minipar.comm.traced import traced

    t = traced(MPI.COMM_WORLD)
    assert traced(None) is t and traced(MPI.Comm(MPI.COMM_WORLD)) is t and traced(t) is t
    assert t.name == "world" and isinstance(t, TracedComm)
    before = t.stats.ops["ring_allreduce"].calls if "ring_allreduce" in t.stats.ops else 0
    with t.operation("ring_allreduce"):  # one rank: the ring is a copy; count the scope
        C.ring_allreduce(MPI.COMM_WORLD, np.ones(3))
    assert t.stats.ops["ring_allreduce"].calls == before + 1
    d = MPI.COMM_WORLD.Dup()
    td = traced(d)
    assert td is not t and traced(d) is td and td.name == "comm"
    td.Free()
    assert d == MPI.COMM_NULL
    t.Free()  # COMM_WORLD is MPI's: left alone
    assert t.comm == MPI.COMM_WORLD and t.Get_size() == 1


def test_mpi_spec_uses_dtlib_not_the_private_typedict() -> None:
    import numpy as np
    from ml_dtypes import bfloat16
    from mpi4py import MPI

    from minipar.collectives import _base as B

    for p in (Path(B.__file__).parent.parent / "collectives").glob("*.py"):
        assert "_typedict" not in p.read_text(), p.name
    for name in B.DTYPES:
        d = B.dtype_named(name)
        _, dt, op = B.mpi_spec(np.zeros(3, d), "sum")
        if d == np.dtype(bfloat16):  # MPI has no bfloat16: opaque bytes and a NumPy op
            assert dt.Get_size() == 2 and not dt.is_predefined and op != MPI.SUM
        else:  # MPI's own predefined type (MPICH refuses MPI_SUM on dtlib's duplicate)
            assert dt.is_predefined and dt.Get_size() == d.itemsize and op == MPI.SUM, d
    x = np.arange(5, dtype=np.float64)
    out = np.empty_like(x)
    _, dt, op = B.mpi_spec(x)
    MPI.COMM_WORLD.Allreduce(B.mpi_buf(x, dt), B.mpi_buf(out, dt), op)
    assert np.array_equal(out, x)


def test_mpi_methods_pass_through_by_name_and_are_counted() -> None:
    """No ``__getattr__``: MPI's own methods are passed through by name, each counted;
    anything else is an AttributeError instead of silent, uncounted MPI."""
    import numpy as np
    from mpi4py import MPI

    from minipar.comm.traced import PASSED_THROUGH, TracedComm

    c = TracedComm(MPI.COMM_SELF)
    out = np.zeros(3)
    c.Allreduce(np.ones(3), out)
    assert out.tolist() == [1.0, 1.0, 1.0]
    assert c.stats.as_dict()["ops"]["mpi.Allreduce"]["calls"] == 1
    assert c.allgather(5) == [5]
    assert "Send_init" not in PASSED_THROUGH
    with pytest.raises(AttributeError):
        c.Send_init  # noqa: B018 (not passed through: refused, not forwarded uncounted)
