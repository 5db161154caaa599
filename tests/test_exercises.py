"""mpirun exercises: list/start, reference solutions pass, wrong ones fail for the right reason.

Every grading run is one launch through minipar.launch.run (bounded by a
timeout); the wrong solutions live in tests/mpi/ex_wrong_*.py.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from minipar.exercises import EXERCISES, get
from minipar.exercises import cli as ex_cli
from minipar.exercises.grading import check

MPI_DIR = Path(__file__).parent / "mpi"


def failed(report) -> list:
    return [c for c in report.checks if c.ok is False]


# -- list / start --------------------------------------------------------------------
def test_list_shows_every_exercise(capsys):
    assert ex_cli.main(["list"]) == 0
    out = capsys.readouterr().out
    for ex in EXERCISES.values():
        assert ex.name in out and ex.description in out and ex.difficulty in out


@pytest.mark.parametrize("name", list(EXERCISES))
def test_start_writes_the_skeleton_and_refuses_to_overwrite(tmp_path, capsys, name):
    target = tmp_path / f"{name}.py"
    assert ex_cli.main(["start", name, "--dir", str(tmp_path)]) == 0
    text = target.read_text()
    assert f"def {get(name).function}(comm, x" in text
    assert "raise NotImplementedError" in text and "comm.Send" in text
    target.write_text("# my work\n")
    assert ex_cli.main(["start", name, "--dir", str(tmp_path)]) == 1
    assert "not overwriting" in capsys.readouterr().err
    assert target.read_text() == "# my work\n"
    assert ex_cli.main(["start", name, "--dir", str(tmp_path), "--force"]) == 0
    assert target.read_text() == text


def test_start_creates_a_missing_dir_and_says_so(tmp_path, capsys):
    folder = tmp_path / "my" / "exercises"
    assert ex_cli.main(["start", "tree_broadcast", "--dir", str(folder)]) == 0
    out = capsys.readouterr().out
    assert out.startswith(f"created folder {folder}\nwrote {folder / 'tree_broadcast.py'}")
    assert (folder / "tree_broadcast.py").read_text() == get("tree_broadcast").skeleton_path.read_text()
    assert ex_cli.main(["start", "ring_allreduce", "--dir", str(folder)]) == 0
    assert "created" not in capsys.readouterr().out  # it exists now


def test_bad_arguments_are_refused(tmp_path):
    with pytest.raises(ValueError, match="no such file"):
        check("ring_allreduce", tmp_path / "missing.py", 2)
    with pytest.raises(ValueError, match="positive integer"):
        check("ring_allreduce", get("ring_allreduce").solution_path, 0)
    with pytest.raises(ValueError, match="unknown exercise"):
        get("ring_allgather")


# -- reference solutions ------------------------------------------------------------------
@pytest.mark.parametrize(
    "name, n",
    [("ring_allreduce", n) for n in (1, 2, 3, 4, 8)]
    + [("tree_broadcast", n) for n in (1, 2, 3, 4, 5)],
)
def test_reference_solution_passes(name, n):
    report = check(name, get(name).solution_path, n, timeout=90)
    assert report.passed, report.text()
    assert not failed(report)
    ungraded = [c for c in report.checks if c.ok is None]
    if name == "tree_broadcast" and n < 4:  # a linear broadcast and a tree look the same
        assert [c.name for c in ungraded] == [report.checks[-1].name]
        assert "not graded on" in ungraded[0].detail
    else:
        assert not ungraded
    assert report.verdict.startswith("PASS")


@pytest.mark.parametrize("name", list(EXERCISES))
def test_untouched_skeleton_says_not_implemented(name):
    report = check(name, get(name).skeleton_path, 2, timeout=30)
    assert not report.passed
    (c,) = failed(report)
    assert c.detail.startswith("not implemented yet: start with ")
    assert "skeleton.py:" in c.detail  # points at the learner's raise line


# -- wrong solutions are caught, with the right message --------------------------------------
WRONG = [
    # file, exercise, ranks, failing check (substring), message (substrings)
    (
        "ex_wrong_allreduce.py",
        "ring_allreduce",
        4,
        "no MPI collectives",
        ["comm.Allreduce was called", "MPI's own collective"],
    ),
    (
        "ex_wrong_pickle_bcast.py",
        "tree_broadcast",
        4,
        "no MPI collectives",
        ["comm.bcast was called", "MPI's own collective"],
    ),
    (
        "ex_wrong_parameter_server.py",
        "ring_allreduce",
        4,
        "ring neighbours",
        ["rank 0 received from all 3 other ranks", "parameter-server pattern"],
    ),
    (
        "ex_wrong_chunking.py",
        "ring_allreduce",
        4,
        "result equals MPI's Allreduce",
        ["cases wrong. First: length 1", "expected"],
    ),
    (
        "ex_wrong_inplace.py",
        "ring_allreduce",
        3,
        "leaves the input untouched",
        ["wrote into its input x"],
    ),
    (
        "ex_wrong_linear_broadcast.py",
        "tree_broadcast",
        4,
        "binomial tree",
        ["the root 0 sent 3 messages, expected <= ceil(log2 N) = 2", "linear broadcast"],
    ),
    ("ex_wrong_borrowed.py", "ring_allreduce", 2, "written by you", ["uses minipar.collectives"]),
    (
        "ex_wrong_raises.py",
        "ring_allreduce",
        4,
        "runs without error",
        ["rank 2 raised IndexError", "ex_wrong_raises.py:10: chunks[n] += 1"],
    ),
]


@pytest.mark.parametrize("file, name, n, check_name, words", WRONG, ids=[w[0] for w in WRONG])
def test_wrong_solution_is_caught(file, name, n, check_name, words):
    report = check(name, MPI_DIR / file, n, timeout=60)
    assert not report.passed
    hits = [c for c in failed(report) if check_name in c.name]
    assert hits, report.text()
    for w in words:
        assert w in hits[0].detail, report.text()
    assert report.verdict.startswith("FAIL")


def test_wrong_chunking_is_still_a_ring():
    """The off-by-one keeps the ring's traffic: only the sums are wrong, and only they fail."""
    report = check("ring_allreduce", MPI_DIR / "ex_wrong_chunking.py", 4, timeout=60)
    assert [c.name for c in failed(report)] == [report.checks[3].name]


def test_deadlock_is_reported_within_the_watchdog():
    report = check("ring_allreduce", MPI_DIR / "ex_wrong_deadlock.py", 4, timeout=30, watchdog=3)
    (c,) = failed(report)
    assert c.name == "no deadlock"
    assert "deadlock" in c.detail and "waited more than 3 s for Recv from rank 3" in c.detail
    assert "ex_wrong_deadlock.py:13: comm.Recv(buf, source=left)" in c.detail
    assert "Sendrecv" in c.detail


def test_a_hang_outside_the_watchdog_ends_at_the_launch_timeout():
    report = check("ring_allreduce", MPI_DIR / "ex_wrong_raw_comm.py", 2, timeout=6, watchdog=3)
    (c,) = failed(report)
    assert "did not finish within 6 s" in c.detail and "MPI.COMM_WORLD" in c.detail


# -- the command ---------------------------------------------------------------------
def test_check_command_exit_codes_and_json(capsys):
    assert ex_cli.main(["check", "ring_allreduce", "--solution", "-n", "3", "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["passed"] is True and data["n"] == 3
    assert all(c["ok"] and c["mark"] == "✓" for c in data["checks"])

    wrong = str(MPI_DIR / "ex_wrong_parameter_server.py")
    assert ex_cli.main(["check", "ring_allreduce", wrong]) == 1
    out = capsys.readouterr().out
    assert "✗ talks only to its ring neighbours" in out and out.rstrip().endswith(
        "fix the first ✗ first."
    )
    assert ex_cli.main(["check", "ring_allreduce"]) == 2  # neither FILE nor --solution
    assert capsys.readouterr().err == (
        "minipar exercise check: give FILE or --solution (one of them)\n")  # more: test_bad_input
