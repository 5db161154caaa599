"""What every rank of ``minipar run`` runs: ``python -m minipar.run.worker --worker OPTIONS``.

The launcher (:func:`minipar.run.main`) has checked the options; each rank
builds the same :class:`~minipar.parallel.common.RunSpec`, the strategy's grid
and engine (:func:`minipar.parallel.strategies.build`), trains it with the one
loop (:func:`minipar.parallel.loop.train`) and takes its final parameters from
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

    grid = Grid(TracedComm(), **module.grid_sizes(options, spec))
    engine = strategies.build(options["strategy"], spec, grid,
                              **module.engine_options(options, spec))
    history = loop.train(engine, spec.batch_at, spec.steps)
    params = engine.full_params()
    m = module.report(engine, grid, options, spec, history)
    engine.close()  # collective (no finally: a failed rank must not wait in a collective)
    grid.free()
    if m is None:
        return None
    return {"losses": history.losses, "params": FlatParams.like(params).flatten(params), **m}


if __name__ == "__main__":
    from minipar import launch
    from minipar.run.summary import SUMMARY_PREFIX

    sys.exit(launch.serve(work, sys.argv[1:], SUMMARY_PREFIX))
