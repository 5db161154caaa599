"""Rank side of tests/test_drills.py: train runs through ``loop.fit``, some of them sabotaged.

Usage: ``drill_check.py OUT PLAN.json``.  The plan is a list of rounds; a round is a
list of runs that train at the same time on disjoint ranks of the world (a run on
``dp·pp·cp·tp`` ranks, taken in order: the first run gets ranks 0.., the next the
following ones).  A run is a dict::

    {"name": "resumed", "strategy": "zero", "sizes": {"dp": 4}, "options": {"stage": 2},
     "spec": {RunSpec fields}, "save": DIR | None, "save_every": K, "resume": DIR | None,
     "start": the step the resume must start at, "drill": None | {"kind", "rank", "step"}}

Each run is ``strategies.build`` + :func:`minipar.parallel.loop.fit`; its rank 0 leaves
``OUT/NAME.npz`` (``losses`` as float64, ``params``: ``full_params()`` flattened in its
own dtype, ``start``).  A ``drill`` sabotages the run on its rank ``rank`` (a rank of
the run) at the checkpoint of step ``step``, through the checkpoint's own seams:

* ``kill_after_save``: the checkpoint is complete (``save`` returned), then the rank
  sends itself SIGKILL, as the kernel's out-of-memory killer would; the others go on
  into the next step and wait for it in a collective until MPI ends the job;
* ``kill_in_save``: SIGKILL after the rank's own file is durable, before the manifest
  (``save``'s ``on_shard_written``): a job killed while it writes a checkpoint;
* ``fsize_shard``: at the checkpoint before ``step``, once the rank's file is written,
  a file-size limit (RLIMIT_FSIZE, SIGXFSZ ignored) of half its size: at ``step`` its
  ``write(2)`` fails with EFBIG, as on a full disk;
* ``fsize_manifest``: at ``step``, once rank 0's file is written, a limit of 64 bytes:
  every shard is on disk and the manifest cannot be written.

A launch that is not ended by a drill prints ``DRILL-SUMMARY N=.. checks=.. failures=..``
(:class:`mpi_checks.Checks`): every run started at its expected step and gave every
rank the same losses and parameters.
"""

from __future__ import annotations

import json
import os
import resource
import signal
import sys
from pathlib import Path

import numpy as np
from mpi4py import MPI

sys.path.insert(0, str(Path(__file__).parent))
from mpi_checks import Checks

from minipar.comm import TracedComm
from minipar.comm.topology import Grid, Layout
from minipar.parallel import checkpoint, loop, strategies
from minipar.parallel.common import RunSpec

OUT, PLAN = Path(sys.argv[1]), json.loads(Path(sys.argv[2]).read_text())
c = Checks("DRILL")
_save = checkpoint.save  # the real one; fit calls checkpoint.save, which the drills wrap


def limit_file_size(nbytes: int) -> None:
    """From now on this process cannot write a file past ``nbytes``: write(2) fails with
    EFBIG (SIGXFSZ ignored, else the kernel kills the process instead)."""
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
    resource.setrlimit(resource.RLIMIT_FSIZE,
                       (nbytes, resource.getrlimit(resource.RLIMIT_FSIZE)[1]))


def die() -> None:
    os.kill(os.getpid(), signal.SIGKILL)


def sabotaged_save(drill: dict, rank: int):
    """``checkpoint.save`` with the drill's sabotage on rank ``rank`` of the run."""
    kind, step = drill["kind"], int(drill["step"])
    mine = rank == drill["rank"]

    def written(path: Path) -> None:  # this rank's file is durable; the manifest is not
        if not mine:
            return
        at = int(path.parent.name.split("_")[1])  # step_00000004/shard_...: step 4
        if kind == "kill_in_save" and at == step:
            die()
        if kind == "fsize_shard" and at < step:  # the next checkpoint's file cannot fit
            limit_file_size(path.stat().st_size // 2)
        if kind == "fsize_manifest" and at == step:
            limit_file_size(64)

    def save(engine, root, comm, **kwargs):
        d = _save(engine, root, comm, on_shard_written=written, **kwargs)
        if kind == "kill_after_save" and mine and d == checkpoint.step_dir(root, step):
            die()
        return d

    return save


def run(job: dict, comm: TracedComm) -> None:
    spec = RunSpec(**job["spec"])
    grid = Grid(comm, **job["sizes"])
    engine = strategies.build(job["strategy"], spec, grid, **job.get("options", {}))
    drill = job.get("drill")
    checkpoint.save = sabotaged_save(drill, comm.rank) if drill else _save
    try:
        h = loop.fit(engine, spec, grid.world, save_dir=job.get("save"),
                     save_every=job.get("save_every", 0), resume=job.get("resume"))
    finally:
        checkpoint.save = _save
    params = engine.full_params()
    flat = np.concatenate([np.ravel(v) for v in params.values()])
    what = job["name"]
    c.check(h.start == job.get("start", 0), f"{what}: started at step {h.start}, "
                                            f"expected {job.get('start', 0)}")
    c.check(len(h.losses) == spec.steps - h.start, f"{what}: {len(h.losses)} losses")
    losses = np.array(h.losses, np.float64)
    mine = (losses.tobytes(), flat.tobytes())
    c.check(len(set(comm.comm.allgather(mine))) == 1,
            f"{what}: the ranks disagree on the losses or the parameters")
    if comm.rank == 0:
        np.savez(OUT / f"{what}.npz", losses=losses, params=flat, start=h.start)
    engine.close()
    grid.free()


world = MPI.COMM_WORLD
for jobs in PLAN:
    first, color = 0, MPI.UNDEFINED
    for i, job in enumerate(jobs):
        n = Layout(**job["sizes"]).world
        if first <= world.rank < first + n:
            color = i
        first += n
    assert first <= world.size, f"a round needs {first} ranks, the world has {world.size}"
    sub = world.Split(color, world.rank)
    if color != MPI.UNDEFINED:
        run(jobs[color], TracedComm(sub, name=jobs[color]["name"]))
        sub.Free()
    world.Barrier()
c.summary(runs=sum(len(jobs) for jobs in PLAN))
