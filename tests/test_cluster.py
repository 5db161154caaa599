"""Runs across hosts, tried on one machine: a cluster of network namespaces (issue 38).

The cluster (tests/cluster.py): two hosts of two ranks, each host a network namespace with
its own hostname, processes and ``/tmp``, joined by a bridge to a login namespace where
``minipar`` runs; MPICH's process manager reaches the hosts through ``-launcher ssh
-launcher-exec``.  Skipped, with the one-line reason, where the machine refuses namespaces.
"""

from __future__ import annotations

import pytest
from cluster import Cluster, refusal

REFUSED = refusal()
pytestmark = pytest.mark.skipif(REFUSED is not None, reason=REFUSED or "")

TINY = ["--steps", "2", "--layers", "1", "--d-model", "8", "--heads", "2"]


@pytest.fixture(scope="module")
def cluster():
    c = Cluster(hosts=2, slots=2)
    try:
        yield c
    finally:
        c.close()
    assert c.gone() == [], f"the cluster left {c.gone()}"


@pytest.mark.parametrize("argv", [["dp"], ["zero", "--stage", "3"],
                                  ["hybrid", "--dp", "2", "--tp", "2"]],
                         ids=["dp", "zero3", "hybrid-dp2-tp2"])
def test_a_run_across_two_hosts_equals_the_serial_run(cluster: Cluster, argv) -> None:
    proc = cluster.minipar("run", *argv, "-n", "4", "--hostfile", str(cluster.hostfile),
                           *TINY, "--timeout", "100")
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "final parameters: equal to the serial run" in proc.stdout, proc.stdout
    assert cluster.wait_empty(10), cluster.leftovers()
