"""What every rank of ``minipar run`` runs: ``python -m minipar.run.worker --worker OPTIONS``.

The launcher (:func:`minipar.run.main`) has checked the options; each rank
builds the same :class:`~minipar.parallel.common.RunSpec`, the strategy's grid
and engine (:func:`minipar.parallel.strategies.build`), trains it with the one
loop (:func:`minipar.parallel.loop.fit`: resumed from ``--resume``, checkpoints
into ``--save``, validation every ``--eval-every`` steps) and takes its final parameters from
``engine.full_params()`` — the same for every strategy.  The strategy's module
(:mod:`minipar.run.dp`, ...) adds only what is its own: ``grid_sizes(options,
spec)`` (the grid's axes), ``engine_options(options, spec)`` (the keyword
arguments of its engine) and ``report(engine, grid, options, spec, history)``
(its measurements and notes, on rank 0).  Rank 0 turns them into the summary
(:func:`minipar.run.summary.build`), printed as one ``MINIPAR_SUMMARY {json}``
line (:func:`minipar.launch.serve`).
"""

from __future__ import annotations

import sys
from typing import Any


def work(options: dict[str, Any]) -> dict[str, Any] | None:
    """This rank's part of the run; the summary on rank 0, None elsewhere."""
    from minipar.parallel.common import RunSpec
    from minipar.run.options import strategy_module
    from minipar.run.summary import build

    spec = RunSpec.from_options(options)
    m = run_engine(options, spec, strategy_module(options["strategy"]))
    return None if m is None else build(options, spec, m)


def run_engine(options: dict[str, Any], spec: Any, module: Any) -> dict[str, Any] | None:
    """Build the strategy's engine, train it, and gather what the summary needs."""
    from minipar.comm import TracedComm
    from minipar.comm.topology import Grid
    from minipar.optim import FlatParams
    from minipar.parallel import loop, strategies

    grid = Grid(TracedComm(), **module.grid_sizes(options, spec), node=options.get("node"))
    engine = strategies.build(options["strategy"], spec, grid,
                              **module.engine_options(options, spec))
    history = loop.fit(engine, spec, grid.world, save_dir=options.get("save"),
                       save_every=options.get("save_every") or 0,
                       keep_last=options.get("keep_last") or 0, resume=options.get("resume"),
                       eval_every=options.get("eval_every") or 0,
                       eval_batches=options.get("eval_batches") or 1,
                       aside=grid.world.stats.set_aside)  # the steps' bytes, not validation's
    hosts = _hosts(grid, max(len(history.losses), 1))
    with grid.world.stats.set_aside():  # gathering the result is not a step's traffic
        params = engine.full_params()
    staged = _staged(grid.world, max(len(history.losses), 1))
    m = module.report(engine, grid, options, spec, history)
    engine.close()  # collective (no finally: a failed rank must not wait in a collective)
    grid.free()
    if m is None:
        return None
    return {"losses": history.losses, "start": history.start,
            "validation": {str(k): v for k, v in history.validation.items()},
            "params": FlatParams.like(params).flatten(params), **staged, "hosts": hosts, **m}


def _hosts(grid: Any, steps: int) -> dict[str, Any] | None:
    """Where the ranks ran and what crossed hosts, for the summary (rank 0): each host's
    name, the host of every rank, the placement's lines, and per rank the bytes per step each
    axis sent inside its host and across hosts (:meth:`Grid.bytes_by_axis_hosts`)."""
    mine = {a: {k: v / steps for k, v in b.items()}
            for a, b in grid.bytes_by_axis_hosts().items() if b["intra"] or b["inter"]}
    every = grid.world.comm.gather(mine, root=0)  # pickled, uncounted: a report
    if every is None:
        return None
    return {"names": grid.host_names, "host_of_rank": grid.hosts,
            "placement": grid.placement().splitlines(), "bytes_by_axis_per_rank": every}


def _staged(world: Any, steps: int) -> dict[str, Any]:
    """The device boundary's cost, for the summary (rank 0): the backend, and the bytes each
    rank's steps staged through host memory per step, each way (:mod:`minipar.comm.staging`;
    nothing under NumPy or with a CUDA-aware MPI).  A collective of all ranks."""
    from minipar import backend

    mine = (world.stats.bytes_staged("d2h") // steps, world.stats.bytes_staged("h2d") // steps,
            backend.transfers())
    every = world.comm.gather(mine, root=0)  # pickled, uncounted: a report, not a step
    if every is None:
        return {}
    out = {"backend": backend.name, "cuda_aware_mpi": backend.cuda_aware(),
           "staged_d2h_per_rank": [d for d, _, _ in every],
           "staged_h2d_per_rank": [h for _, h, _ in every]}
    if backend.name == "strict":  # every other crossing, counted by the stand-in
        out["transfers_per_rank"] = [t for _, _, t in every]
    return out


if __name__ == "__main__":
    from minipar import launch
    from minipar.run.summary import SUMMARY_PREFIX

    sys.exit(launch.serve(work, sys.argv[1:], SUMMARY_PREFIX))
