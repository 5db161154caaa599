"""Runs across hosts, tried on one machine: a cluster of network namespaces (issue 38).

The cluster (tests/cluster.py): two hosts of two ranks, each host a network namespace with
its own hostname, processes and ``/tmp``, joined by a bridge to a login namespace where
``minipar`` runs; MPICH's process manager reaches the hosts through ``-launcher ssh
-launcher-exec``.  Skipped, with the one-line reason, where the machine refuses namespaces.
"""

from __future__ import annotations

import json

import pytest
from cluster import Cluster, refusal

REFUSED = refusal()
pytestmark = pytest.mark.skipif(REFUSED is not None, reason=REFUSED or "")

#: one model every layout here can cut (hybrid's own defaults differ: given in full)
TINY = ["--layers", "1", "--d-model", "8", "--heads", "2", "--batch", "8", "--vocab", "8",
        "--seq", "4"]


@pytest.fixture(scope="module")
def cluster():
    c = Cluster(hosts=2, slots=2)
    try:
        yield c
    finally:
        c.close()
    assert c.gone() == [], f"the cluster left {c.gone()}"


def across(cluster: Cluster, *argv: str) -> dict:
    """``minipar run ARGV -n 4 --json`` on the cluster's two hosts: its summary, after
    asserting it succeeded with nothing but the JSON on stdout and left nothing on a host."""
    proc = cluster.minipar("run", *argv, "-n", "4", "--hostfile", str(cluster.hostfile),
                           *TINY, "--json", "--timeout", "100")
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    summary = json.loads(proc.stdout)  # the JSON and nothing else
    assert cluster.wait_empty(10), cluster.leftovers()
    return summary


@pytest.mark.parametrize("argv", [["dp"], ["zero", "--stage", "3"],
                                  ["hybrid", "--dp", "2", "--tp", "2"]],
                         ids=["dp", "zero3", "hybrid-dp2-tp2"])
def test_a_run_across_two_hosts_equals_the_serial_run(cluster: Cluster, argv) -> None:
    """Each host's ranks know they share it (MPI's shared-memory split): h1 holds ranks 0
    and 1, h2 ranks 2 and 3; the data-parallel bytes cross hosts."""
    s = across(cluster, *argv, "--steps", "2")
    assert s["parity"] is True, s["verdict"]
    hosts = s["hosts"]
    assert hosts["names"] == ["h1", "h2"] and hosts["host_of_rank"] == [0, 0, 1, 1], hosts
    assert hosts["placement"][:2] == ["h1: ranks 0, 1", "h2: ranks 2, 3"], hosts
    if argv[0] == "hybrid":  # Megatron's placement: tp adjacent, inside a host
        assert hosts["placement"][2] == "inside a host: tp; across hosts: dp", hosts
        for axes in hosts["bytes_by_axis_per_rank"]:
            assert axes["tp"]["inter"] == 0 < axes["tp"]["intra"], axes
            assert axes["dp"]["intra"] == 0 < axes["dp"]["inter"], axes


def test_a_checkpoint_saved_across_hosts_resumes_on_another_layout(cluster: Cluster) -> None:
    """ZeRO-3 on dp 4 saves into the shared folder (each rank its shard, from either host);
    hybrid dp 2 x tp 2, across the same hosts, resumes it, equal to the serial run resumed."""
    ck = str(cluster.shared / "ck")
    saved = across(cluster, "zero", "--stage", "3", "--steps", "2", "--save", ck)
    assert saved["parity"] is True, saved["verdict"]
    resumed = across(cluster, "hybrid", "--dp", "2", "--tp", "2", "--steps", "4",
                     "--resume", ck)
    assert resumed["start"] == 2 and resumed["parity"] is True, resumed["verdict"]
