"""allreduce(algorithm="auto"): the rule of minipar.collectives.auto and what it runs.

The rule: whichever of recursive doubling and the ring the α–β–γ model
(minipar.collectives.cost_model, the committed calibration) says is faster.
The multi-rank test runs auto on both sides of the model's crossover against
MPI's own Allreduce and checks the exact bytes of what it chose.
"""

from __future__ import annotations

import math

import pytest
from conftest import launch_checks

import minipar.collectives as C
from minipar.collectives import auto
from minipar.collectives.cost_model import LinkCosts, allreduce_time, choose_by_model

MiB = 1 << 20
COSTS = LinkCosts(alpha_s=10e-6, beta_s_per_byte=1e-9, gamma_s_per_byte=2e-10)


def test_threshold_is_the_models_crossover():
    # N = 2: the ring costs one alpha more and S*gamma/2 less: it wins from 2 alpha / gamma up
    assert auto.ring_threshold(2, COSTS) == math.floor(2 * 10e-6 / 2e-10) + 1
    assert auto.ring_threshold(1, COSTS) == math.inf  # nothing to send
    no_gamma = LinkCosts(10e-6, 1e-9, 1e-300)
    assert auto.ring_threshold(2, no_gamma) == math.inf  # the alpha-beta model alone: never
    for n in range(2, 33):
        edge = auto.ring_threshold(n, COSTS)
        assert math.isfinite(edge)
        s = int(edge)
        assert C.choose_allreduce(s, n, COSTS) == "ring"
        assert s == 0 or C.choose_allreduce(s - 1, n, COSTS) == "recursive_doubling"
        t = {a: allreduce_time(a, s, n, COSTS) for a in auto.AUTO_CHOICES}
        assert t["ring"] < t["recursive_doubling"]
    for n in (2, 3, 4, 8):  # the committed constants too
        assert math.isfinite(auto.ring_threshold(n))


def test_choice_is_the_models_and_monotone():  # (the committed constants)
    assert C.choose_allreduce(8, 4) == "recursive_doubling"
    assert C.choose_allreduce(64 << 20, 4) == "ring"
    assert C.choose_allreduce(64 << 20, 2) == "ring"  # the additions decide on 2 ranks
    assert C.choose_allreduce(0, 1) == "recursive_doubling"
    for n in range(1, 17):  # once the ring wins, it wins for every larger size
        picks = [C.choose_allreduce(s, n) for s in [0] + [1 << k for k in range(40)]]
        assert picks == [choose_by_model(s, n) for s in [0] + [1 << k for k in range(40)]]
        first = picks.index("ring") if "ring" in picks else len(picks)
        assert set(picks[first:]) <= {"ring"} and set(picks[:first]) <= {"recursive_doubling"}
        assert (first < len(picks)) == (n >= 2)


@pytest.mark.parametrize("bad", [
    lambda: C.choose_allreduce(-1, 4), lambda: C.choose_allreduce(8, 0),
    lambda: C.choose_allreduce(8.0, 4), lambda: C.choose_allreduce(8, True),
    lambda: auto.ring_threshold(2.0), lambda: C.choose_allreduce(8, 2.0),
])
def test_bad_arguments(bad):
    with pytest.raises(ValueError):
        bad()


def test_auto_bytes_are_the_chosen_algorithms():
    # 1000 float32 on 4 ranks: recursive doubling, log2 4 = 2 rounds of 4000 B each way
    assert C.allreduce_bytes(1000, 4, 4, 1) == (8000, 8000)
    assert C.allreduce_bytes(1000, 4, 4, 1) == C.recursive_doubling_bytes(4000, 4, 1)
    # 3 Mi float32 = 12 MiB on 4 ranks: the ring (the model's choice), 2(N-1)/N x S = 1.5 x 12 MiB
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
