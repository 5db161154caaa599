"""``minipar run zero --stage K``: ZeRO, its options and its measurements.

EN ZeRO, Zero Redundancy Optimizer · RU оптимизатор без избыточности · ZH 零冗余优化器

Launcher side: ``--stage`` (0-3) and the batch check.  Rank side:
:func:`minipar.parallel.zero_measure.measure_stage` trains ZeRO-K
(:class:`minipar.parallel.zero.ZeRO`; Rajbhandari et al. 2019, arXiv 1910.02054)
and measures; :func:`measure` reports it per rank next to the paper's figures
(:func:`minipar.parallel.zero_measure.formulas`):
model-state bytes, the replica's (2+2+K)Ψ with the optimizer states split N
ways at stage 1, the gradients too at stage 2 and the parameters too at
stage 3; and bytes sent per step, 2Ψ(N-1)/N elements for stages 0-2 and
3Ψ(N-1)/N for stage 3.
"""

from __future__ import annotations

import argparse
from typing import Any

from minipar.cli_errors import integer

#: ZeRO's stages (:data:`minipar.parallel.zero.STAGES`, repeated here because importing
#: it would start MPI; a test checks that the two agree)
STAGES = (0, 1, 2, 3)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--stage", type=integer(STAGES[0], STAGES[-1]), default=1,
                        help="ZeRO stage 0-3 (default 1)")


def check(options: dict[str, Any], spec: Any) -> None:
    """Launcher side: every rank needs a row of the batch."""
    from minipar.parallel.common import check_world

    check_world(spec.batch, options["ranks"])


def measure(options: dict[str, Any], spec: Any) -> dict[str, Any] | None:
    """Rank side: ZeRO-``--stage``; rank 0 returns every rank's figures."""
    import numpy as np
    from mpi4py import MPI

    from minipar.collectives import ring_allreduce
    from minipar.comm import TracedComm
    from minipar.parallel.zero_measure import formulas, measure_stage

    stage = options.get("stage", 1)
    comm = TracedComm(MPI.COMM_WORLD)
    m = measure_stage(comm, spec, stage)
    with comm.operation("report"):
        losses = ring_allreduce(comm, np.array(m["losses"], dtype=np.float64))
    final = m["engine"].full_params()
    rows = comm.comm.gather((m["bytes_sent_per_step"], sum(m["ledger"].values()),
                             m["tracemalloc_bytes"], m["step_peak_bytes"]))
    if comm.rank != 0:
        return None
    psi, n = m["engine"].layout.size, comm.size
    f = formulas(psi, n, stage, spec.precision)
    notes = [f"Ψ = {psi} parameters; ZeRO stage {stage}; precision {spec.precision}",
             "model-state bytes by tracemalloc per rank: " + ", ".join(f"{r[2]:,}" for r in rows),
             "step peak (tracemalloc, activations + transients): "
             + ", ".join(f"{r[3]:,}" for r in rows)]
    if spec.precision != "mixed":
        notes.append("the paper's memory formulas assume mixed precision (2+2+12 bytes per "
                     "parameter); this run uses the same partitioning with this precision's "
                     "sizes. Run with --precision mixed for the paper's numbers.")
    return {"ranks": n, "data_parallel_ranks": n, "stage": stage,
            "losses": [float(v) for v in losses], "params": final, "psi": psi,
            "bytes_sent_per_rank": [r[0] for r in rows], "bytes_formula": f["bytes"],
            "bytes_formula_text": f["bytes_text"],
            "model_state_bytes_per_rank": [r[1] for r in rows],
            "model_state_tracemalloc_per_rank": [r[2] for r in rows],
            "model_state_formula": f["model_state"],
            "model_state_formula_text": f["model_state_text"], "notes": notes}
