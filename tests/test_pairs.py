"""minipar.parallel.mappings: the conjugate pairs, each backward the adjoint of its forward.

Each world size 1-4 is ONE launch of tests/mpi/pairs_check.py, which runs the
adjoint (dot-product) test for every pair (float64, lengths divisible by N and
not, several axes, Ulysses and expert-dispatch layouts), exact integer-valued
results against NumPy, bytes counted against ``pair_bytes_sent``, and bad
input (a ValueError on every rank, no byte sent).  A sequence whose length
differs across ranks cannot be seen locally: the collective must catch it.
The byte formulas are checked here against hand counts and the papers'
asymptotic volumes.
"""

from __future__ import annotations

import numpy as np
import pytest
from conftest import MPI_DIR, launch_checks
from mpi4py import MPI

from minipar import launch
from minipar.comm import TracedComm
from minipar.parallel import mappings as P
from minipar.parallel.mappings_measure import adjoint_sides, dot, pair_bytes_sent
from minipar.plan.collectives import (
    all_gather_volume,
    all_to_all_volume,
    reduce_scatter_volume,
    ring_allreduce_volume,
)

F, G = P.copy_to_tensor_model_parallel_region, P.reduce_from_tensor_model_parallel_region
SP_F, SP_G = P.gather_from_sequence_parallel_region, P.reduce_scatter_to_sequence_parallel_region


@pytest.mark.parametrize("n", [1, 2, 3, 4])
def test_pairs_adjoint_exact_and_bytes(n: int) -> None:
    fields = launch_checks(n, "pairs_check.py", "PAIRS", timeout=90, watchdog_s=30)
    assert int(fields["checks"]) > 250


def test_sequence_lengths_that_differ_across_ranks_are_a_clear_error() -> None:
    # the watchdog (60 s) outlives the launch (40 s): only the mismatch guard can end the job
    proc = launch.run(2, str(MPI_DIR / "pairs_check.py"), "mismatch", timeout=40,
                      env={"MINIPAR_WATCHDOG_S": "60"})
    out = proc.stdout + proc.stderr
    assert proc.returncode != 0 and "went unnoticed" not in out, out[-3000:]
    assert "CollectiveMismatchError" in out and "reduce_scatter" in out, out[-3000:]


def test_the_table() -> None:
    f, g, sp_f, sp_g = F, G, SP_F, SP_G
    assert [p.name for p in P.PAIRS] == ["tp_f", "tp_g", "sp_f", "sp_g", "a2a"]
    assert P.PAIRS == (f, g, sp_f, sp_g, P.all_to_all)
    # conjugate: each backward is a forward of the table (the same function)
    assert f.backward_collective is g.forward_collective
    assert f.forward_collective is g.backward_collective
    assert sp_f.backward_collective is sp_g.forward_collective
    assert sp_g.backward_collective is sp_f.forward_collective
    assert P.all_to_all.backward_collective is not P.all_to_all.forward_collective
    assert (f.domain, g.codomain) == (P.REPLICATED,) * 2
    assert (f.codomain, g.domain) == (P.PER_RANK,) * 2
    # Megatron's names, one name per thing
    assert not any(hasattr(P, n) for n in ("copy_to_parallel", "reduce_from_parallel",
                                           "gather_from_sequence", "scatter_to_sequence"))


def test_bytes_by_hand() -> None:
    # f and g: one ring all-reduce of 10 elements on 4 ranks (chunks 3,3,2,2):
    # rank 1 sends 2*10 - c[1] - c[2] = 15 elements
    assert pair_bytes_sent(F, (2, 5), 8, 4, 1) == (0, 15 * 8)
    assert pair_bytes_sent(G, (2, 5), 8, 4, 1) == (15 * 8, 0)
    # SP's f on (b=2, s=5, h=3), 2 ranks: seq parts 3, 2; a position is 2*3*4 bytes
    # all-gather: rank 0 sends all but chunk 1 (5 - 2 = 3); reduce-scatter: all but its own (2)
    assert pair_bytes_sent(SP_F, (2, 5, 3), 4, 2, 0) == (3 * 24, 2 * 24)
    assert pair_bytes_sent(SP_G, (2, 5, 3), 4, 2, 0) == (2 * 24, 3 * 24)
    # axis 0: positions of 5*3 elements
    assert pair_bytes_sent(SP_F, (2, 5, 3), 4, 2, 1, axis=0) == (60, 60)
    # Ulysses (b=1, s=5, heads=3, d=2) on 2 ranks: rank 0 holds s 3 x all heads, then
    # s 5 x heads 2: sends 3 positions x 1 head, then 2 heads x 2 positions (x d=2, x 8 B)
    assert pair_bytes_sent(P.all_to_all, (1, 5, 3, 2), 8, 2, 0) == (3 * 1 * 16, 2 * 2 * 16)
    assert all(pair_bytes_sent(p, (2, 3, 4, 5), 8, 1, 0) == (0, 0) for p in P.PAIRS)


@pytest.mark.parametrize("world", [2, 3, 4, 8])
def test_bytes_match_the_papers_volumes_when_n_divides(world: int) -> None:
    full = (2, 4 * world, 3 * world, 5)
    S = float(np.prod(full) * 8)
    for r in range(world):
        assert sum(pair_bytes_sent(F, full, 8, world, r)) == \
            ring_allreduce_volume(S, world)
        fwd, bwd = pair_bytes_sent(SP_F, full, 8, world, r)
        assert fwd == all_gather_volume(S, world) and bwd == reduce_scatter_volume(S, world)
        # SP moves what TP moves: f + g of SP = f + g of TP
        sp = sum(pair_bytes_sent(SP_F, full, 8, world, r)) \
            + sum(pair_bytes_sent(SP_G, full, 8, world, r))
        tp = sum(pair_bytes_sent(F, full, 8, world, r)) \
            + sum(pair_bytes_sent(G, full, 8, world, r))
        assert sp == tp
        fwd, bwd = pair_bytes_sent(P.all_to_all, full, 8, world, r)
        assert fwd == bwd == all_to_all_volume(S / world, world)


def test_one_rank_identity_and_local_errors() -> None:
    c = TracedComm(MPI.COMM_SELF)
    x = np.arange(12.0).reshape(2, 3, 2)
    assert F.forward(c, x) is x and G.backward(c, x) is x
    for p in P.PAIRS[:4]:
        assert np.array_equal(p.forward(c, x), x) and np.array_equal(p.backward(c, x), x)
    u = np.arange(24.0).reshape(1, 3, 4, 2)
    assert np.array_equal(P.all_to_all.forward(c, u), u)
    assert adjoint_sides(c, F, x, x) == (float((x * x).sum()),) * 2
    assert c.stats.bytes_sent() == 0
    with pytest.raises(ValueError, match="out of range"):
        pair_bytes_sent(SP_F, (2, 3), 8, 2, 0, axis=2)
    with pytest.raises(ValueError, match="routing"):
        pair_bytes_sent(P.all_to_all, (4, 3), 8, 2, 0, split_axis=0, concat_axis=0)
    with pytest.raises(ValueError, match="neither"):
        dot(c, x, x, "sharded")
    with pytest.raises(ValueError, match="not the output sizes"):
        P.all_to_all.forward(c, u, output_sizes=[2])
