"""What every rank of ``minipar run`` runs: ``python -m minipar.run.worker --worker OPTIONS``.

The launcher (:func:`minipar.run.main`) has checked the options; each rank
builds the same :class:`~minipar.parallel.common.RunSpec`, runs the strategy's
``measure(options, spec)`` (:mod:`minipar.run.dp`, ...) and rank 0 turns its
measurements into the summary (:func:`minipar.run.summary.build`), printed as
one ``MINIPAR_SUMMARY {json}`` line (:func:`minipar.launch.serve`).
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
    m = strategy_module(options["strategy"]).measure(options, spec)
    return None if m is None else build(options, spec, m)


if __name__ == "__main__":
    from minipar import launch
    from minipar.run.summary import SUMMARY_PREFIX

    sys.exit(launch.serve(work, sys.argv[1:], SUMMARY_PREFIX))
