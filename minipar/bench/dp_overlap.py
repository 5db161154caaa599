"""The rank side of the overlap measurement: ``launch.run_json(n, "minipar.bench.dp_overlap",
{"spec": ..., "bucket_bytes": ..., "repeats": ..., "algorithm": ...})``.

:func:`minipar.parallel.data_parallel.measure.measure_overlap` is the measurement (DDP
with and without overlap, alternating in one launch, and the ring's α, β); this module
only serves it to the ranks a front end launches (notebook 03, its test), since a
technique's module does not start processes.
"""

from __future__ import annotations

import sys
from typing import Any


def work(o: dict[str, Any]) -> dict[str, Any] | None:
    """One rank's part: :func:`measure_overlap` on COMM_WORLD (a grid of dp ranks) (rank 0 returns the result)."""
    from minipar.comm import TracedComm
    from minipar.comm.topology import Grid
    from minipar.parallel.common import RunSpec
    from minipar.parallel.data_parallel.measure import measure_overlap

    world = TracedComm()
    return measure_overlap(Grid(world, dp=world.size), RunSpec(**o["spec"]),
                           int(o["bucket_bytes"]), int(o.get("repeats", 5)),
                           o.get("algorithm", "ring"))


if __name__ == "__main__":
    from minipar import launch

    sys.exit(launch.serve(work, sys.argv[1:]))
