"""Sharded ZeRO checkpoints (minipar.parallel.sharded_checkpoint): bit-identical resume,
resharding, crash safety, refusals.

Serial computation reproduced: ``minipar.train.train`` (the run the ZeRO
engines equal); a resumed run must continue exactly as the run that was never
interrupted.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from mpi4py import MPI

from minipar import launch
from minipar.comm import TracedComm
from minipar.nn import GPT
from minipar.parallel import sharded_checkpoint
from minipar.parallel.common import PARITY_ATOL, PARITY_RTOL, RunSpec, loss_weight
from minipar.parallel.zero.engine import ZeRO
from minipar.train import train

MPI_DIR = Path(__file__).parent / "mpi"
SPEC = RunSpec(steps=4)


def engine(stage: int = 1, spec: RunSpec = SPEC, comm: object = None) -> ZeRO:
    return ZeRO(TracedComm(comm or MPI.COMM_SELF), spec.model(), spec.initial_params(), stage,
                spec.precision, spec.optimizer, **spec.opt_kwargs())


def run_to(eng: ZeRO, step: int, spec: RunSpec = SPEC) -> None:
    c = eng.comm
    while eng.step_count < step:
        x, y = spec.local_batch(eng.step_count, c.rank, c.size)
        eng.train_step(x, y, loss_weight(spec.batch, c.rank, c.size))


def serial_params(steps: int, spec: RunSpec = SPEC) -> dict:
    model = spec.model()
    out = train(model, spec.global_batch, steps, spec.precision, spec.optimizer, spec.seed,
                **spec.opt_kwargs())
    return {k: v.copy() for k, v in out["states"].param_views().items()}


def test_four_ranks_resume_reshard_crash_consolidate(tmp_path: Path) -> None:
    proc = launch.run(4, str(MPI_DIR / "ckpt_check.py"), str(tmp_path), timeout=90)
    assert proc.returncode == 0, proc.stderr[-3000:]
    res = json.loads(proc.stdout.split("CKPT_CHECK ", 1)[1])
    for tag, r in res["resume"].items():  # stages 0-3 in float64, stage 3 in mixed
        assert r["bit_identical"], f"resume of {tag} on 4 ranks is not bit-identical"
    assert len(res["resume"]) == 5
    for what, r in res["reshard"].items():
        assert r["parity"] and r["max_param_diff"] < 1e-12, what
    crash = res["crash"]
    assert crash["step_4_shards_written"] == 4 and crash["latest"] == "step_00000002"
    assert "interrupted" in crash["incomplete_refused"]
    assert crash["resumed_bit_identical"]
    # the consolidated step-2 file: the serial model loads it and it is its own step 2
    full = sharded_checkpoint.load_consolidated(res["consolidated"])
    want = serial_params(2)
    assert list(full) == list(GPT(SPEC.config()).param_shapes())
    for name, value in want.items():
        np.testing.assert_allclose(full[name], value, rtol=PARITY_RTOL, atol=PARITY_ATOL)
    x, y = SPEC.global_batch(2)
    assert abs(SPEC.model().loss(full, x, y) - SPEC.model().loss(want, x, y)) < 1e-12


def test_a_killed_save_leaves_the_previous_checkpoint(tmp_path: Path) -> None:
    """Rank 1 of 2 dies after writing its step-4 shard; resume on 1 rank from step 2."""
    proc = launch.run(2, str(MPI_DIR / "ckpt_crash.py"), str(tmp_path), timeout=60)
    assert proc.returncode != 0 and "UNREACHABLE" not in proc.stdout
    assert list((tmp_path / "step_00000004").glob("shard_*"))  # debris of the crash
    assert sharded_checkpoint.latest(tmp_path) == tmp_path / "step_00000002"
    with pytest.raises(sharded_checkpoint.CheckpointError, match="interrupted"):
        sharded_checkpoint.load(engine(2), tmp_path / "step_00000004")
    eng = engine(3)  # another stage, another world size
    m = sharded_checkpoint.load(eng, tmp_path)
    assert m["step"] == 2 and m["world_size"] == 2 and eng.step_count == 2
    run_to(eng, 4)
    want = GPT(SPEC.config()).param_shapes()
    flat = np.concatenate([serial_params(4)[k].reshape(-1) for k in want])
    np.testing.assert_allclose(eng.full_params(), flat, rtol=PARITY_RTOL, atol=PARITY_ATOL)


def test_another_model_precision_or_optimizer_is_refused(tmp_path: Path) -> None:
    eng = engine(1)
    run_to(eng, 1)
    d = sharded_checkpoint.save(eng, tmp_path)
    for spec, what in ((SPEC.with_(d_model=32), "d_model: checkpoint 16, this run 32"),
                       (SPEC.with_(layers=3), "n_layer: checkpoint 2, this run 3"),
                       (SPEC.with_(precision="mixed"), "precision: checkpoint 'float64'"),
                       (SPEC.with_(optimizer="sgd"), "optimizer: checkpoint 'adamw'")):
        with pytest.raises(sharded_checkpoint.CheckpointError, match="another model or setting") as e:
            sharded_checkpoint.load(engine(1, spec), d)
        assert what in str(e.value)
    with pytest.raises(sharded_checkpoint.CheckpointError, match="already holds a complete checkpoint"):
        sharded_checkpoint.save(eng, tmp_path)
    with pytest.raises(sharded_checkpoint.CheckpointError, match="no complete checkpoint"):
        sharded_checkpoint.load(eng, tmp_path / "empty")


def test_a_damaged_shard_is_detected(tmp_path: Path) -> None:
    eng = engine(2)
    run_to(eng, 1)
    d = sharded_checkpoint.save(eng, tmp_path)
    shard = next(d.glob("shard_*.npz"))
    raw = bytearray(shard.read_bytes())
    raw[-100] ^= 1
    shard.write_bytes(bytes(raw))
    with pytest.raises(sharded_checkpoint.CheckpointError, match="SHA-256"):
        sharded_checkpoint.load(engine(2), d)


def test_mixed_precision_round_trip_keeps_bfloat16_bits(tmp_path: Path) -> None:
    spec = SPEC.with_(precision="mixed")
    eng = engine(3, spec)
    run_to(eng, 2, spec)
    d = sharded_checkpoint.save(eng, tmp_path)
    m = json.loads((d / sharded_checkpoint.MANIFEST).read_text())
    assert m["dtypes"] == {"params": "bfloat16", "master": "float32", "opt.m": "float32",
                           "opt.v": "float32"}
    back = engine(1, spec)
    sharded_checkpoint.load(back, d)
    assert back.params.tobytes() == eng.full_params().tobytes()
    assert back.states.master.tobytes() == eng.states.master.tobytes()
    full = sharded_checkpoint.load_consolidated(sharded_checkpoint.consolidate(d, tmp_path / "full.npz"))
    assert all(v.dtype == np.float32 for v in full.values())  # the fp32 master weights
