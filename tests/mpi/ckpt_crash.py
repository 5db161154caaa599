"""A real crash mid-save: rank 1 dies (os._exit) after writing its step-4 file.

Usage: ckpt_crash.py ROOT.  Trains ZeRO-2 on 2 ranks, saves at step 2, trains
to step 4 and starts saving again; rank 1 exits abruptly after its file is on
disk, before the manifest, and MPI ends the job.  tests/test_checkpoint.py
then resumes from what is left.
"""

from __future__ import annotations

import os
import sys

from mpi4py import MPI

from minipar.comm import TracedComm
from minipar.comm.topology import Grid
from minipar.parallel import checkpoint
from minipar.parallel.common import RunSpec
from minipar.parallel.zero.engine import ZeRO

SPEC = RunSpec(steps=4)
comm = TracedComm(MPI.COMM_WORLD)
eng = ZeRO(Grid(comm, dp=comm.size), SPEC, stage=2)
for step in range(4):
    eng.step(SPEC.batch_at(step))
    if step == 1:
        checkpoint.save(eng, sys.argv[1], comm, spec=SPEC)


def die(path: object) -> None:
    if comm.rank == 1:
        os._exit(3)


checkpoint.save(eng, sys.argv[1], comm, spec=SPEC, on_shard_written=die)
print("UNREACHABLE: the manifest of step 4 was written", flush=True)
