"""Isolated messages: one tag table, receives that match their tag, traffic that coexists.

The multi-rank checks are ONE launch per world size of tests/mpi/isolation_check.py:
pipeline-like sends pending on the communicator while every blocking collective
runs (received afterwards, intact), and non-blocking all-reduces interleaved
with blocking ones (all equal to MPI's Allreduce).  In-process: the ranges of
minipar.comm.tags do not overlap and fit MPI's TAG_UB, the tag helpers check
their arguments, and no receive in minipar.collectives or minipar.comm takes
ANY_TAG.
"""

from __future__ import annotations

import ast
import itertools
from pathlib import Path

import numpy as np
import pytest
from conftest import launch_checks

from minipar.comm import tags as T

PKG = Path(__file__).parent.parent / "minipar"


@pytest.mark.parametrize("n", [2, 3, 4])
def test_foreign_messages_pending_while_collectives_run(n: int) -> None:
    fields = launch_checks(n, "isolation_check.py", "ISOLATION", timeout=180, watchdog_s=30)
    assert int(fields["checks"]) > 100 * n


def test_tag_ranges_do_not_overlap_and_fit_tag_ub() -> None:
    ranges = T.ranges()
    assert [r.name for r in ranges] == ["user", "parameter_server", "nonblocking", "pipeline",
                                        "collective"]
    for a, b in itertools.pairwise(ranges):
        assert a.last < b.first, (a, b)
    assert all(r.count > 0 for r in ranges)
    assert ranges[-1].last == T.tag_ub() >= T.STANDARD_TAG_UB
    T.check_tag_ub()
    # everything but the row sizes of the collective range fits the standard's minimum
    assert T.COLLECTIVE_FIRST + 8192 - 1 <= T.STANDARD_TAG_UB


def _range_of(tag: int) -> str:
    return next(r.name for r in T.ranges() if tag in r)


def test_every_helper_stays_in_its_range() -> None:
    assert {_range_of(t) for t in (T.PS_HEADER, T.PS_GRAD, T.PS_PARAM)} == {"parameter_server"}
    assert len({T.PS_HEADER, T.PS_GRAD, T.PS_PARAM}) == 3
    nb = [T.nonblocking_tag(i) for i in (0, 1, 8191)]
    assert {_range_of(t) for t in nb} == {"nonblocking"} and nb[0] == T.NONBLOCKING.first
    pipe = {T.pipeline_tag(k, mb, c) for k in T.PIPELINE_KINDS
            for mb in range(T.PIPELINE_MICRO_BATCHES) for c in range(T.PIPELINE_CHUNKS)}
    assert len(pipe) == len(T.PIPELINE_KINDS) * T.PIPELINE_MICRO_BATCHES * T.PIPELINE_CHUNKS
    assert {_range_of(t) for t in pipe} == {"pipeline"}
    assert T.pipeline_tag("act", 3) == T.pipeline_tag("act", 3 + T.PIPELINE_MICRO_BATCHES)
    sigs = {T.collective_tag(c, d, op, row) for c in T.COLLECTIVES for d in T.DTYPES
            for op in T.OP_NAMES for row in (0, 1, 7, 65532)}
    assert len(sigs) == len(T.COLLECTIVES) * len(T.DTYPES) * len(T.OP_NAMES) * 4
    assert {_range_of(t) for t in sigs} == {"collective"}
    assert all(T.is_collective_tag(t) for t in sigs)
    assert not any(T.is_collective_tag(t) for t in pipe | set(nb) | {0, 7, T.PS_HEADER})
    assert T.describe_tag(T.collective_tag("all_gather", np.float32, row=4)) \
        == "all_gather of float32 (op sum, rows of 4 elements)"
    assert "pipeline grad" in T.describe_tag(T.pipeline_tag("grad", 5, 1))
    assert T.dtype_of_tag(T.collective_tag("broadcast", np.int16)) == np.int16


@pytest.mark.parametrize("call", [
    lambda: T.pipeline_tag("weights", 0), lambda: T.pipeline_tag("act", -1),
    lambda: T.pipeline_tag("act", 0, T.PIPELINE_CHUNKS), lambda: T.pipeline_tag("act", 1.5),
    lambda: T.nonblocking_tag(8192), lambda: T.nonblocking_tag(-1),
    lambda: T.collective_tag("ring_allreduce", np.dtype(object)),
])
def test_bad_tag_arguments_are_clear_errors(call: object) -> None:
    with pytest.raises(ValueError, match=r".{30,}"):
        call()  # type: ignore[operator]


def test_nonblocking_allreduce_refuses_a_tag_outside_its_range() -> None:
    from minipar.collectives.nonblocking import TAG_BASE, iallreduce

    with pytest.raises(ValueError, match="8192"):
        iallreduce(None, np.zeros(4), 7)
    assert iallreduce(None, np.ones(4), TAG_BASE + 3).wait().tolist() == [1.0] * 4  # 1 rank


RECEIVES = {"Recv", "Irecv", "Sendrecv", "Probe", "Mprobe", "Improbe", "probe_tags"}


def _names_any_tag(node: ast.AST) -> bool:
    return any(isinstance(n, (ast.Name, ast.Attribute)) and
               (getattr(n, "id", None) == "ANY_TAG" or getattr(n, "attr", None) == "ANY_TAG")
               for n in ast.walk(node))


def test_no_receive_takes_any_tag() -> None:
    """minipar.collectives never names ANY_TAG; minipar.comm only to probe, never to receive.

    (TracedComm's own Recv/Probe keep mpi4py's default, ANY_TAG, for the
    learner's point-to-point code; no call inside the package relies on it.)
    """
    for path in sorted((PKG / "collectives").glob("*.py")):
        assert "ANY_TAG" not in path.read_text(), f"{path.name} names ANY_TAG"
    any_tag_probes = 0
    for path in sorted(list((PKG / "collectives").glob("*.py")) + list((PKG / "comm").glob("*.py"))):
        for node in ast.walk(ast.parse(path.read_text())):
            if not isinstance(node, ast.Call) or not isinstance(node.func, ast.Attribute):
                continue
            name, args = node.func.attr, [*node.args, *(k.value for k in node.keywords)]
            if name in RECEIVES:
                assert not any(_names_any_tag(a) for a in args), f"{path.name}:{node.lineno}"
                tags = [k for k in node.keywords if k.arg in ("tag", "recvtag", "tags")]
                min_args = {"Sendrecv": 6, "probe_tags": 2}.get(name, 3 if "recv" in name.lower()
                                                                 else 2)
                assert tags or len(node.args) >= min_args, \
                    f"{path.name}:{node.lineno}: {name} without a tag (would default to ANY_TAG)"
            elif name == "Iprobe" and any(_names_any_tag(a) for a in args):
                any_tag_probes += 1  # the mismatch guard's look at the earliest message
    assert any_tag_probes <= 2
