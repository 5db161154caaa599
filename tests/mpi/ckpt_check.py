"""Sharded checkpoints on 4 ranks: resume bit-identically, reshard to 1-3 ranks, survive a crash.

Usage: ckpt_check.py ROOT.  Rank 0 prints ``CKPT_CHECK {json}`` for
tests/test_checkpoint.py to judge.  Sub-communicators (Split) give the other
world sizes inside this one launch.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np
from mpi4py import MPI

from minipar.comm import TracedComm
from minipar.parallel import sharded_checkpoint
from minipar.parallel.common import RunSpec, loss_weight, max_abs_diff, parity
from minipar.parallel.zero.engine import ZeRO

ROOT = Path(sys.argv[1])
SPEC = RunSpec(vocab=10, seq=8, d_model=16, layers=2, heads=2, batch=10, steps=4)
world = TracedComm(MPI.COMM_WORLD)
out: dict = {"resume": {}, "reshard": {}, "crash": {}}


class SimulatedCrash(Exception):
    """Raised after a rank's shard is durable, before the manifest: a crash mid-save."""


def crash(path: Path) -> None:
    raise SimulatedCrash(f"simulated crash after writing {path.name}")


def engine(comm: TracedComm, stage: int, spec: RunSpec = SPEC) -> ZeRO:
    return ZeRO(comm, spec.model(), spec.initial_params(), stage, spec.precision,
                spec.optimizer, **spec.opt_kwargs())


def train(eng: ZeRO, upto: int, spec: RunSpec = SPEC) -> list[float]:
    c, losses = eng.comm, []
    while eng.step_count < upto:
        x, y = spec.local_batch(eng.step_count, c.rank, c.size)
        losses.append(eng.train_step(x, y, loss_weight(spec.batch, c.rank, c.size)))
    return losses


def bits(a: np.ndarray) -> bytes:
    return a.tobytes()


# 1. same ranks: save at step 2, load into a fresh engine, continue: bit-identical
for stage, spec in ((0, SPEC), (1, SPEC), (2, SPEC), (3, SPEC),
                    (3, SPEC.with_(precision="mixed"))):
    tag = f"{stage}-{spec.precision}"
    ref = engine(world, stage, spec)
    ref_losses = train(ref, 4, spec)
    first = engine(world, stage, spec)
    train(first, 2, spec)
    d = sharded_checkpoint.save(first, ROOT / tag)
    resumed = engine(world, stage, spec)
    sharded_checkpoint.load(resumed, ROOT / tag)
    losses = train(resumed, 4, spec)
    same = (bits(resumed.full_params()) == bits(ref.full_params())
            and losses == ref_losses[2:]
            and bits(resumed.states.master if resumed.states.master is not None
                     else resumed.states.params) == bits(ref.states.master if ref.states.master
                                                       is not None else ref.states.params)
            and resumed.states.optimizer.m.tobytes() == ref.states.optimizer.m.tobytes()
            and resumed.states.optimizer.v.tobytes() == ref.states.optimizer.v.tobytes())
    ok = world.comm.allreduce(int(same), op=MPI.MIN)  # reporting only (MPI's own)
    if world.rank == 0:
        out["resume"][tag] = {"bit_identical": bool(ok), "dir": d.name}
    if tag == "2-float64":
        final_ref = ref.full_params()

# 2. reshard: the 4-rank stage-2 checkpoint of step 2 resumed on 1, 2, 3 ranks, any stage
for k, stage in ((1, 3), (2, 1), (3, 3), (3, 0)):
    sub = world.Split(0 if world.rank < k else 1, world.rank)
    if world.rank < k:
        eng = engine(sub, stage)
        sharded_checkpoint.load(eng, ROOT / "2-float64")
        train(eng, 4)
        full = eng.full_params()
        if sub.rank == 0:
            out["reshard"][f"{k} ranks, stage {stage}"] = {
                "parity": parity([0.0], [0.0], full, final_ref),
                "max_param_diff": max_abs_diff(full, final_ref)}
    sub.comm.Free()
world.Barrier()

# 3. a crash after the shards, before the manifest: the previous checkpoint stays loadable
eng = engine(world, 2)
sharded_checkpoint.load(eng, ROOT / "2-float64")
train(eng, 4)
try:
    sharded_checkpoint.save(eng, ROOT / "2-float64", on_shard_written=crash)
except SimulatedCrash:
    pass
world.Barrier()
if world.rank == 0:
    d4 = sharded_checkpoint.step_dir(ROOT / "2-float64", 4)
    out["crash"]["step_4_shards_written"] = len(list(d4.glob("shard_*.npz")))
    out["crash"]["latest"] = sharded_checkpoint.latest(ROOT / "2-float64").name
    try:
        sharded_checkpoint.read_manifest(d4)
        out["crash"]["incomplete_refused"] = ""
    except sharded_checkpoint.CheckpointError as e:
        out["crash"]["incomplete_refused"] = str(e)
again = engine(world, 2)
sharded_checkpoint.load(again, ROOT / "2-float64")  # the root: its latest complete checkpoint
train(again, 4)
same = world.comm.allreduce(int(bits(again.full_params()) == bits(final_ref)), op=MPI.MIN)
if world.rank == 0:
    out["crash"]["resumed_bit_identical"] = bool(same)
    # consolidate step 2 into one file the serial model loads
    path = sharded_checkpoint.consolidate(ROOT / "2-float64" / "step_00000002", ROOT / "full.npz")
    out["consolidated"] = str(path)
    print("CKPT_CHECK " + json.dumps(out), flush=True)
