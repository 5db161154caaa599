"""allreduce(algorithm="auto"): the rule of minipar.collectives.auto and what it runs.

The rule (measured, see auto.py): recursive doubling below 8 MiB and always
on 1-2 ranks, the ring from 8 MiB up on 3 or more.  The multi-rank test runs
auto on both sides of the threshold against MPI's own Allreduce and checks
the exact bytes of what it chose.
"""

from __future__ import annotations

import math

import pytest
from conftest import launch_checks

import minipar.collectives as C
from minipar.collectives import auto

MiB = 1 << 20


def test_thresholds():
    assert auto.RING_MIN_BYTES == 8 * MiB
    assert auto.ring_threshold(1) == auto.ring_threshold(2) == math.inf
    assert all(auto.ring_threshold(n) == 8 * MiB for n in range(3, 65))


def test_choice_by_size_and_world():
    assert C.choose_allreduce(8, 4) == "recursive_doubling"
    assert C.choose_allreduce(8 * MiB - 1, 4) == "recursive_doubling"
    assert C.choose_allreduce(8 * MiB, 4) == "ring"
    assert C.choose_allreduce(8 * MiB, 3) == "ring"
    assert C.choose_allreduce(1 << 40, 2) == "recursive_doubling"   # N = 2: never the ring
    assert C.choose_allreduce(0, 1) == "recursive_doubling"
    for n in range(1, 17):  # once the ring wins, it wins for every larger size
        picks = [C.choose_allreduce(s, n) for s in [0] + [1 << k for k in range(40)]]
        first = picks.index("ring") if "ring" in picks else len(picks)
        assert set(picks[first:]) <= {"ring"} and set(picks[:first]) <= {"recursive_doubling"}
        assert (first < len(picks)) == (n >= 3)


@pytest.mark.parametrize("bad", [
    lambda: C.choose_allreduce(-1, 4), lambda: C.choose_allreduce(8, 0),
    lambda: C.choose_allreduce(8.0, 4), lambda: C.choose_allreduce(8, True),
    lambda: auto.ring_threshold(2.0),
])
def test_bad_arguments(bad):
    with pytest.raises(ValueError):
        bad()


def test_auto_bytes_are_the_chosen_algorithms():
    # 1000 float32 on 4 ranks: recursive doubling, log2 4 = 2 rounds of 4000 B each way
    assert C.allreduce_bytes(1000, 4, 4, 1) == (8000, 8000)
    assert C.allreduce_bytes(1000, 4, 4, 1) == C.recursive_doubling_bytes(4000, 4, 1)
    # 3 Mi float32 = 12 MiB on 4 ranks: the ring, 2(N-1)/N x S = 1.5 x 12 MiB
    assert C.allreduce_bytes(3 * MiB, 4, 4, 2) == (18 * MiB, 18 * MiB)
    assert C.allreduce_bytes_sent(3 * MiB, 4, 4, 2) == C.ring_allreduce_bytes_sent(3 * MiB, 4, 4, 2)
    assert C.allreduce_bytes(10, 8, 8, 0, "naive") == (70 * 8, 70 * 8)
    assert C.allreduce_bytes(10, 8, 5, 0, "tree") == C.tree_allreduce_bytes(80, 5, 0)
    with pytest.raises(ValueError, match="MPI's own does not tell"):
        C.allreduce_bytes(10, 8, 4, 0, "mpi")


def test_auto_is_the_default():
    import inspect

    assert inspect.signature(C.allreduce).parameters["algorithm"].default == "auto"
    assert "auto" in C.ALLREDUCE_ALGORITHMS


@pytest.mark.parametrize("n", [1, 2, 3, 4, 5, 8])
def test_auto_on_real_ranks(n):
    fields = launch_checks(n, "auto_check.py", "AUTO", timeout=180, watchdog_s=60)
    assert int(fields["checks"]) > 50 * n
