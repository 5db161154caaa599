"""Every verb refuses bad input in one line: exit 2, the option named, no traceback, no work done.

One parametrised test per verb (``minipar run`` / ``demo`` / the multi-rank
benches: tests/test_run_cli.py).  Each case goes through ``minipar.cli.main``
in-process, the way the console script runs it, and checks the contract of
:mod:`minipar.cli.options`: status 2, exactly one non-empty line on stderr
that names the option (and, where there is a short list, the allowed
values), nothing that looks like a traceback.  The work a verb would do
(training, grading, measuring) is replaced by a function that fails the
test, so "refused before any work" is checked, not timed.  Two cases run
through a real ``python -m minipar.cli`` process as well.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from conftest import STARTED, fake_mpiexec, run_minipar

from minipar import cli, launch


def refuse(argv: list[str], names: list[str], capsys: pytest.CaptureFixture[str]) -> str:
    """Run ``minipar ARGV``; assert the one-line contract and that the line contains ``names``."""
    assert cli.main(argv) == 2, argv
    out, err = capsys.readouterr()
    lines = [line for line in err.splitlines() if line.strip()]
    assert len(lines) == 1 and err.endswith("\n"), (argv, err)
    assert "Traceback" not in out + err and "usage:" not in err, (argv, err)
    assert lines[0].startswith(f"minipar {argv[0]}" if argv else "minipar"), (argv, lines[0])
    for name in names:
        assert name in lines[0], (argv, name, lines[0])
    return lines[0]


@pytest.fixture
def no_training(monkeypatch: pytest.MonkeyPatch) -> None:
    from minipar import train as T

    def trained(*args: object, **kwargs: object) -> None:
        raise AssertionError("bad input reached train()")

    monkeypatch.setattr(T, "train", trained)


TRAIN = [
    (["--steps", "0"], ["--steps", "a positive integer", "got 0"]),
    (["--steps", "ten"], ["--steps", "integer", "'ten'"]),
    (["--batch", "0"], ["--batch", "a positive integer"]),
    (["--lr", "0"], ["--lr", "> 0"]),
    (["--lr", "-0.1"], ["--lr", "> 0"]),
    (["--lr", "nan"], ["--lr", "finite"]),
    (["--heads", "3"], ["--heads 3", "--d-model 64", "1, 2, 4, 8, 16, 32, 64"]),
    (["--d-model", "30", "--heads", "4"], ["--heads 4", "--d-model 30", "1, 2, 3, 5"]),
    (["--kv-heads", "3"], ["--kv-heads 3", "--heads 4", "one of 1, 2, 4"]),
    (["--layers", "0"], ["--layers", "a positive integer"]),
    (["--d-model", "0"], ["--d-model", "a positive integer"]),
    (["--d-model", "-8"], ["--d-model", "a positive integer"]),
    (["--experts", "-1"], ["--experts", ">= 0"]),
    (["--experts", "4", "--top-k", "3"], ["--top-k", "1", "2"]),
    (["--experts", "4", "--top-k", "0"], ["--top-k", "1", "2"]),
    (["--experts", "1", "--top-k", "2"], ["--top-k 2", "--experts 1", "must be 1"]),
    (["--top-k", "2"], ["--top-k", "--experts"]),
    (["--vocab", "1"], ["--vocab", ">= 2"]),
    (["--seq", "1"], ["--seq", ">= 2"]),
    (["--seed", "-1"], ["--seed", ">= 0"]),
    (["--model", "mlp", "--heads", "2"], ["--heads", "--model gpt"]),
    (["--hidden", "32"], ["--hidden", "--model mlp"]),
    (["--model", "mlp", "--hidden", "0"], ["--hidden", "a positive integer"]),
    (["--model", "cnn"], ["--model", "gpt", "mlp"]),
    (["--precision", "fp4"], ["--precision", "float64", "mixed-fp16", "fp8"]),
    (["--precision", "fp8", "--optimizer", "sgd"], ["--precision fp8", "--optimizer adamw"]),
    (["--precision", "fp8", "--fp8-block", "0"], ["--fp8-block", "a positive integer"]),
    (["--fp8-scaling", "delayed"], ["--fp8-scaling", "block", "tensor"]),
    (["--model", "mlp", "--precision", "fp8"], ["--precision fp8", "--model gpt"]),
    (["--fp8-block", "64"], ["--fp8-block", "--precision fp8", "--precision float32"]),
    (["--precision", "fp8", "--fp8-block", "100000"], ["--fp8-block", "from 1 to 256"]),
    (["--precision", "fp8", "--fp8-scaling", "tensor", "--fp8-block", "64"],
     ["--fp8-block", "--fp8-scaling block"]),
    (["--optimizer", "lion"], ["--optimizer", "adamw", "sgd"]),
    (["--json-out", "/no/such/folder/curve.json"], ["--json-out", "/no/such/folder", "does not exist"]),
    (["--d-model", "200000"], ["parameters", "GB", "--d-model"]),
    (["--steps"], ["--steps", "expected one argument", "--help"]),
    (["--bogus"], ["--bogus", "--help"]),
]


@pytest.mark.parametrize("argv, names", TRAIN, ids=[" ".join(a) for a, _ in TRAIN])
def test_train(argv: list[str], names: list[str], no_training: None,
               capsys: pytest.CaptureFixture[str]) -> None:
    refuse(["train", *argv], names, capsys)


def test_train_json_into_a_folder_path(tmp_path: Path, no_training: None,
                                       capsys: pytest.CaptureFixture[str]) -> None:
    refuse(["train", "--json-out", str(tmp_path)], ["--json-out", "is a folder"], capsys)
    blocker = tmp_path / "file.txt"
    blocker.write_text("")
    refuse(["train", "--json-out", str(blocker / "curve.json")], ["--json-out", "is not a folder"], capsys)


PLAN = [
    (["--params", "1e9", "-n", "0"], ["-n/--ranks", "from 1 to 1e12", "got 0"]),
    (["--params", "1e9", "-n", "10000000000000"], ["-n/--ranks", "1e12"]),
    (["--params", "-1", "-n", "4"], ["--params", "from 1 to 1e+30"]),
    (["--params", "0", "-n", "4"], ["--params", "from 1"]),
    (["--params", "0.5", "-n", "4"], ["--params", "whole number"]),
    (["--params", "1e31", "-n", "4"], ["--params", "1e+30"]),
    (["--params", "1e400", "-n", "4"], ["--params", "1e+30"]),
    (["--params", "inf", "-n", "4"], ["--params", "1e+30"]),
    (["--params", "lots", "-n", "4"], ["--params", "7.5B"]),
    (["--params", "1e9"], ["-n/--ranks", "required", "--help"]),
    (["-n", "4"], ["--params", "--gpt", "required"]),
    (["--params", "1e9", "--gpt", "1,2,3,4", "-n", "4"], ["--gpt", "--params"]),
    (["--params", "1e9", "-n", "4", "--tp", "2"], ["--tp", "--gpt"]),
    (["--gpt", "1,2,3", "-n", "4"], ["--gpt", "n_layer,d_model,vocab,n_ctx"]),
    (["--gpt", "2,0,100,16", "-n", "4"], ["--gpt", "from 1 to 1e12"]),
    (["--gpt", "2,64,100,16", "-n", "4", "--heads", "3"],
     ["--heads 3", "d_model 64", "1, 2, 4, 8, 16, 32, 64"]),
    (["--gpt", "2,64,100,16", "-n", "4", "--heads", "4", "--tp", "3"],
     ["--tp 3", "4 heads", "one of 1, 2, 4"]),
    (["--gpt", "2,64,100,16", "-n", "4", "--tp", "2"], ["--tp 2", "1 heads"]),  # default: 64/64
    (["--gpt", "2,64,100,16", "-n", "4", "--heads", "2", "--tp", "2", "--d-ff", "3"],
     ["--tp 2", "--d-ff 3"]),
    (["--gpt", "2,64,100,16", "-n", "4", "--tp", "0"], ["--tp", "from 1"]),
    (["--gpt", "2,64,100,16", "-n", "4", "--seq", "0"], ["--seq", "from 1"]),
    (["--gpt", "2,64,100,16", "-n", "4", "--experts", "-1"], ["--experts", "from 0"]),
    (["--gpt", "2,64,100,16", "-n", "4", "--moe-every", "2"], ["--moe-every", "--experts"]),
    (["--gpt", "2,64,100,16", "-n", "4", "--experts", "2", "--moe-every", "3"],
     ["--moe-every", "n_layer = 2"]),
    (["--gpt", "1000000000000,1000000000000,1000,1000", "-n", "4"], ["--gpt", "parameters", "1e+30"]),
]


@pytest.mark.parametrize("argv, names", PLAN, ids=[" ".join(a) for a, _ in PLAN])
def test_plan(argv: list[str], names: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    refuse(["plan", *argv], names, capsys)


def test_glossary(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    blocker = tmp_path / "file.txt"
    blocker.write_text("")
    cases = [
        (["--export-md", str(tmp_path / "missing" / "g.md")], ["--export-md", "does not exist"]),
        (["--export-md", str(tmp_path)], ["--export-md", "is a folder"]),
        (["--export-md", str(blocker / "g.md")], ["--export-md", "is not a folder"]),
        (["--export-md"], ["--export-md", "expected one argument"]),
        (["--lang", "de", "all-reduce"], ["--lang", "en", "ru", "zh"]),
        (["--list", "--scan", "-"], ["--scan", "--list"]),
        (["--scan", str(tmp_path / "nope.txt")], ["cannot read", "nope.txt"]),
        (["--bogus"], ["--bogus", "--help"]),
        ([], ["empty query"]),
    ]
    for argv, names in cases:
        refuse(["glossary", *argv], names, capsys)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["file.txt"]  # no folder was created


@pytest.fixture
def no_grading(monkeypatch: pytest.MonkeyPatch) -> None:
    from minipar.exercises import grading

    def graded(*args: object, **kwargs: object) -> None:
        raise AssertionError("bad input reached the grader")

    monkeypatch.setattr(grading, "check", graded)


def test_exercise(tmp_path: Path, no_grading: None, capsys: pytest.CaptureFixture[str]) -> None:
    blocker = tmp_path / "file.txt"
    blocker.write_text("")
    sol = str(tmp_path / "ring_allreduce.py")
    cases = [
        (["start", "ring_allgather"], ["NAME", "ring_allreduce", "zero1_step"]),
        (["start"], ["NAME", "required"]),
        (["start", "ring_allreduce", "--dir", str(blocker)], ["--dir", "is a file"]),
        (["start", "ring_allreduce", "--dir", str(blocker / "sub")], ["--dir", "cannot create"]),
        (["check", "ring_allgather", sol], ["NAME", "tree_broadcast"]),
        (["check", "ring_allreduce", sol], ["FILE", "no such file", "exercise start"]),
        (["check", "ring_allreduce", str(tmp_path)], ["FILE", "is a folder"]),
        (["check", "ring_allreduce"], ["FILE", "--solution"]),
        (["check", "ring_allreduce", sol, "--solution"], ["FILE", "--solution"]),
        (["check", "ring_allreduce", "--solution", "-n", "0"], ["-n", "from 1 to 128"]),
        (["check", "ring_allreduce", "--solution", "-n", "4000"], ["-n", "from 1 to 128"]),
        (["check", "ring_allreduce", "--solution", "--timeout", "0"], ["--timeout", "> 0"]),
        (["check", "ring_allreduce", "--solution", "--watchdog", "-1"], ["--watchdog", "> 0"]),
        (["check", "ring_allreduce", "--solution", "--watchdog", "90"],
         ["--watchdog 90", "--timeout 60"]),
        ([], ["ACTION", "required"]),
        (["grade"], ["ACTION", "list", "start", "check"]),
    ]
    for argv, names in cases:
        refuse(["exercise", *argv], names, capsys)


def test_bench(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
               capsys: pytest.CaptureFixture[str]) -> None:
    from minipar.bench import model as bench_model

    def measured(*args: object, **kwargs: object) -> None:
        raise AssertionError("bad input reached the measurement")

    monkeypatch.setattr(bench_model.subprocess, "run", measured)
    cases = [
        (["frob"], ["'frob'", "collectives", "glossary"]),
        (["model", "--repeat", "0"], ["--repeat", "a positive integer"]),
        (["model", "--sizes", "huge"], ["--sizes", "tiny", "large"]),
        (["model", "--sizes"], ["--sizes", "expected"]),
        (["model", "--json-out", str(tmp_path / "missing" / "rows.json")], ["--json-out", "does not exist"]),
        (["model", "--json-out", str(tmp_path)], ["--json-out", "is a folder"]),
        (["train", "--steps", "0"], ["--steps", "a positive integer"]),
        (["train", "--heads", "3"], ["--heads", "--d-model"]),
        (["glossary", "--repeat", "0"], ["--repeat", "a positive integer"]),
        (["glossary", "--runs", "-1"], ["--runs", "a positive integer"]),
        (["glossary", "--bogus"], ["--bogus"]),
    ]
    for argv, names in cases:
        refuse(["bench", *argv], names, capsys)


def test_checkpoint(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                    capsys: pytest.CaptureFixture[str]) -> None:
    """Usage errors of ``minipar checkpoint``; a damaged or partial checkpoint is
    tests/test_checkpoint_cli.py's."""
    from minipar.parallel import checkpoint

    def exported(*args: object, **kwargs: object) -> None:
        raise AssertionError("bad input reached the export")

    monkeypatch.setattr(checkpoint, "export", exported)
    (tmp_path / "empty").mkdir()
    there = tmp_path / "there.safetensors"
    there.write_text("")
    cases = [
        ([], ["COMMAND", "required"]),
        (["show", "x"], ["'show'", "info", "export"]),
        (["info"], ["DIR", "required"]),
        (["info", str(tmp_path / "nope")], ["nope does not exist"]),
        (["info", str(tmp_path / "empty")], ["no complete checkpoint", "empty"]),
        (["info", str(there)], ["there.safetensors is a file"]),
        (["export", str(tmp_path)], ["OUT.safetensors", "required"]),
        (["export", str(tmp_path), str(tmp_path / "missing" / "m.safetensors")],
         ["OUT.safetensors", "missing does not exist"]),
        (["export", str(tmp_path), str(tmp_path)], ["OUT.safetensors", "is a folder"]),
        (["export", str(tmp_path), str(tmp_path / "m.npz")], ["must end in .safetensors"]),
        (["export", str(tmp_path), str(there)], ["there.safetensors exists", "--force"]),
        (["export", str(tmp_path), str(tmp_path / "m.safetensors"), "--kind", "moments"],
         ["--kind", "param", "master"]),
    ]
    for argv, names in cases:
        refuse(["checkpoint", *argv], names, capsys)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["empty", "there.safetensors"]


DURATIONS = [
    ["run", "dp", "--timeout", "3e6"], ["run", "dp", "--timeout", "1e10"],
    ["run", "dp", "--timeout", "inf"], ["demo", "--timeout", "3e6"],
    ["bench", "collectives", "--timeout", "1e10"], ["bench", "dp", "--timeout", "3e6"],
    ["bench", "zero", "--timeout", "1e10"], ["bench", "wait", "--timeout", "3e6"],
    ["exercise", "check", "ring_allreduce", "--solution", "--timeout", "3e6"],
    ["exercise", "check", "ring_allreduce", "--solution", "--watchdog", "1e10"],
]


@pytest.mark.parametrize("argv", DURATIONS, ids=[" ".join(a) for a in DURATIONS])
def test_a_duration_past_1e6_seconds(argv: list[str], tmp_path: Path, no_grading: None,
                                     monkeypatch: pytest.MonkeyPatch,
                                     capsys: pytest.CaptureFixture[str]) -> None:
    """Past ~2.1e6 s the operating system's wait overflows (it crashed with
    ``OverflowError: timeout is too large``); every --timeout / --watchdog says its range."""
    monkeypatch.setenv(launch.MPIEXEC_VAR, str(fake_mpiexec(tmp_path)))
    option = argv[-2]
    line = f"{option} must be a number of seconds > 0 and at most 1e6 (11.6 days), got {argv[-1]}"
    refuse(argv, [line], capsys)
    assert not (tmp_path / STARTED).exists(), "mpiexec was started for a bad option"


def test_unknown_verb(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["frobnicate"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "'frobnicate'" in err and "train" in err and "plan" in err


@pytest.mark.parametrize("argv, line", [
    (["train", "--steps", "0"], "minipar train: --steps must be a positive integer, got 0"),
    (["plan", "--params", "1e31", "-n", "4"], ("minipar plan: --params must be a whole number "
     "of parameters from 1 to 1e+30 (examples: 7.5e9, 7.5B, 1T), got '1e31'")),
    (["glossary", "--export-md", "/no/such/folder/g.md"], ("minipar glossary: --export-md: "
     "cannot write /no/such/folder/g.md: the folder /no/such/folder does not exist (minipar "
     "does not create it)")),
])
def test_through_a_real_process(argv: list[str], line: str) -> None:
    proc = run_minipar(*argv, timeout=60)
    assert (proc.returncode, proc.stderr, proc.stdout) == (2, line + "\n", "")
