"""A real crash mid-save: rank 1 dies (os._exit) after writing its step-4 shard.

Usage: ckpt_crash.py ROOT.  Trains ZeRO-2 on 2 ranks, saves at step 2, trains
to step 4 and starts saving again; rank 1 exits abruptly after its shard is on
disk, before the manifest, and MPI ends the job.  tests/test_checkpoint.py
then resumes from what is left.
"""

from __future__ import annotations

import os
import sys

from mpi4py import MPI

from minipar.comm import TracedComm
from minipar.parallel import sharded_checkpoint
from minipar.parallel.common import RunSpec, loss_weight
from minipar.parallel.zero.engine import ZeRO

SPEC = RunSpec(steps=4)
comm = TracedComm(MPI.COMM_WORLD)
eng = ZeRO(comm, SPEC.model(), SPEC.initial_params(), 2, optimizer=SPEC.optimizer,
           **SPEC.opt_kwargs())
w = loss_weight(SPEC.batch, comm.rank, comm.size)
for step in range(4):
    eng.train_step(*SPEC.local_batch(step, comm.rank, comm.size), w)
    if step == 1:
        sharded_checkpoint.save(eng, sys.argv[1])


def die(path: object) -> None:
    if comm.rank == 1:
        os._exit(3)


sharded_checkpoint.save(eng, sys.argv[1], on_shard_written=die)
print("UNREACHABLE: the manifest of step 4 was written", flush=True)
