"""Checkpoints through the engine interface (minipar.parallel.checkpoint): bit-identical
resume, resharding, crash safety, a full disk, refusals that change nothing, any engine.

Serial computation reproduced: ``minipar.train.train`` (the run the ZeRO
engines equal); a resumed run must continue exactly as the run that was never
interrupted.
"""

from __future__ import annotations

import errno
import functools
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from mpi4py import MPI
from safetensors.numpy import load_file

from minipar import launch
from minipar.comm import TracedComm
from minipar.comm.topology import Grid
from minipar.nn import GPT
from minipar.parallel import checkpoint, strategies
from minipar.parallel.common import PARITY_ATOL, PARITY_RTOL, RunSpec
from minipar.parallel.zero.engine import ZeRO
from minipar.train import train

MPI_DIR = Path(__file__).parent / "mpi"
SPEC = RunSpec(steps=4)


@functools.cache
def grid() -> Grid:
    """One rank (MPI.COMM_SELF) as a grid: dp = 1."""
    return Grid(TracedComm(MPI.COMM_SELF), dp=1)


def engine(stage: int = 1, spec: RunSpec = SPEC) -> ZeRO:
    return ZeRO(grid(), spec, stage=stage)


def steps_done(eng: object) -> int:
    return int(eng.state_dict().scalars["step"])


def run_to(eng: object, step: int, spec: RunSpec = SPEC) -> None:
    while steps_done(eng) < step:
        eng.step(spec.batch_at(steps_done(eng)))


def flat(params: dict) -> np.ndarray:
    return np.concatenate([np.asarray(v).reshape(-1) for v in params.values()])


def serial_params(steps: int, spec: RunSpec = SPEC) -> dict:
    model = spec.model()
    out = train(model, spec.global_batch, steps, spec.precision, spec.optimizer, spec.seed,
                **spec.opt_kwargs())
    return {k: v.copy() for k, v in out["states"].param_views().items()}


def test_four_ranks_resume_reshard_crash_consolidate(tmp_path: Path) -> None:
    proc = launch.run(4, str(MPI_DIR / "ckpt_check.py"), str(tmp_path), timeout=120)
    assert proc.returncode == 0, proc.stderr[-3000:]
    res = json.loads(proc.stdout.split("CKPT_CHECK ", 1)[1])
    for tag, r in res["resume"].items():  # stages 0-3 in float64, stage 3 in mixed
        assert r["bit_identical"], f"resume of {tag} on 4 ranks is not bit-identical"
    assert len(res["resume"]) == 5
    for what, r in res["reshard"].items():
        assert r["parity"] and r["max_param_diff"] < 1e-12, what
    # ZeRO-2 of 4 ranks resumed on 2: the saved parameters exactly, the next loss to 1e-12
    # (not bit for bit: 2 ranks sum the gradients in another order than 4)
    assert res["resume_4_on_2"]["params_exact"]
    assert res["resume_4_on_2"]["next_loss_diff"] <= 1e-12
    # FP8: FP32 master weights and moments, bit-identical resume, resharded 4 -> 2 equal
    fp8 = res["fp8"]
    assert fp8["resume_bit_identical"] and fp8["master"] == fp8["moments"] == "float32"
    assert fp8["reshard_4_to_2"]["status"] == "equal", fp8
    crash = res["crash"]
    assert crash["step_4_shards_written"] == 4 and crash["latest"] == "step_00000002"
    assert "interrupted" in crash["incomplete_refused"]
    assert crash["resumed_bit_identical"]
    # the consolidated step-2 file: the serial model loads it and it is its own step 2
    full = checkpoint.load_consolidated(res["consolidated"])
    want = serial_params(2)
    assert list(full) == list(GPT(SPEC.config()).param_shapes())
    for name, value in want.items():
        np.testing.assert_allclose(full[name], value, rtol=PARITY_RTOL, atol=PARITY_ATOL)
    x, y = SPEC.global_batch(2)
    assert abs(SPEC.model().loss(full, x, y) - SPEC.model().loss(want, x, y)) < 1e-12
    # the 4-rank checkpoints exported: each tensor assembled from the 4 ranks' pieces (ZeRO's
    # flat ranges cut per tensor) is full_params() at the save, to the bit, in its dtype
    for tag, r in res["resume"].items():
        out = checkpoint.export(tmp_path / tag / r["dir"], tmp_path / f"{tag}.safetensors")
        got = load_file(str(out))
        with np.load(tmp_path / f"{tag}-full_params.npz") as saved:
            assert set(got) == set(saved.files) == set(want)
            for name, value in got.items():
                assert value.tobytes() == saved[name].tobytes(), (tag, name)
                assert value.shape == want[name].shape
                assert str(value.dtype) == ("bfloat16" if "mixed" in tag else "float64")


def test_a_killed_save_leaves_the_previous_checkpoint(tmp_path: Path) -> None:
    """Rank 1 of 2 dies after writing its step-4 file; resume on 1 rank from step 2."""
    proc = launch.run(2, str(MPI_DIR / "ckpt_crash.py"), str(tmp_path), timeout=60)
    assert proc.returncode != 0 and "UNREACHABLE" not in proc.stdout
    assert list((tmp_path / "step_00000004").glob("shard_*"))  # debris of the crash
    assert checkpoint.latest(tmp_path) == tmp_path / "step_00000002"
    with pytest.raises(checkpoint.CheckpointError, match="interrupted"):
        checkpoint.load(engine(2), tmp_path / "step_00000004", spec=SPEC)
    eng = engine(3)  # another stage, another world size
    m = checkpoint.load(eng, tmp_path, spec=SPEC)
    assert m["step"] == 2 and m["world_size"] == 2 and steps_done(eng) == 2
    run_to(eng, 4)
    want = GPT(SPEC.config()).param_shapes()
    serial = flat({k: serial_params(4)[k] for k in want})
    np.testing.assert_allclose(flat(eng.full_params()), serial, rtol=PARITY_RTOL,
                               atol=PARITY_ATOL)


def test_another_model_precision_or_optimizer_is_refused(tmp_path: Path) -> None:
    eng = engine(1)
    run_to(eng, 1)
    d = checkpoint.save(eng, tmp_path, grid().world, spec=SPEC)
    for spec, what in ((SPEC.with_(d_model=32), "--d-model: checkpoint 16, this run 32"),
                       (SPEC.with_(layers=3), "--layers: checkpoint 2, this run 3"),
                       (SPEC.with_(precision="mixed"), "precision: checkpoint 'float64'"),
                       (SPEC.with_(optimizer="sgd"), "optimizer: checkpoint 'adamw'")):
        with pytest.raises(checkpoint.CheckpointError, match="another model or setting") as e:
            checkpoint.load(engine(1, spec), d, spec=spec)
        assert what in str(e.value)
    # without the spec, the state itself tells: its tensors' shapes, the optimizer, dtypes
    for spec, what in ((SPEC.with_(d_model=32), "layout (names and shapes) differs"),
                       (SPEC.with_(optimizer="sgd"), "optimizer: checkpoint AdamW, this run SGD")):
        with pytest.raises(checkpoint.CheckpointError, match="another model or setting") as e:
            checkpoint.load(engine(1, spec), d)
        assert what in str(e.value)
    with pytest.raises(checkpoint.CheckpointError, match="needs"):
        checkpoint.load(engine(1, SPEC.with_(precision="mixed")), d)  # no master weights saved
    with pytest.raises(checkpoint.CheckpointError, match="already holds a complete checkpoint"):
        checkpoint.save(eng, tmp_path, grid().world, spec=SPEC)
    with pytest.raises(checkpoint.CheckpointError, match="empty does not exist"):
        checkpoint.load(eng, tmp_path / "empty", spec=SPEC)
    (tmp_path / "empty").mkdir()
    with pytest.raises(checkpoint.CheckpointError, match="no complete checkpoint"):
        checkpoint.load(eng, tmp_path / "empty", spec=SPEC)


def test_a_damaged_shard_is_detected(tmp_path: Path) -> None:
    eng = engine(2)
    run_to(eng, 1)
    d = checkpoint.save(eng, tmp_path, grid().world, spec=SPEC)
    shard = next(d.glob("shard_*.npz"))
    raw = bytearray(shard.read_bytes())
    raw[-100] ^= 1
    shard.write_bytes(bytes(raw))
    with pytest.raises(checkpoint.CheckpointError, match="SHA-256"):
        checkpoint.load(engine(2), d, spec=SPEC)


def test_mixed_precision_round_trip_keeps_bfloat16_bits(tmp_path: Path) -> None:
    spec = SPEC.with_(precision="mixed")
    eng = engine(3, spec)
    run_to(eng, 2, spec)
    d = checkpoint.save(eng, tmp_path, grid().world, spec=spec)
    m = json.loads((d / checkpoint.MANIFEST).read_text())
    assert m["dtypes"] == {"param": "bfloat16", "master": "float32", "exp_avg": "float32",
                           "exp_avg_sq": "float32"}
    back = engine(1, spec)
    checkpoint.load(back, d, spec=spec)
    assert flat(back.full_params()).tobytes() == flat(eng.full_params()).tobytes()
    assert back.states.master.tobytes() == eng.states.master.tobytes()
    full = checkpoint.load_consolidated(checkpoint.consolidate(d, tmp_path / "full.npz"))
    assert all(v.dtype == np.float32 for v in full.values())  # the fp32 master weights


def test_any_engine_the_serial_one_saved_and_zero_3_resuming(tmp_path: Path) -> None:
    """The checkpoint knows only the engine interface: the serial engine's state at step 2,
    loaded into ZeRO-3 on one rank (which equals the serial run bit for bit), continues
    as the serial engine does."""
    serial = strategies.build("serial", SPEC)
    for s in range(2):
        serial.step(SPEC.batch_at(s))
    d = checkpoint.save(serial, tmp_path, grid().world, spec=SPEC)
    eng = engine(3)
    checkpoint.load(eng, d, spec=SPEC)
    assert steps_done(eng) == 2
    assert flat(eng.full_params()).tobytes() == flat(serial.full_params()).tobytes()
    for s in (2, 3):
        assert eng.step(SPEC.batch_at(s)).loss == serial.step(SPEC.batch_at(s)).loss
    assert flat(eng.full_params()).tobytes() == flat(serial.full_params()).tobytes()


def refused(call: object, *words: str) -> str:
    """The one-line CheckpointError of ``call()``, containing ``words``."""
    with pytest.raises(checkpoint.CheckpointError) as e:
        call()
    line = str(e.value)
    assert "\n" not in line and all(w in line for w in words), (line, words)
    return line


def snapshot(eng: ZeRO) -> tuple[bytes, ...]:
    """Everything a load would write: parameters, master copy, moments, step counts."""
    st = eng.states
    return (st.params.tobytes(), b"" if st.master is None else st.master.tobytes(),
            st.optimizer.m.tobytes(), st.optimizer.v.tobytes(),
            json.dumps(eng.state_dict().scalars, sort_keys=True).encode())


def test_a_refused_load_names_the_problem_and_changes_nothing(tmp_path: Path) -> None:
    """Damaged, half-written, missing or foreign checkpoints: one line naming the file and
    what is wrong, and the engine that was to be filled is exactly as before."""
    eng = engine(2)
    run_to(eng, 1)
    good = checkpoint.save(eng, tmp_path / "good", grid().world, spec=SPEC)
    shard = next(good.glob("shard_*.npz"))
    size = shard.stat().st_size

    def flip(shard: Path, manifest: Path) -> None:
        raw = bytearray(shard.read_bytes())
        raw[len(raw) // 2] ^= 0x10
        shard.write_bytes(bytes(raw))

    def edit(**changes: object) -> object:
        def damage(shard: Path, manifest: Path) -> None:
            m = json.loads(manifest.read_text())
            m.update(changes)
            manifest.write_text(json.dumps(m))
        return damage

    cases = [  # (damage(shard, manifest) of a copy, words of the refusal)
        (flip, shard.name, "does not match the manifest's SHA-256", "damaged"),
        (lambda sh, _: sh.write_bytes(sh.read_bytes()[:size // 2]), shard.name,
         f"SHA-256 ({size // 2:,} bytes, saved {size:,})"),
        (lambda sh, _: sh.unlink(), shard.name, "is missing (the manifest lists it)"),
        (lambda _, m: m.write_text(m.read_text()[:200]), "manifest.json is damaged",
         "not JSON"),
        (lambda _, m: m.write_bytes(b"\xff\xfe"), "manifest.json is damaged", "not JSON"),
        (lambda _, m: m.write_text("[]"), "not a minipar checkpoint (format 'list'"),
        (edit(format="minipar-checkpoint/1"), "not a minipar checkpoint",
         "'minipar-checkpoint/1'"),
        (edit(files=[]), "manifest.json is damaged", "the list of 1 files"),
        (edit(world_size=2), "manifest.json is damaged", "the list of 2 files"),
        (lambda _, m: m.write_text(json.dumps({"format": checkpoint.FORMAT, "step": 1})),
         "lacks world_size, tensors, dtypes, scalars, files"),
        (lambda _, m: m.unlink(), "step_00000001 has no manifest.json", "interrupted"),
    ]
    target = engine(2)
    run_to(target, 3)
    before = snapshot(target)
    for i, (damage, *words) in enumerate(cases):
        copy = shutil.copytree(good, tmp_path / f"case{i}" / good.name)
        damage(copy / shard.name, copy / checkpoint.MANIFEST)
        refused(functools.partial(checkpoint.load, target, copy, spec=SPEC), *words)
        assert snapshot(target) == before, words
    # a root: only a partial checkpoint, a file, nothing at all
    refused(lambda: checkpoint.load(target, tmp_path / f"case{len(cases) - 1}", spec=SPEC),
            "no complete checkpoint", "step_00000001 partial", "ignored")
    refused(lambda: checkpoint.load(target, copy / shard.name, spec=SPEC), "is a file")
    refused(lambda: checkpoint.load(target, tmp_path / "nothing", spec=SPEC), "does not exist")
    # another model's shapes: refused before anything is read
    other = engine(2, SPEC.with_(d_model=32))
    run_to(other, 1, SPEC.with_(d_model=32))
    theirs = snapshot(other)
    refused(lambda: checkpoint.load(other, good, spec=SPEC.with_(d_model=32)),
            "another model", "--d-model: checkpoint 16, this run 32")
    assert snapshot(other) == theirs and snapshot(target) == before
    checkpoint.load(target, good, spec=SPEC)  # the good one still loads
    assert snapshot(target) == snapshot(eng)


def full_disk(monkeypatch: pytest.MonkeyPatch, where: str, after: int = 100) -> list[str]:
    """From now on, the disk is full for files whose path contains ``where``: the first
    write to such a file writes ``after`` bytes (a short write, as Linux gives when the
    space runs out mid-way), every later one fails with ENOSPC, what ``write(2)`` does on
    a full filesystem.  Other files are written as usual.  Returns the paths refused."""
    real_open, real_write = os.open, os.write
    paths: dict[int, str] = {}
    written: dict[int, int] = {}
    refused_paths: list[str] = []

    def open_(path: object, flags: int, *args: object, **kwargs: object) -> int:
        fd = real_open(path, flags, *args, **kwargs)
        paths[fd], written[fd] = os.fspath(path), 0
        return fd

    def write(fd: int, data: object) -> int:
        if where not in paths.get(fd, ""):
            return real_write(fd, data)
        if written[fd] < after:
            n = real_write(fd, bytes(memoryview(data)[:after - written[fd]]))
            written[fd] += n
            return n
        refused_paths.append(paths[fd])
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(os, "open", open_)
    monkeypatch.setattr(os, "write", write)
    return refused_paths


@pytest.mark.parametrize("fills", ["shard_00000", "manifest"])
def test_a_full_disk_while_saving_keeps_the_previous_checkpoint(
        fills: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Drill (d): the disk fills while step 4 is written (its shard, or its manifest): one
    line naming the file and the reason, no manifest for step 4, no temporary file left,
    step 2 intact and still the one that loads; once there is space, the save succeeds."""
    eng = engine(2)
    run_to(eng, 2)
    d2 = checkpoint.save(eng, tmp_path, grid().world, spec=SPEC)
    kept = {p.name: p.read_bytes() for p in d2.iterdir()}
    run_to(eng, 4)
    d4 = checkpoint.step_dir(tmp_path, 4)
    hit = full_disk(monkeypatch, f"step_00000004/.{fills}")
    line = refused(lambda: checkpoint.save(eng, tmp_path, grid().world, spec=SPEC),
                   f"cannot write {d4}/{fills}", "No space left on device",
                   "step_00000004 has no manifest.json", "the previous checkpoint is untouched")
    assert hit and "Traceback" not in line
    monkeypatch.undo()  # space again
    left = sorted(p.name for p in d4.iterdir())
    assert left == ([] if fills.startswith("shard") else ["shard_00000_of_00001.npz"])
    assert {p.name: p.read_bytes() for p in d2.iterdir()} == kept
    assert checkpoint.latest(tmp_path) == d2
    back = engine(2)
    assert checkpoint.load(back, tmp_path, spec=SPEC)["step"] == 2
    run_to(back, 4)
    assert snapshot(back) == snapshot(eng)  # the lost save lost nothing but time
    assert checkpoint.save(eng, tmp_path, grid().world, spec=SPEC) == d4
    assert checkpoint.latest(tmp_path) == d4
    assert not [p for p in tmp_path.rglob("*") if ".tmp-" in p.name]


SIZE_LIMIT = """
import resource, signal, sys
from mpi4py import MPI
from minipar.parallel import checkpoint, strategies
from minipar.parallel.common import RunSpec

spec, root = RunSpec(steps=4), sys.argv[1]
eng = strategies.build("serial", spec)
for s in range(4):
    eng.step(spec.batch_at(s))
    if s == 1:
        d2 = checkpoint.save(eng, root, MPI.COMM_SELF, spec=spec)
limit = min(p.stat().st_size for p in d2.glob("shard_*")) // 2
signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # then write(2) fails with EFBIG, no kill
resource.setrlimit(resource.RLIMIT_FSIZE, (limit, resource.getrlimit(resource.RLIMIT_FSIZE)[1]))
try:
    checkpoint.save(eng, root, MPI.COMM_SELF, spec=spec)
except checkpoint.CheckpointError as e:
    print(e)
    sys.exit(2)
"""


def test_a_size_limit_while_saving_is_the_kernels_error_in_one_line(tmp_path: Path) -> None:
    """The same drill against the real kernel: a file-size limit (RLIMIT_FSIZE, set without
    root) below the shard's size; write(2) fails part-way with EFBIG."""
    proc = subprocess.run([sys.executable, "-c", SIZE_LIMIT, str(tmp_path)], capture_output=True,
                          text=True, timeout=120, check=False)
    assert proc.returncode == 2, proc.stderr[-3000:]
    d4 = checkpoint.step_dir(tmp_path, 4)
    assert proc.stdout.splitlines() == [(
        f"cannot write {d4 / 'shard_00000_of_00001.npz'}: {os.strerror(errno.EFBIG)}; "
        "step_00000004 has no manifest.json, so it is partial and ignored: the previous "
        "checkpoint is untouched")]
    assert list(d4.iterdir()) == []  # the temporary file is gone
    assert checkpoint.latest(tmp_path) == checkpoint.step_dir(tmp_path, 2)
    eng = engine(2)
    checkpoint.load(eng, tmp_path, spec=SPEC)
    assert steps_done(eng) == 2
