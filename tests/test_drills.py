"""Drills (issue 20): runs killed, interrupted mid-save, resumed on another layout, stopped by
a full disk — on several ranks, through the launcher, and through ``minipar run`` itself.

Serial computation reproduced: the uninterrupted run.  A resume on the same layout must
continue it to the bit (every loss after the checkpoint, the final parameters and the
optimizer's moments); on another layout within the parity verdict
(:func:`minipar.parallel.parity.compare`, float64).  The rank side is
tests/mpi/drill_check.py, which trains through ``strategies.build`` + ``loop.fit`` and
sabotages a run through the checkpoint's own seams (after ``save`` returned; in
``on_shard_written``; a file-size limit).  Nothing here waits a fixed time: a launch ends
when MPI ends the job, and the CLI drill polls (every 10 ms) for the checkpoint's
manifest to appear; a deadline bounds every wait, it never paces one.
"""

from __future__ import annotations

import errno
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
from conftest import MPI_DIR, run_minipar, summary_of

from minipar import launch
from minipar.parallel import checkpoint, strategies
from minipar.parallel.checkpoint import MANIFEST, step_dir
from minipar.parallel.common import EMBEDDED, RunSpec
from minipar.parallel.parity import compare

#: the modular-sum task on a tiny GPT (vocab 8 and batch 8 fit dp2 x tp2 x pp2)
TINY = {"vocab": 8, "seq": 8, "d_model": 16, "layers": 2, "heads": 2, "batch": 8}
#: the same model on the package's own text (vocabulary 256: the bytes of UTF-8)
TEXT = {**TINY, "text": EMBEDDED, "vocab": 256}
MOMENTS = ("param", "exp_avg", "exp_avg_sq")  # what AdamW's state holds besides the step
DEADLINE_S = 120.0  # an upper bound on any wait here, never a pace


def drill(n: int, out: Path, plan: list[list[dict]]) -> launch.Launched:
    """One launch of tests/mpi/drill_check.py on ``n`` ranks with ``plan`` (its rounds)."""
    path = out / f"plan-{len(list(out.glob('plan-*.json')))}.json"
    path.write_text(json.dumps(plan))
    return launch.run(n, str(MPI_DIR / "drill_check.py"), str(out), str(path),
                      timeout=DEADLINE_S, env={"MINIPAR_WATCHDOG_S": "60"})


def finished(proc: launch.Launched, plan_runs: int) -> None:
    """Every run of the launch finished, and its rank-side checks passed."""
    fields = summary_of(proc, "DRILL")
    assert fields["failures"] == "0" and fields["runs"] == str(plan_runs), proc.stdout[-3000:]


def killed(proc: launch.Launched, rank: int, n: int = 4) -> None:
    """The launch ended because rank ``rank`` was killed by SIGKILL: one line says so."""
    assert proc.returncode != 0 and "DRILL-SUMMARY" not in proc.stdout, proc.stdout[-3000:]
    line = proc.failure or ""
    assert line.startswith(f"[minipar] rank {rank} of {n} (pid "), line
    assert "killed by signal 9 (SIGKILL)" in line and "\n" not in line, line


def result(out: Path, name: str) -> dict[str, np.ndarray]:
    with np.load(out / f"{name}.npz") as z:
        return {k: z[k] for k in z.files}


def same_state(a: Path, b: Path) -> None:
    """Two checkpoints hold the same parameters and moments, bit for bit."""
    for kind in MOMENTS:
        _, ma, ta = checkpoint.full_tensors(a, kind)
        _, mb, tb = checkpoint.full_tensors(b, kind)
        assert ma["step"] == mb["step"] and list(ta) == list(tb)
        for name in ta:
            assert ta[name].tobytes() == tb[name].tobytes(), (a, kind, name)


#: the uninterrupted 4-rank runs that (b) and (c) compare with: name -> strategy, options
UNINTERRUPTED = {"zero3": ("zero", {"stage": 3}), "dp": ("dp", {})}
#: their spec and checkpoints (every 2 steps of 6)
SPEC_6, EVERY = {**TINY, "steps": 6}, 2


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One 4-rank launch: ZeRO-3 and DDP trained 6 steps uninterrupted, a checkpoint every
    2 (``DIR/zero3``, ``DIR/dp``), their losses and parameters (``DIR/NAME.npz``)."""
    out = tmp_path_factory.mktemp("uninterrupted")
    finished(drill(4, out, [[{"name": name, "strategy": strategy, "sizes": {"dp": 4},
                              "options": options, "spec": SPEC_6, "save": str(out / name),
                              "save_every": EVERY}]
                            for name, (strategy, options) in UNINTERRUPTED.items()]), 2)
    return out


@pytest.mark.parametrize("precision", ["float64", "float32"])
def test_a_rank_killed_after_a_checkpoint_resumes_to_the_bit(precision: str,
                                                             tmp_path: Path) -> None:
    """Drill (a): ZeRO-2 on 4 ranks, real text, a checkpoint every 2 steps; rank 2 is killed
    (SIGKILL) right after the checkpoint of step 4.  The launch ends by itself and names
    the rank and the signal; a second launch resumes from the folder (its latest
    checkpoint, step 4) and every loss of steps 5-7, the final parameters and the
    checkpoints it writes equal the uninterrupted run's to the bit."""
    ck, whole = tmp_path / "ck", tmp_path / "whole"
    run = {"strategy": "zero", "sizes": {"dp": 4}, "options": {"stage": 2},
           "spec": {**TEXT, "steps": 7, "precision": precision}, "save_every": 2}
    killed(drill(4, tmp_path, [[{**run, "name": "killed", "save": str(ck), "drill": {
        "kind": "kill_after_save", "rank": 2, "step": 4}}]]), rank=2)
    assert checkpoint.scan(ck) == ([step_dir(ck, 2), step_dir(ck, 4)], [])
    finished(drill(4, tmp_path, [[{**run, "name": "resumed", "save": str(ck), "resume": str(ck),
                                   "start": 4}],
                                 [{**run, "name": "whole", "save": str(whole)}]]), 2)
    resumed, ref = result(tmp_path, "resumed"), result(tmp_path, "whole")
    assert len(resumed["losses"]) == 3 and len(ref["losses"]) == 7
    assert resumed["losses"].tobytes() == ref["losses"][4:].tobytes()
    assert resumed["params"].dtype == np.dtype(precision)
    assert resumed["params"].tobytes() == ref["params"].tobytes()
    for step in (6, 7):  # what the resumed run saved is what the uninterrupted run saved
        same_state(step_dir(ck, step), step_dir(whole, step))


def test_minipar_run_killed_from_outside_resumes_to_the_bit(tmp_path: Path) -> None:
    """Drill (a) through the command line: ``minipar run dp -n 4 --text --save DIR
    --save-every 2``; once the manifest of step 2 exists, the test sends SIGKILL to rank 1
    (its pid from the launch's notes, :mod:`minipar.launch.rank`).  The killed run is
    given far more steps than it can reach, so the kill lands mid-run however loaded the
    machine is: the state of step j does not depend on ``--steps`` (no schedule; the
    manifest does not record it).  The run resumed from DIR (its latest complete
    checkpoint j, whichever the kill left) to j + 3 equals ``minipar run`` to j + 3
    uninterrupted: the losses of steps j+1.. to the bit, the checkpoints bit for bit."""
    ck, whole, tmp = tmp_path / "ck", tmp_path / "whole", tmp_path / "tmp"
    tmp.mkdir()
    model = ["--text", "--seq", "8", "--d-model", "16", "--layers", "2", "--heads", "2",
             "--batch", "8"]
    argv = [sys.executable, "-m", "minipar.cli", "run", "dp", "-n", "4", *model,
            "--save-every", "2", "--json", "--timeout", "300"]
    proc = subprocess.Popen([*argv, "--steps", "1000000", "--save", str(ck)], text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            env={**os.environ, "TMPDIR": str(tmp)})  # the launch's folder
    try:
        deadline = time.monotonic() + DEADLINE_S
        while not (step_dir(ck, 2) / MANIFEST).exists():  # the event: checkpoint 2 complete
            assert proc.poll() is None, proc.communicate()
            assert time.monotonic() < deadline, "no checkpoint of step 2 within the deadline"
            time.sleep(0.01)
        notes = [json.loads(f.read_text()) for f in tmp.glob("minipar-launch-*/.ranks/*.json")]
        victim = next(r["pid"] for r in notes if r["rank"] == 1)
        os.kill(victim, signal.SIGKILL)
        out, err = proc.communicate(timeout=DEADLINE_S)
    finally:
        if proc.poll() is None:  # a failed assertion above: stop every rank (SIGTERM)
            proc.terminate()
            proc.communicate(timeout=DEADLINE_S)
    assert proc.returncode == 1 and out == "", (out, err)
    assert err.splitlines() == [(
        f"[minipar] rank 1 of 4 (pid {victim} on {notes[0]['host']}) was killed by signal 9 "
        "(SIGKILL): out of memory (the kernel's OOM killer sends SIGKILL) or killed from "
        "outside (--debug shows every rank's output)")], err
    assert list(tmp.iterdir()) == []  # the launch left nothing behind
    d = checkpoint.latest(ck)
    j = int(d.name.split("_")[1])
    complete, partial = checkpoint.scan(ck)
    assert complete == [step_dir(ck, s) for s in range(2, j + 1, 2)]
    assert all(int(p.name.split("_")[1]) > j for p in partial)
    steps = ["--steps", str(j + 3)]
    resumed = run_minipar(*argv[3:], *steps, "--save", str(ck), "--resume", str(ck))
    ref = run_minipar(*argv[3:], *steps, "--save", str(whole))
    assert resumed.returncode == 0 and ref.returncode == 0, resumed.stderr + ref.stderr
    a, b = json.loads(resumed.stdout), json.loads(ref.stdout)
    assert a["start"] == j and b["start"] == 0 and len(b["losses"]) == j + 3
    assert a["losses"] == b["losses"][j:]  # floats from JSON: the same doubles, to the bit
    # against the serial run resumed from step j too (not from this run's own later saves
    # into DIR: --resume DIR is fixed to its step folder before the ranks start)
    assert a["verdict"]["status"] == "equal", a["verdict"]
    for step in (j + 2, j + 3):
        same_state(step_dir(ck, step), step_dir(whole, step))


def test_a_job_killed_while_it_writes_a_checkpoint_resumes_from_the_previous_one(
        uninterrupted: Path, tmp_path: Path) -> None:
    """Drill (b): ZeRO-3 on 4 ranks; at the checkpoint of step 4, rank 3 is killed after its
    own file is durable, before the manifest.  The partial step 4 is reported (``minipar
    checkpoint info``: "partial, ignored") and skipped: the latest checkpoint is step 2,
    and a resume from the folder starts there and continues to the bit, writing step 4
    again, now complete and equal to the uninterrupted run's."""
    ck, whole = tmp_path / "ck", uninterrupted / "zero3"
    strategy, options = UNINTERRUPTED["zero3"]
    run = {"strategy": strategy, "sizes": {"dp": 4}, "options": options, "spec": SPEC_6,
           "save": str(ck), "save_every": EVERY}
    killed(drill(4, tmp_path, [[{**run, "name": "killed", "drill": {
        "kind": "kill_in_save", "rank": 3, "step": 4}}]]), rank=3)
    d2, d4 = step_dir(ck, 2), step_dir(ck, 4)
    assert checkpoint.scan(ck) == ([d2], [d4]) and checkpoint.latest(ck) == d2
    assert (d4 / "shard_00003_of_00004.npz").is_file()  # rank 3 died after writing it
    info = run_minipar("checkpoint", "info", str(ck))
    assert info.returncode == 0, info.stderr
    assert info.stdout.splitlines()[0] == f"checkpoint {d2}"  # the one that loads
    rows = [ln for ln in info.stdout.splitlines() if "partial, ignored" in ln]
    assert len(rows) == 1 and "step_00000004 (" in rows[0] and "no manifest.json" in rows[0]
    with pytest.raises(checkpoint.CheckpointError, match="interrupted"):
        checkpoint.read_manifest(d4)
    finished(drill(4, tmp_path, [[{**run, "name": "resumed", "resume": str(ck), "start": 2}]]),
             1)
    resumed, ref = result(tmp_path, "resumed"), result(uninterrupted, "zero3")
    assert resumed["losses"].tobytes() == ref["losses"][2:].tobytes()
    assert resumed["params"].tobytes() == ref["params"].tobytes()
    assert checkpoint.scan(ck) == ([d2, d4, step_dir(ck, 6)], [])
    for step in (4, 6):
        same_state(step_dir(ck, step), step_dir(whole, step))


#: (c) the layouts a 4-rank checkpoint is resumed on: strategy, grid, options
LAYOUTS = {"hybrid dp2 tp2 pp2": ("hybrid", {"dp": 2, "tp": 2, "pp": 2}, {"micro_batches": 2}),
           "tp2": ("tp", {"tp": 2}, {}),
           "pp2": ("pp", {"pp": 2}, {"schedule": "1f1b", "micro_batches": 2})}


def test_a_checkpoint_resumes_on_another_layout_within_the_parity_verdict(
        uninterrupted: Path, tmp_path: Path) -> None:
    """Drill (c): the step-2 checkpoints of ZeRO-3 and DDP on 4 ranks resume on 8 ranks as
    dp2 x tp2 x pp2 and on pairs of ranks as TP 2 and PP 2 (one launch, the pairs side by
    side).  Each resumed run's losses of steps 3-6 and final parameters equal the
    uninterrupted run's under the parity verdict (float64; the distance trained measured
    from the checkpoint's parameters)."""
    def resume(layout: str, saver: str) -> dict:
        strategy, sizes, options = LAYOUTS[layout]
        return {"name": f"{layout} from {saver}", "strategy": strategy, "sizes": sizes,
                "options": options, "spec": SPEC_6, "start": 2,
                "resume": str(step_dir(uninterrupted / saver, 2))}

    plan = [[resume("hybrid dp2 tp2 pp2", s)] for s in UNINTERRUPTED]
    plan.append([resume(layout, s) for s in UNINTERRUPTED for layout in ("tp2", "pp2")])
    finished(drill(8, tmp_path, plan), 6)
    for saver in UNINTERRUPTED:
        ref = result(uninterrupted, saver)
        _, _, at_2 = checkpoint.full_tensors(step_dir(uninterrupted / saver, 2))
        theta_2 = np.concatenate([v.ravel() for v in at_2.values()])
        for layout in LAYOUTS:
            got = result(tmp_path, f"{layout} from {saver}")
            v = compare(got["losses"], ref["losses"][2:], got["params"], ref["params"], theta_2)
            assert v.status == "equal", (layout, saver, v.line())


@pytest.mark.parametrize("fills,rank", [("shard", 2), ("manifest", 0)])
def test_a_full_disk_on_one_rank_keeps_the_previous_checkpoint(
        fills: str, rank: int, uninterrupted: Path, tmp_path: Path) -> None:
    """Drill (d), ZeRO-3 on 4 ranks: one rank's ``write(2)`` fails at the checkpoint of step
    4 — a file-size limit (RLIMIT_FSIZE, set in that rank by drill_check.py, as a full disk
    would) below its shard, or (rank 0) below the manifest once every shard is written.
    The launch ends with one line naming the rank, the file and the reason; step 2 is
    intact (every file matches its manifest's SHA-256, and it holds what the
    uninterrupted run saved, bit for bit) and is what loads; step 4 is partial and
    ignored, and the failed rank left no temporary file."""
    ck = tmp_path / "ck"
    strategy, options = UNINTERRUPTED["zero3"]
    run = {"name": "full", "strategy": strategy, "sizes": {"dp": 4}, "options": options,
           "spec": SPEC_6, "save": str(ck), "save_every": EVERY,
           "drill": {"kind": f"fsize_{fills}", "rank": rank, "step": 4}}
    proc = drill(4, tmp_path, [[run]])
    d2, d4 = step_dir(ck, 2), step_dir(ck, 4)
    file = d4 / (MANIFEST if fills == "manifest" else f"shard_{rank:05d}_of_00004.npz")
    assert proc.returncode != 0 and "DRILL-SUMMARY" not in proc.stdout
    assert proc.failure == (
        f"[minipar] rank {rank} of 4 failed: CheckpointError: cannot write {file}: "
        f"{os.strerror(errno.EFBIG)}; step_00000004 has no manifest.json, so it is partial "
        "and ignored: the previous checkpoint is untouched"), proc.failure
    checkpoint.verify(d2)  # every file of step 2 against its SHA-256
    same_state(d2, step_dir(uninterrupted / "zero3", 2))
    assert checkpoint.scan(ck) == ([d2], [d4]) and checkpoint.latest(ck) == d2
    left = sorted(p.name for p in d4.iterdir())
    assert not file.exists() and not [n for n in left if n.startswith(f".{file.name}.tmp-")]
    if fills == "manifest":  # every rank's file was written before rank 0 failed
        assert [n for n in left if n.startswith("shard_")] == [
            f"shard_{r:05d}_of_00004.npz" for r in range(4)]
    spec = RunSpec(**SPEC_6)
    eng = strategies.build("serial", spec)
    assert checkpoint.load(eng, ck, spec=spec)["step"] == 2
