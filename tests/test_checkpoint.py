"""Checkpoints through the engine interface (minipar.parallel.checkpoint): bit-identical
resume, resharding, crash safety, refusals, any engine.

Serial computation reproduced: ``minipar.train.train`` (the run the ZeRO
engines equal); a resumed run must continue exactly as the run that was never
interrupted.
"""

from __future__ import annotations

import functools
import json
from pathlib import Path

import numpy as np
import pytest
from mpi4py import MPI

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
    for spec, what in ((SPEC.with_(d_model=32), "d_model: checkpoint 16, this run 32"),
                       (SPEC.with_(layers=3), "n_layer: checkpoint 2, this run 3"),
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
