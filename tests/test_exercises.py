"""mpirun exercises: list/start, reference solutions pass, wrong ones fail for the right reason.

Every grading run is one launch through minipar.launch.run (bounded by a
timeout); the wrong solutions live in tests/mpi/ex_wrong_*.py.
"""

from __future__ import annotations

import json
import re

import pytest
from conftest import MPI_DIR, assert_caught, failed

from minipar import cli
from minipar.exercises import EXERCISES, get
from minipar.exercises import cli as ex_cli
from minipar.exercises.grading import check


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
    assert ex_cli.main(["start", name, "--dir", str(tmp_path)]) == 2  # usage errors exit 2
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
    [("ring_allreduce", n) for n in (2, 3, 4, 8)]
    + [("tree_broadcast", n) for n in (2, 3, 4, 5)]
    + [("ps_sync", n) for n in (2, 3, 5)]
    + [("layernorm_backward", n) for n in (2, 3)]
    + [("remat_budget", n) for n in (1, 2)]
    + [("allgather_mask", 1), ("block_quantize", 1)],
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
    assert f"minipar exercise hint {name}" in c.detail
    # the message says what is missing and where to start; the steps come as hints, on request
    code = {f.strip() for h in get(name).hints() for ln in h.splitlines() for f in ln.split(";")
            if "=" in f and len(f.strip()) > 8}
    assert not [f for f in code if f in c.detail], c.detail


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
    # the common value mistakes, named
    ("ex_wrong_average.py", "ring_allreduce", 4, "result equals MPI's Allreduce",
     ["exactly 1/N of the expected sum (N = 4): did you average instead of sum?"]),
    ("ex_wrong_twice.py", "ring_allreduce", 4, "result equals MPI's Allreduce",
     ["exactly N = 4 times the expected value"]),
    ("ex_wrong_partial.py", "ring_allreduce", 4, "result equals MPI's Allreduce",
     ["A partial sum", "chunk 0 lacks ranks"]),
    ("ex_wrong_allgather_index.py", "ring_allreduce", 4, "result equals MPI's Allreduce",
     ["Each chunk c holds only rank c's own values", "The all-gather passed around",
      "send chunks[(r + 1 - s) % N]"]),
    # the same symptom from the reduce-scatter: `=` where `+=` belongs (both causes named)
    ("ex_wrong_assign.py", "ring_allreduce", 4, "result equals MPI's Allreduce",
     ["Each chunk c holds only rank c's own values", "Two mistakes", "`recv += buf`",
      "send chunks[(r + 1 - s) % N]"]),
    ("ex_wrong_rotated.py", "ring_allreduce", 4, "result equals MPI's Allreduce",
     ["rotated chunk order", "chunk c holds what belongs in chunk (c + "]),
    # MPI's "Message truncated ... error stack" as a sentence about chunks
    ("ex_wrong_truncate.py", "ring_allreduce", 4, "message sizes agree",
     ["rank 1 received 1 element (8 bytes) from rank 0 into a buffer of 0 elements (0 bytes)",
      ("chunks of [1, 0, 0, 0] elements: rank 0 sent chunk 0, while rank 1 expected one of "
       "chunks 1, 2, 3"), "ex_wrong_truncate.py:13: comm.Sendrecv"]),
    # the layer norm's backward (notebook 02's exercise)
    ("ex_wrong_ln_no_sigma.py", "layernorm_backward", 3, "the serial layer's backward",
     ["the σ path is left out", "YOUR rows only"]),
    # remat under a budget (notebook 09's exercise): measured peak, counted recomputation
    ("ex_wrong_remat_largest_k.py", "remat_budget", 2, "fewest recomputed forwards",
     ["4 of 9 cases wrong. First: budget", "recomputes 5 unit forwards; every = 4 fits too",
      "A larger k is not always fewer recomputed forwards"]),
    ("ex_wrong_remat_keep_all.py", "remat_budget", 1, "measured peak <= budget",
     ["your plan's measured peak is", "bytes, over the budget of", "keep less"]),
    # all-gather CP's load-balanced causal mask (notebook 07's second exercise)
    ("ex_wrong_agmask_off_by_one.py", "allgather_mask", 1, "load-balanced causal mask",
     ["a chunk off by one", "you used chunk 2 where chunk 3 belongs"]),
    ("ex_wrong_agmask_contiguous.py", "allgather_mask", 1, "load-balanced causal mask",
     ["contiguous positions 0…3: an unbalanced split", "chunks r and 2P-1-r"]),
    ("ex_wrong_agmask_future.py", "allgather_mask", 1, "load-balanced causal mask",
     ["a query sees the future", "(position 0) sees the key at position 1"]),
    # FP8 with a scale per tile (notebook 12's exercise; the other mistakes, in process:
    # tests/test_exercises_quantize.py)
    ("ex_wrong_bq_per_tensor.py", "block_quantize", 1, "a scale per tile",
     ["one scale for the whole tensor", "instead of one per tile", "DeepSeek-V3's 1x128 tiles"]),
    # the parameter server's mistakes
    ("ex_wrong_ps_pull_first.py", "ps_sync", 4, "result equals the synchronous step",
     ["rank 1 returned the parameters from before the update", "pulled before"]),
    ("ex_wrong_ps_average_twice.py", "ps_sync", 3, "result equals the synchronous step",
     ["averaged twice"]),
    ("ex_wrong_ps_grad_bcast.py", "ps_sync", 3, "result equals the synchronous step",
     ["4 of 8 cases wrong. First: length 1, step 2", "broadcast the gradient",
      "Send the updated parameters"]),
    ("ex_wrong_ps_chain.py", "ps_sync", 4, "messages only between the server",
     ["worker 1 exchanged messages with rank 2"]),
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
    assert_caught(report, check_name, words)


def test_an_off_by_one_all_gather_is_not_blamed_on_the_reduce_scatter():
    report = check("ring_allreduce", MPI_DIR / "ex_wrong_allgather_index.py", 4, timeout=60)
    (c,) = failed(report)
    assert "all-gather" in c.detail and "reduce-scatter steps, each adding" not in c.detail


def test_a_gradient_sum_never_averaged_is_said_as_the_missing_average():
    """On 3 ranks with even slices the plain sum is exactly 3 x the serial gradient: the
    first sentence is the missing division by the world size, not "an all-reduce run twice"."""
    report = check("dp_grad_sync", MPI_DIR / "dp_wrong_sum.py", 3, timeout=60)
    (c,) = failed(report)
    said = c.detail.splitlines()[1]  # the line after "N of M cases wrong. First: ..."
    assert said.startswith("You returned the SUM of the ranks' gradients, never averaged"), c.detail
    assert "dividing by the world size, N = 3" in said and "rows / batch" in said
    assert "twice" not in c.detail and "added N times" not in c.detail


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


def test_an_endless_loop_on_one_rank_is_named_not_called_a_deadlock():
    """Ranks 0, 2, 3 wait for rank 1, which loops: its stack is dumped before the abort."""
    report = check("ring_allreduce", MPI_DIR / "ex_wrong_one_rank_endless.py", 4, timeout=30,
                   watchdog=3)
    (c,) = failed(report)
    assert c.name == "runs to the end without hanging"
    assert ("rank 1 never reached the exchange: it was still running at "
            "ex_wrong_one_rank_endless.py:12: while True: pass (an endless loop or a very "
            "long computation)") in c.detail, c.detail
    assert "rank 2 for rank 1" in c.detail and "after 3 s" in c.detail
    assert "Sendrecv" not in c.detail and "deadlock" not in c.detail  # not the wrong advice
    assert "rank 0 never" not in c.detail and "rank 2 never" not in c.detail


def test_counts_add_up_when_integer_results_have_the_wrong_dtype():
    """An average returned as float64: int cases fail the dtype, float cases the values."""
    report = check("ring_allreduce", MPI_DIR / "ex_wrong_average_float.py", 4, timeout=60)
    dtype, result = [c for c in failed(report)]
    assert dtype.detail.startswith("14 of 35 cases wrong. First: length 0, int64 (rank values)")
    assert result.name == ("result equals MPI's Allreduce (35 cases: lengths 0, 1, 3, 4, 5, "
                           "1000, 1001 x 5 variants: float64 (random values); float64 (rank "
                           "values); float32 (random values); int64 (rank values); int32 (rank "
                           "values))")
    assert result.detail.startswith("32 of 35 cases wrong (18 with wrong values; 14 of the "
                                    "wrong shape or dtype, the ✗ above). First: length 1, ")
    assert "did you average instead of sum?" in result.detail


def test_a_hang_outside_the_watchdog_ends_at_the_launch_timeout():
    report = check("ring_allreduce", MPI_DIR / "ex_wrong_raw_comm.py", 2, timeout=6, watchdog=3)
    (c,) = failed(report)
    assert "did not finish within 6 s" in c.detail and "MPI.COMM_WORLD" in c.detail
    assert "ranks 0, 1 at ex_wrong_raw_comm.py:10: world.Recv(" in c.detail  # where they waited
    assert "waiting in MPI" in c.detail


def test_an_endless_loop_is_named_with_its_line():
    report = check("ring_allreduce", MPI_DIR / "ex_wrong_endless.py", 2, timeout=5, watchdog=3)
    (c,) = failed(report)
    assert c.name == "runs to the end without hanging"
    # a stack dump catches the loop on its condition (line 10) or its body (line 11)
    for r in (0, 1):
        assert re.search(rf"ranks? [0-9, ]*\b{r}\b[0-9, ]* at ex_wrong_endless\.py:1[01]: "
                         r"(while c <= r:|start \+= 0 \* len\(chunks\[c\]\))", c.detail), c.detail
    assert "An endless loop" in c.detail and "counter advance" in c.detail


def test_wrong_chunk_index_stays_quiet_about_patterns_on_proportional_inputs():
    """Returning one's own x is a partial sum (only this rank's term), never '1/N' by luck."""
    report = check("ring_allreduce", MPI_DIR / "ex_wrong_prints.py", 3, timeout=60)
    (c,) = [c for c in failed(report) if c.name.startswith("result equals")]
    assert "A partial sum" in c.detail and "1/N" not in c.detail


# -- what the learner printed ----------------------------------------------------------
def test_prints_are_shown_by_rank_on_failure(capsys):
    assert ex_cli.main(["check", "ring_allreduce", str(MPI_DIR / "ex_wrong_prints.py"),
                        "-n", "2"]) == 1
    out = capsys.readouterr().out
    assert "what your code printed, by case and rank:" in out
    # the failing case's lines, under its label, not the last lines of later cases
    block = out.split("in length 1, float64 (random values) (the failing case):\n", 1)[1]
    assert block.startswith("    [rank 0] hello from rank 0, x has 1 elements\n")
    assert "    [rank 1] hello from rank 1, x has 1 elements\n" in block
    assert "[rank 1] no newline at the end" in block  # stderr, and a line without its newline
    assert "1001 elements" not in out
    assert "(116 lines from other cases not shown; --verbose shows all)" in out
    assert ex_cli.main(["check", "ring_allreduce", str(MPI_DIR / "ex_wrong_prints.py"),
                        "-n", "2", "--verbose"]) == 1
    out = capsys.readouterr().out
    assert out.count("x has 1001 elements") == 2 * 5  # every case, every rank
    assert "in length 1001, int32 (rank values):\n    [rank 0] hello" in out
    assert "not shown" not in out


def test_prints_are_shown_with_verbose_when_everything_passes(tmp_path, capsys):
    mine = tmp_path / "ring_allreduce.py"
    mine.write_text(get("ring_allreduce").solution_path.read_text().replace(
        "    return y\n", "    print('done', comm.Get_rank(), y.size)\n    return y\n"))
    assert ex_cli.main(["check", "ring_allreduce", str(mine), "-n", "2"]) == 0
    quiet = capsys.readouterr()
    assert "[rank" not in quiet.out and "PASS" in quiet.out
    assert ("your code printed 60 lines on 2 ranks, hidden because every check passed "
            "(--verbose shows them).") in quiet.out
    assert quiet.err == ("running ring_allreduce.py on 2 ranks, timeout 60 s (a rank waiting "
                         "5 s for one message is a deadlock) …\n")
    assert ex_cli.main(["check", "ring_allreduce", str(mine), "-n", "2", "--verbose"]) == 0
    out = capsys.readouterr().out
    assert "[rank 0] done 0 1001" in out and "[rank 1] done 1 1001" in out
    assert ex_cli.main(["check", "ring_allreduce", str(mine), "-n", "2", "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["output"]["1"].splitlines()[-1] == "done 1 1001"


def test_heavy_printing_on_four_ranks_is_graded_normally(tmp_path):
    """20,000+ debug lines per rank: no stack-dump thread runs while they are written.

    A repeating ``faulthandler`` dump (a C thread reading the frames without the
    GIL) crashed such runs with SIGSEGV in about half of them; three in a row."""
    mine = tmp_path / "ring_allreduce.py"
    mine.write_text(get("ring_allreduce").solution_path.read_text().replace(
        "    return y\n",
        "    for i in range(600):\n"
        "        print('debug', comm.Get_rank(), i, y[:2], flush=i % 7 == 0)\n"
        "    return y\n"))
    for _ in range(3):
        report = check("ring_allreduce", mine, 4, timeout=120)
        assert report.passed, report.checks
        lines = {r: sum(ln.startswith("debug ") for ln in text.splitlines())
                 for r, text in report.output.items()}
        assert lines == {r: 35 * 600 for r in range(4)}, lines


# -- hints in levels -----------------------------------------------------------------
@pytest.mark.parametrize("name", list(EXERCISES))
def test_hints_come_one_level_at_a_time_and_are_remembered(tmp_path, capsys, name):
    levels = get(name).hints()
    assert len(levels) >= 3
    for k in range(1, len(levels) + 2):  # past the last level, the last one repeats
        assert ex_cli.main(["hint", name, "--dir", str(tmp_path)]) == 0
        out = capsys.readouterr().out
        level = min(k, len(levels))
        assert out.startswith(f"hint {level} of {len(levels)} for {name}:")
        assert levels[level - 1].strip() in out
    state = json.loads((tmp_path / ".minipar-hints.json").read_text())
    assert state == {name: len(levels)}
    assert ex_cli.main(["hint", name, "--dir", str(tmp_path), "--reset"]) == 0
    capsys.readouterr()
    assert ex_cli.main(["hint", name, "--dir", str(tmp_path)]) == 0
    assert capsys.readouterr().out.startswith(f"hint 1 of {len(levels)}")


def test_hint_levels_are_kept_per_exercise(tmp_path, capsys):
    for argv in (["ring_allreduce"], ["ring_allreduce"], ["ps_sync"]):
        assert ex_cli.main(["hint", *argv, "--dir", str(tmp_path)]) == 0
    capsys.readouterr()
    state = json.loads((tmp_path / ".minipar-hints.json").read_text())
    assert state == {"ring_allreduce": 2, "ps_sync": 1}
    assert ex_cli.main(["hint", "ring_allreduce", "--dir", str(tmp_path / "nope")]) == 2
    assert "no such folder" in capsys.readouterr().err


def test_the_skeleton_no_longer_hands_out_the_indices():
    """The step-by-step indices live in the last hint level, not in the skeleton."""
    for name, steps in [("ring_allreduce", "(r - s - 1) % N"), ("tree_broadcast", "vr & mask"),
                        ("dp_grad_sync", "chunks[(r - s) % N]"), ("zero1_step", "(r - s - 2) % N"),
                        ("ps_sync", "v *= momentum")]:
        ex = get(name)
        assert steps not in ex.skeleton_path.read_text(), name
        assert steps in ex.hints()[-1], name
        assert f"minipar exercise hint {name}" in ex.skeleton_path.read_text()


# -- the parameter-server exercise needs a server and a worker ----------------------------
def test_ps_sync_needs_two_ranks(capsys):
    with pytest.raises(ValueError, match="ps_sync needs at least 2 ranks"):
        check("ps_sync", get("ps_sync").solution_path, 1)
    assert ex_cli.main(["check", "ps_sync", "--solution", "-n", "1"]) == 2
    assert capsys.readouterr().err == ("minipar exercise check: -n 1: ps_sync needs at least 2 "
                                       "ranks (a server and at least one worker)\n")


@pytest.mark.parametrize("name", [e.name for e in EXERCISES.values() if e.min_ranks > 1
                                  and e.name != "ps_sync"])
def test_one_rank_is_refused_where_it_proves_nothing(name, capsys):
    # on one rank no message is sent: a reduce-scatter that assigns instead of adding passed
    assert ex_cli.main(["check", name, "--solution", "-n", "1"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith(f"minipar exercise check: -n 1: {name} needs "
                                                   "at least 2 ranks (on one rank nothing is sent")
    assert "try -n 4" in err
    with pytest.raises(ValueError, match=f"{name} needs at least 2 ranks"):
        check(name, get(name).solution_path, 1)


def test_remat_budget_is_graded_on_one_rank():
    assert get("remat_budget").min_ranks == 1  # each rank's own step: no message to get wrong


def test_every_option_has_help_showing_its_default(capsys):
    for action in ("start", "hint", "check"):
        assert cli.main(["exercise", action, "--help"]) == 0
        text = capsys.readouterr().out
        options = text.split("options:", 1)[1]
        entries = [e for e in options.split("\n  -")
                   if e.strip() and not e.lstrip().startswith("h,")]
        assert entries, text
        for entry in entries:
            assert "default" in " ".join(entry.split()), (action, entry)


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
