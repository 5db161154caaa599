"""minipar.collectives against MPI's own collectives, on 1 to 8 ranks.

Each world size is ONE launch of tests/mpi/coll_check.py, which runs every
check (every algorithm x lengths 0, 1, N-1, N, N+1, 1000, 1001 x dtypes x
ops sum/max, every root, byte counts vs minipar.collectives.cost, ring peers,
inputs untouched, local errors) and prints a summary line.  Cross-rank
mismatches get one launch each: they must end the job with a clear error.
The byte formulas themselves are checked in-process against hand counts.
"""

from __future__ import annotations

import numpy as np
import pytest
from conftest import MPI_DIR, launch_checks

import minipar.collectives as C
from minipar import launch


@pytest.mark.parametrize("n, backend", [(n, "numpy") for n in range(1, 9)] + [(3, "strict")])
def test_collectives_match_mpi_and_formulas(n: int, backend: str) -> None:
    """On the device stand-in (one case, 3 ranks: recursive doubling folds a rank) the inputs
    are device arrays, and every byte sent and received was staged through host memory."""
    fields = launch_checks(n, "coll_check.py", "COLL", timeout=120, watchdog_s=30,
                           backend=backend)
    assert int(fields["checks"]) > 600


@pytest.mark.parametrize(
    "case, n, words",
    [
        ("ring-length", 3, ["ring_allreduce", "bytes"]),
        ("ring-dtype", 2, ["float32", "int32"]),
        ("recursive-doubling-length", 3, ["recursive_doubling_allreduce"]),
        ("broadcast-length", 3, ["broadcast"]),
        ("tree-op", 2, ["op max", "op sum"]),
        ("all-gather-shape", 2, ["all_gather", "rows of 2 elements", "rows of 4 elements"]),
        ("collective", 2, ["naive_allreduce", "ring_allreduce"]),
    ],
)
def test_mismatch_across_ranks_is_a_clear_error(case: str, n: int, words: list[str]) -> None:
    # the watchdog (60 s) outlives the launch (40 s): only the mismatch guard can end the job
    proc = launch.run(n, str(MPI_DIR / "coll_mismatch.py"), case, timeout=40,
                      env={"MINIPAR_WATCHDOG_S": "60"})
    out = proc.stdout + proc.stderr
    assert proc.returncode != 0, out
    assert "CollectiveMismatchError" in out and "DeadlockError" not in out, out[-3000:]
    for w in words:
        assert w in out, (w, out[-3000:])


def test_chunk_counts_follow_array_split() -> None:
    for n in (0, 1, 3, 4, 5, 1001):
        for world in (1, 2, 3, 4, 7, 8):
            want = [len(c) for c in np.array_split(np.arange(n), world)]
            assert C.chunk_counts(n, world) == want


def test_ring_bytes_formula() -> None:
    # divisible: exactly 2(N-1)/N x S on every rank
    for world in (2, 3, 4, 8):
        n, item = 24 * world, 4
        for r in range(world):
            sent, recv = C.ring_allreduce_bytes(n, item, world, r)
            assert sent * world == recv * world == 2 * (world - 1) * n * item
    # uneven: n=5, N=4 -> chunks [2,1,1,1]; rank 0 sends all but chunks 0 and 1 twice
    assert C.chunk_counts(5, 4) == [2, 1, 1, 1]
    assert C.ring_allreduce_bytes(5, 8, 4, 0) == ((10 - 2 - 1) * 8, (10 - 1 - 2) * 8)
    assert C.ring_allreduce_bytes(5, 8, 4, 3) == ((10 - 1 - 2) * 8, (10 - 1 - 1) * 8)
    assert C.ring_allreduce_bytes_sent(5, 8, 1, 0) == 0
    # the totals over ranks balance: every byte sent is received
    for n, world in ((1001, 7), (3, 8), (0, 4)):
        pairs = [C.ring_allreduce_bytes(n, 2, world, r) for r in range(world)]
        assert sum(s for s, _ in pairs) == sum(r for _, r in pairs)


def test_tree_and_naive_formulas() -> None:
    # binomial tree on 5 ranks from root 0: 0 -> 4, 2, 1; 2 -> 3
    assert [C.broadcast_bytes(10, 5, r)[0] for r in range(5)] == [30, 0, 10, 0, 0]
    assert [C.broadcast_bytes(10, 5, r)[1] for r in range(5)] == [0, 10, 10, 10, 10]
    assert C.reduce_bytes(10, 5, 0) == (0, 30)
    assert C.broadcast_bytes(10, 5, 1, root=1) == (30, 0)
    # recursive doubling on 6 = 4 + 2: ranks 0, 2 fold into 1, 3
    assert [C.recursive_doubling_bytes(10, 6, r) for r in range(6)] == [
        (10, 10), (30, 30), (10, 10), (30, 30), (20, 20), (20, 20)]
    assert C.naive_allreduce_bytes(10, 8, 0) == (70, 70)
    assert C.naive_allreduce_bytes(10, 8, 5) == (10, 10)
    assert C.all_gather_bytes([2, 1, 1], 4, 0) == ((4 - 1) * 4, (4 - 2) * 4)
    assert C.reduce_scatter_bytes(12, 4, 4, 1) == (36, 36)


def test_bench_collectives_output_shape(capsys: pytest.CaptureFixture[str]) -> None:
    import json

    from minipar.bench import collectives as bench

    assert bench.main(["-n", "3", "--sizes", "8", "1024", "--iters", "2", "--json",
                       "--timeout", "120"]) == 0
    rows = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert len(rows) == 2 * len(bench.CASES)
    assert {(r["collective"], r["algorithm"]) for r in rows} == set(bench.CASES)
    for r in rows:
        assert r["ranks"] == 3 and r["dtype"] == "float32" and r["size"] == 4 * r["count"]
        assert r["time_us"] > 0 and r["algbw_GBs"] > 0
        factor = 4 / 3 if r["collective"] == "allreduce" else 2 / 3
        assert r["busbw_GBs"] == pytest.approx(r["algbw_GBs"] * factor, rel=1e-12)
        if r["algorithm"] == "mpi":
            assert r["x_mpi"] == 1.0
    table = bench.format_table(rows)
    assert "busbw(GB/s)" in table and "# reduce_scatter" in table
    assert len([ln for ln in table.splitlines() if ln.strip().startswith(("8 ", "1024 "))]) == len(rows)
