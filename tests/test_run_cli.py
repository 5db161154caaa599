"""`minipar run`: every bad option is one line and exit 2 before MPI starts; every
strategy's good run prints the verdict; a failure of the ranks is one line.

The bad inputs run through the real command (`python -m minipar.cli run ...`)
with ``MINIPAR_MPIEXEC`` pointing at a stand-in that only leaves a mark: the
mark must not exist afterwards (no MPI launch), and the child's CPU time must
stay well under a second (the check needs no model, no rank).
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import refused_before_mpi, run_minipar

from minipar import launch, run

#: (arguments after `minipar run`, what the one line must name)
BAD = [
    (["zero", "--stage", "7"], "--stage"),
    (["dp", "-n", "20"], "--batch"),
    (["dp", "--heads", "3"], "--heads"),
    (["ps", "-n", "1"], "-n"),
    (["ps", "--servers", "0"], "--servers"),
    (["dp", "--timeout", "0"], "--timeout"),
    (["dp", "--timeout", "3e6"], "--timeout"),
    (["dp", "--precision", "foo"], "--precision"),
    (["zero", "--precision", "fp8", "--optimizer", "sgd"], "--optimizer adamw"),
    (["tp", "--precision", "fp8", "--fp8-block", "0"], "--fp8-block"),
    (["dp", "--fp8-scaling", "delayed"], "--fp8-scaling"),
    (["tp", "-n", "2", "--experts", "2", "--precision", "fp8"], "--fp8-block 32"),
    (["dp", "--fp8-scaling", "tensor"], "--fp8-scaling sets the recipe of --precision fp8"),
    (["dp", "--precision", "fp8", "--fp8-block", "100000"], "--fp8-block must be an integer"),
    (["dp", "--precision", "fp8", "--fp8-scaling", "tensor", "--fp8-block", "64"],
     "drop --fp8-block"),
    (["dp", "--bucket-mb", "0"], "--bucket-mb"),
    (["dp", "--lr", "0"], "--lr"),
    (["ps", "--staleness", "2"], "--async"),
    (["ps", "--async", "--staleness", "-1"], "--staleness"),
    (["ps", "-n", "12", "--servers", "3", "--batch", "8"], "--batch"),
    (["ps", "--precision", "mixed-fp16"], "--precision"),
    (["zero", "-n", "3", "--batch", "2"], "--batch"),
    (["zero", "--stage", "3", "--prefetch", "-1"], "--prefetch"),
    (["zero", "--prefetch", "1"], "--prefetch is stage 3's"),
    (["zero", "--stage", "2", "--no-reshard-after-forward"], "--no-reshard-after-forward"),
    (["zero", "--stage", "2", "--zeropp", "qwz"], "--zeropp is ZeRO-3's"),
    (["zero", "--stage", "3", "--zeropp", "qwz,fast"], "--zeropp: unknown part 'fast'"),
    (["zero", "--stage", "3", "--zeropp", "qgz", "--zeropp-block", "0"], "--zeropp-block"),
    (["zero", "-n", "4", "--stage", "3", "--zeropp", "hpz", "--node", "3"], "--node 3"),
    (["tp", "-n", "2", "--tp", "1", "--tp-overlap"], "--tp-overlap needs tensor parallelism"),
    (["sp", "-n", "1", "--tp-overlap"], "--tp-overlap"),
    (["hybrid", "-n", "4", "--pp", "2", "--tp-overlap"], "--tp-overlap needs tensor"),
    (["hybrid", "-n", "4", "--pp", "2", "--zero", "1", "--prefetch", "1"], "--prefetch"),
    (["hybrid", "-n", "4", "--pp", "2", "--zero", "2", "--no-reshard-after-forward"],
     "--no-reshard-after-forward is ZeRO-3's"),
    (["dp", "--algorithm", "tree"], "--algorithm"),
    (["dp", "--steps", "x"], "--steps"),
    (["dp", "--frobnicate"], "--frobnicate"),
    (["dp", "--hostfile", "/no/such/hostfile"], "--hostfile"),
    (["dp", "--hostfile", "/tmp"], "is a folder, not a file"),
    (["dp", "-n", "4", "--node", "3"], "--node 3 does not divide -n 4"),
    (["dp", "--node", "0"], "--node"),
    (["warp"], "strategy"),
    (["hybrid", "-n", "8", "--dp", "3", "--tp", "2", "--pp", "2"], "number of ranks, 8"),
    (["hybrid", "-n", "8", "--tp", "8"], "heads"),
    (["hybrid", "-n", "8", "--pp", "8"], "layers"),
    (["hybrid", "-n", "4", "--ep", "4", "--experts", "2", "--batch", "8"], "--experts"),
    (["hybrid", "-n", "4", "--ep", "3", "--experts", "3"], "dp·cp"),
]


def _cli(*args: str, env: dict[str, str] | None = None,
         timeout: float = 120) -> subprocess.CompletedProcess[str]:
    return run_minipar("run", *args, env=env, timeout=timeout)


@pytest.mark.parametrize("args,option", BAD, ids=[" ".join(a) for a, _ in BAD])
def test_a_bad_option_is_one_line_and_exit_2_before_mpi(args: list[str], option: str,
                                                        tmp_path: Path) -> None:
    line = refused_before_mpi(["run", *args], tmp_path).stderr.strip()
    assert line.startswith("minipar run: ") and option in line, line


def test_a_refusal_never_starts_mpi_in_the_launcher() -> None:
    """What makes a refusal cheap, checked without a clock (a CPU-time bound failed under
    load, 1.02-1.04 s against 1.0): the launching process checks every option without
    importing mpi4py.MPI, which would start MPI."""
    probe = ("import sys\nfrom minipar import cli\n"
             "rc = cli.main(['run', 'hybrid', '-n', '8', '--dp', '3', '--tp', '2', '--pp', '2'])\n"
             "print(rc, 'mpi4py.MPI' in sys.modules)")
    proc = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True,
                          timeout=120, check=False)
    assert proc.stdout.split() == ["2", "False"], proc.stdout + proc.stderr


TINY = ["--steps", "2", "--timeout", "120"]


@pytest.mark.parametrize("args,verdict", [
    (["dp", "-n", "3", "--bucket-bytes", "4096"], "final parameters: equal to the serial run"),
    (["ps", "-n", "3", "--servers", "2"], "final parameters: equal to the serial run"),
    (["zero", "-n", "3", "--stage", "3", "--prefetch", "1"],
     "final parameters: equal to the serial run"),
    (["ps", "-n", "3", "--async", "--staleness", "2"],
     ("final parameters: not comparable: asynchronous updates with staleness 2 apply gradients "
      "to newer parameters than they were computed on")),
    (["dp", "-n", "2", "--precision", "float32"],
     "final parameters: not comparable: float32 sums across ranks round in another order"),
    (["zero", "-n", "2", "--stage", "2", "--precision", "mixed"],
     "final parameters: not comparable: mixed keeps 16-bit gradients"),
], ids=["dp", "ps", "zero", "ps-async", "dp-float32", "zero-mixed"])
def test_each_strategy_prints_its_verdict(args: list[str], verdict: str) -> None:
    proc = _cli(*args, *TINY)
    assert proc.returncode == 0, proc.stderr[-2000:]
    lines = proc.stdout.splitlines()
    assert lines[0].startswith(f"minipar run {args[0]}: ") and "2 steps" in lines[0]
    assert sum(ln.startswith(verdict) for ln in lines) == 1, proc.stdout
    word = "not compared with" if "not comparable" in verdict else "equal to"
    assert lines[1].startswith(f"look first: {word} the serial run"), lines[1]


def test_the_issue_command_is_equal_to_the_serial_run() -> None:
    """Issue 8: this printed 'DIFFERENT (max |diff| = 1.29e-13)' and exited 1."""
    proc = _cli("dp", "-n", "2", "--d-model", "40", "--layers", "3", "--heads", "4",
                "--vocab", "29", "--seq", "10", "--batch", "14", "--steps", "3")
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "final parameters: equal to the serial run" in proc.stdout


def test_fp8_tp_equals_the_serial_fp8_run_and_counts_its_amax_bytes(
        capsys: pytest.CaptureFixture[str]) -> None:
    """Tiles of 6 across tensor-parallel slices of 8: the amax all-reduces make every rank
    quantize as the serial run; the FP8 verdict holds, the bytes equal the formula."""
    from minipar.run.summary import not_comparable_reason

    rc = run.main(["tp", "-n", "2", "--steps", "2", "--precision", "fp8", "--fp8-block", "6",
                   "--json"])
    s = json.loads(capsys.readouterr().out)
    assert rc == 0 and s["verdict"]["status"] == "equal" and s["parity"] is True
    assert s["verdict"]["tolerance"] == 0.2 and s["parity_expected"]
    by_op = s["bytes_by_op_per_rank"][0]
    assert by_op["fp8_amax"] > 0
    assert s["tp_axis_bytes_exact_per_rank"][0] == s["bytes_by_axis_per_rank"][0]["tp"]
    assert (s["precision"], s["fp8_scaling"], s["fp8_block"]) == ("fp8", "block", 6)
    assert "1x6 tiles" in s["fp8_recipe"] and any(n.startswith("fp8_amax: ") for n in s["notes"])
    tensor = {"precision": "fp8", "fp8_scaling": "tensor"}
    reason = not_comparable_reason({"strategy": "pp", **tensor})
    assert "per-tensor" in reason and "micro-batch" in reason and "delayed scaling" in reason
    assert "micro-batch" in not_comparable_reason({"strategy": "hybrid", "micro_batches": 2,
                                                   **tensor})
    assert "--tp-overlap" in not_comparable_reason({"strategy": "tp", "tp_overlap": True,
                                                    **tensor})
    assert "experts" in not_comparable_reason({"strategy": "dp", "experts": 4, **tensor})
    assert "ep does not" in not_comparable_reason({"strategy": "ep", **tensor})
    for strategy in ("dp", "zero", "tp", "sp", "cp"):
        assert not_comparable_reason({"strategy": strategy, "experts": 0, **tensor}) is None
    assert not_comparable_reason({"strategy": "hybrid", "pp": 1, "micro_batches": 1,
                                  **tensor}) is None
    # per tensor on tp: W's slices, the cut x and dy (in dgrad and wgrad) reduced over tp
    rc = run.main(["tp", "-n", "2", "--steps", "2", "--precision", "fp8", "--fp8-scaling",
                   "tensor", "--json"])
    s = json.loads(capsys.readouterr().out)
    assert rc == 0 and s["verdict"]["status"] == "equal" and s["parity"] is True
    assert s["tp_axis_bytes_exact_per_rank"][0] == s["bytes_by_axis_per_rank"][0]["tp"]
    assert s["bytes_by_op_per_rank"][0]["fp8_amax"] == 2 * 4 * 4 * 4  # L·4 layers·4·4 B
    # per tensor on dp: every amax all-reduced over the rows' ranks, equal, bytes = formula
    rc = run.main(["dp", "-n", "2", "--steps", "2", "--precision", "fp8", "--fp8-scaling",
                   "tensor", "--json"])
    s = json.loads(capsys.readouterr().out)
    assert rc == 0 and s["verdict"]["status"] == "equal" and s["parity"] is True
    assert any("per rank per step: 128, 128 B; exact 128, 128" in n for n in s["notes"])
    # what ran, in the JSON and one line: the recipe (none of it FP8 but the GEMMs)
    assert (s["precision"], s["fp8_scaling"], s["fp8_block"]) == ("fp8", "tensor", None)
    assert s["fp8_gemms_per_pass"] == 3 * 4 * 2 and "E5M2 gradients" in s["fp8_recipe"]
    assert "optimizer states of fp8" not in s["model_state_formula_text"]
    from minipar.run.summary import format_summary

    assert format_summary(s).splitlines()[2] == s["fp8_recipe"]


def test_json_view_and_a_hostfile_that_lists_localhost(tmp_path: Path,
                                                       capsys: pytest.CaptureFixture[str]) -> None:
    hosts = tmp_path / "hosts"
    hosts.write_text("localhost\n")
    rc = run.main(["dp", "-n", "2", "--steps", "2", "--hostfile", str(hosts), "--json"])
    out = capsys.readouterr().out
    assert rc == 0, out
    s = json.loads(out)
    assert s["strategy"] == "dp" and s["ranks"] == 2 and s["steps"] == 2
    assert s["verdict"]["status"] == "equal" and s["parity"] is True and s["parity_expected"]
    assert s["max_param_diff"] == s["verdict"]["max_param_diff"] < 1e-10
    assert s["verdict"]["line"].startswith("final parameters: equal to the serial run")
    for key in ("losses", "serial_losses", "bytes_sent_per_rank", "bytes_formula",
                "bytes_formula_text", "model_state_bytes_per_rank", "model_state_formula",
                "model_state_formula_text", "notes"):
        assert key in s, key


def test_a_failure_of_the_ranks_is_one_line_and_debug_shows_the_tracebacks() -> None:
    """A watchdog setting that is not a number fails on the ranks (the launcher never
    reads it): every rank raises ValueError as it builds its communicator."""
    env = {"MINIPAR_WATCHDOG_S": "soon"}
    short = _cli("dp", "-n", "2", "--steps", "1", env=env)
    assert short.returncode == 1
    lines = short.stderr.strip().splitlines()
    assert len(lines) == 1, short.stderr
    assert lines[0].startswith("[minipar] rank ") and " of 2 failed: ValueError: " in lines[0]
    assert "MINIPAR_WATCHDOG_S" in lines[0] and "--debug" in lines[0]
    assert "Traceback" not in short.stderr + short.stdout and "MPI_Abort" not in short.stderr
    full = _cli("dp", "-n", "2", "--steps", "1", "--debug", env=env)
    assert full.returncode == 1 and "Traceback" in full.stderr
    assert full.stderr.strip().splitlines()[-1].startswith("[minipar] rank ")


def test_a_run_past_its_timeout_is_one_line() -> None:
    """Thousands of steps of a wider model cannot end within a second."""
    proc = _cli("dp", "-n", "2", "--steps", "5000", "--d-model", "128", "--heads", "4",
                "--seq", "32", "--batch", "16", "--timeout", "1")
    assert proc.returncode == 1
    assert proc.stderr.strip().splitlines() == [
        ("minipar run dp: the ranks did not finish within --timeout 1 s and were all killed "
         "(--debug shows every rank's output)")]


def test_an_mpiexec_that_cannot_start_is_one_line() -> None:
    """A wrong MINIPAR_MPIEXEC printed a 16-line traceback ending in LaunchError."""
    proc = _cli("dp", "-n", "2", "--steps", "1", env={launch.MPIEXEC_VAR: "/nonexistent"})
    assert (proc.returncode, proc.stdout) == (1, "")
    assert proc.stderr.splitlines() == [
        ("minipar run dp: cannot start '/nonexistent', named by MINIPAR_MPIEXEC: No such file "
         "or directory; set MINIPAR_MPIEXEC to an mpiexec, or unset it to use this "
         "environment's own")]


LAUNCHING = [["demo"], ["bench", "collectives"], ["bench", "dp"], ["bench", "zero"],
             ["bench", "wait"], ["exercise", "check", "ring_allreduce", "--solution"]]


@pytest.mark.parametrize("argv", LAUNCHING, ids=[" ".join(a) for a in LAUNCHING])
@pytest.mark.parametrize("var,value,words", [
    (launch.MPIEXEC_VAR, "/nonexistent", "cannot start '/nonexistent', named by MINIPAR_MPIEXEC"),
    (launch.MPIEXEC_ARGS_VAR, '-genv "X', "MINIPAR_MPIEXEC_ARGS='-genv \"X' cannot be split"),
], ids=["no-such-mpiexec", "unclosed-quote"])
def test_every_launching_command_says_why_mpiexec_did_not_start(
        argv: list[str], var: str, value: str, words: str, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    from minipar import cli

    monkeypatch.setenv(var, value)
    assert cli.main(argv) == 1
    out, err = capsys.readouterr()
    prog = "minipar " + " ".join(argv[:2] if argv[0] != "demo" else argv[:1])
    # the exercise grader first says what it is about to run ("running FILE on N ranks ...")
    lines = [ln for ln in err.splitlines() if not ln.startswith("running ")]
    assert len(lines) == 1 and lines[0].startswith(f"{prog}: {words}"), err
    assert "Traceback" not in out + err


def test_exit_status_follows_the_verdict(monkeypatch: pytest.MonkeyPatch,
                                         capsys: pytest.CaptureFixture[str]) -> None:
    """1 only for "different"; "not comparable" is not a failure."""
    for status, rc in (("equal", 0), ("not comparable", 0), ("different", 1)):
        summary = {"strategy": "dp", "ranks": 2, "steps": 1, "losses": [1.0],
                   "serial_losses": [1.0],
                   "verdict": {"status": status, "line": f"verdict {status}"}}

        def fake(*args: object, summary: dict = summary, **kwargs: object) -> tuple:
            return summary, launch.Launched([], 0, "", "")

        monkeypatch.setattr(launch, "run_json", fake)
        assert run.main(["dp", "-n", "2", "--steps", "1"]) == rc
        assert f"verdict {status}" in capsys.readouterr().out


def test_launcher_side_copies_agree_with_the_technique_modules() -> None:
    """`minipar run` cannot import the technique modules (they start MPI): its copies
    of their choices must stay equal to the originals."""
    from minipar.parallel.data_parallel import engine as dp_engine
    from minipar.parallel.zero import engine as zero
    from minipar.run import dp as run_dp
    from minipar.run import zero as run_zero

    assert run_dp.ALGORITHMS == dp_engine.ALGORITHMS
    assert run_dp.DEFAULT_BUCKET_MB == dp_engine.DEFAULT_BUCKET_MB
    assert run_zero.STAGES == zero.STAGES


def test_a_planned_strategy_says_it_is_planned(capsys: pytest.CaptureFixture[str],
                                               monkeypatch: pytest.MonkeyPatch) -> None:
    """A planned strategy says what it is and that it is not built yet, not "invalid
    choice" (every strategy is built now: the mechanism, on a stand-in row)."""
    from minipar.registry import PLANNED_STRATEGIES, STRATEGIES

    assert not set(PLANNED_STRATEGIES) & set(STRATEGIES)  # a strategy that lands leaves the list
    monkeypatch.setattr(run.options, "PLANNED_STRATEGIES", {"warp": "warp-speed parallelism"})
    with pytest.raises(SystemExit) as e:
        run.options.parse(["warp", "-n", "4"])
    assert e.value.code == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "warp-speed parallelism" in err and "planned" in err


#: the strategies' options tests/test_strategies.py's one case per strategy does not reach,
#: each once on the device stand-in: (argv, what the summary's JSON must hold equal)
STAND_IN = [
    (["train", "--model", "mlp", "--precision", "float64", "--steps", "3"], "mlp"),
    (["run", "zero", "-n", "2", "--stage", "3", "--remat", "--offload", "host"], "zero3"),
    (["run", "pp", "-n", "2", "--schedule", "gpipe", "--remat", "--offload", "disk"], "gpipe"),
    (["run", "pp", "-n", "2", "--schedule", "1f1b"], "1f1b"),
    (["run", "cp", "-n", "2", "--kind", "ulysses"], "ulysses"),
]


@pytest.mark.parametrize("argv, name", STAND_IN, ids=[n for _, n in STAND_IN])
def test_on_the_device_stand_in_runs_equal_numpys_to_the_bit(argv, name, tmp_path) -> None:
    """MINIPAR_BACKEND=strict (CuPy's rules on NumPy: tests/test_strict_device.py): the
    same losses as on NumPy, to the bit, and for a parallel run the same verdict."""
    out = {}
    for backend in ("strict", "numpy"):
        proc = run_minipar(*argv, "--steps", "2", "--json", env={"MINIPAR_BACKEND": backend},
                           timeout=240) if argv[0] == "run" else run_minipar(
            *argv, "--json", "--quiet", env={"MINIPAR_BACKEND": backend}, timeout=240)
        assert proc.returncode == 0, proc.stderr[-2000:]
        out[backend] = json.loads(proc.stdout)
    s, n = out["strict"], out["numpy"]
    assert s["losses"] == n["losses"]
    if argv[0] == "run":
        assert s["verdict"] == n["verdict"] and s["verdict"]["status"] == "equal"
        assert s["backend"] == "strict" and min(s["staged_d2h_per_rank"]) > 0
        assert all(t["d2h_calls"] > 0 and t["h2d_bytes"] > 0 for t in s["transfers_per_rank"])
        assert "transfers_per_rank" not in n


def test_a_checkpoint_saved_on_the_stand_in_resumes_and_samples_as_on_numpy(tmp_path) -> None:
    """Sharded checkpoints and resume across the device boundary (to_host on save, the
    array's own module on load), and sampling from the saved model."""
    got = {}
    for backend in ("strict", "numpy"):
        env = {"MINIPAR_BACKEND": backend}
        d = tmp_path / backend
        first = run_minipar("run", "tp", "-n", "2", "--text", "--steps", "2", "--save", str(d),
                            env=env, timeout=240)
        assert first.returncode == 0, first.stderr[-2000:]
        second = run_minipar("run", "tp", "-n", "2", "--text", "--steps", "3", "--resume",
                             str(d), "--json", env=env, timeout=240)
        assert second.returncode == 0, second.stderr[-2000:]
        sample = run_minipar("sample", str(d), "--tokens", "12", "--seed", "1", env=env)
        assert sample.returncode == 0, sample.stderr[-2000:]
        got[backend] = (json.loads(second.stdout)["losses"], sample.stdout)
    assert got["strict"] == got["numpy"]


def test_a_summary_opens_with_the_line_to_look_at_first() -> None:
    """The verdict and the one number that teaches come first, the details below: the
    DP run's bytes above the paper's figure are explained on that same line."""
    from minipar.run.dp import headline
    from minipar.run.summary import format_summary, look_first

    base = {"strategy": "dp", "ranks": 4, "steps": 1, "losses": [1.0], "serial_losses": [1.0],
            "verdict": {"status": "equal", "line": "final parameters: equal"}}
    auto = headline(112640, 84480, "auto", ["recursive_doubling"])
    assert auto.startswith("112,640 B sent per rank per step, not the paper's 2(N-1)/N x S = "
                           "84,480: the buckets ran recursive doubling (auto chose it")
    assert "--algorithm ring gives the paper's figure" in auto
    assert headline(84480, 84480, "ring", ["ring"]).endswith("= the ring's 2(N-1)/N x S, "
                                                              "the paper's figure")
    text = format_summary({**base, "headline": auto})
    assert text.splitlines()[1] == "look first: equal to the serial run; " + auto
    # without a headline: the bytes against the formula, else the memory against its own
    assert look_first({**base, "bytes_sent_per_rank": [10, 12], "bytes_formula": 12}) == (
        "look first: equal to the serial run; 12 B sent per rank per step = the paper's figure 12")
    assert look_first({**base, "verdict": {"status": "different"},
                       "model_state_bytes_per_rank": [9], "model_state_formula": 8}) == (
        "look first: DIFFERENT from the serial run; 9 B of model state held per rank vs the "
        "formula's 8")
    assert look_first({**base, "bubble_measured": {"rebuilt": 0.25}, "bubble_formula": 0.2}) == (
        "look first: equal to the serial run; bubble 0.250 (rebuilt from measured costs) vs the "
        "formula's 0.200")


def test_a_pipeline_on_more_ranks_than_cores_says_why_its_bubble_can_mislead() -> None:
    """Issue 37: `run pp --schedule zb-h1 -n 4` on 2 cores measured a bubble above 1F1B's
    without a word; the note says why and where the schedule can win."""
    from minipar.run.pp import oversubscribed_note

    assert oversubscribed_note(2, 2, "zb-h1", 2, 8) is None
    note = oversubscribed_note(4, 2, "zb-h1", 4, 8)
    assert note.startswith("4 ranks on 2 cores: a stage waits for a core")
    assert "removes the waits between operations, but not the time-slicing inside them" in note
    assert "`minipar run pp --schedule zb-h1 -n 2`" in note and "minipar bench pp" in note
    assert "`minipar bubble --schedule zb-h1 --stages 4 --micro-batches 8`" in note
