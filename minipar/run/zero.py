"""``minipar run zero --stage K``: ZeRO, its options and its measurements.

EN ZeRO, Zero Redundancy Optimizer · RU оптимизатор без избыточности · ZH 零冗余优化器

Launcher side: ``--stage`` (0-3), ``--allreduce`` (stage 0's all-reduce and
the one-number ones: auto, ring, recursive_doubling, tree) and the batch
check.  Rank side: :func:`minipar.parallel.zero.measure.measure_stage` trains
ZeRO-K (:class:`minipar.parallel.zero.engine.ZeRO`; Rajbhandari et al. 2019, arXiv
1910.02054) and measures; :func:`measure` reports it per rank next to the
paper's figures (:func:`minipar.parallel.zero.measure.formulas`):
model-state bytes, the replica's (2+2+K)Ψ with the optimizer states split N
ways at stage 1, the gradients too at stage 2 and the parameters too at
stage 3; and bytes sent per step, counted, next to the exact figure of what
ran and the paper's 2Ψ(N-1)/N elements for stages 0-2 and 3Ψ(N-1)/N for
stage 3 (the ring's figures: stage 0 under ``--allreduce auto`` runs
recursive doubling for a small model, and a note says so).  ``--remat [K]``,
``--offload host|disk`` (activations) and ``--offload-optimizer host|disk``
(ZeRO-Offload: master weights and moments) come from :mod:`minipar.run.remat_offload`.
"""

from __future__ import annotations

import argparse
from typing import Any

from minipar.cli_errors import integer

#: ZeRO's stages and all-reduces (:data:`minipar.parallel.zero.engine.STAGES`,
#: :data:`~minipar.parallel.zero.engine.ALLREDUCE_CHOICES`, repeated here because importing
#: them would start MPI; a test checks that the copies agree)
STAGES = (0, 1, 2, 3)
ALLREDUCE_CHOICES = ("auto", "ring", "recursive_doubling", "tree")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--stage", type=integer(STAGES[0], STAGES[-1]), default=1,
                        help="ZeRO stage 0-3 (default 1)")
    parser.add_argument("--allreduce", choices=ALLREDUCE_CHOICES, default="auto",
                        help="stage 0's gradient all-reduce (and found_inf's, the loss's): "
                             "auto (by size and N, default), ring (the paper's figure), "
                             "recursive_doubling, tree")
    from minipar.run import remat_offload

    remat_offload.add_arguments(parser, optimizer=True)


def check(options: dict[str, Any], spec: Any) -> None:
    """Launcher side: every rank needs a row of the batch; a known all-reduce."""
    from minipar.parallel.common import check_world

    check_world(spec.batch, options["ranks"])
    if options.get("allreduce", "auto") not in ALLREDUCE_CHOICES:
        raise ValueError(f"--allreduce must be one of {', '.join(ALLREDUCE_CHOICES)}, "
                         f"got {options['allreduce']!r}")
    from minipar.run import remat_offload

    remat_offload.check(options, spec)


def measure(options: dict[str, Any], spec: Any) -> dict[str, Any] | None:
    """Rank side: ZeRO-``--stage``; rank 0 returns every rank's figures."""
    import numpy as np
    from mpi4py import MPI

    from minipar.collectives import allreduce
    from minipar.comm import TracedComm
    from minipar.parallel.zero.measure import formulas, measure_stage

    stage, algorithm = options.get("stage", 1), options.get("allreduce", "auto")
    comm = TracedComm(MPI.COMM_WORLD)
    from minipar.run import remat_offload

    wrap = remat_offload.wrapper(options)
    m = measure_stage(comm, spec, stage, allreduce=algorithm, wrap_hooks=wrap,
                      **remat_offload.optimizer_keywords(options))
    memory, memory_notes = remat_offload.summary_notes(wrap, last=1)
    if stage == 3 and options.get("remat") is not None:
        memory_notes.append("remat under stage 3 all-gathers each recomputed unit again: the "
                            "bytes counted exceed the formula by those gathers")
    off = m["engine"].offload
    if off is not None:
        memory_notes.append(f"optimizer states on {off.place} (ZeRO-Offload): "
                            f"{off.offloaded_bytes:,} bytes off the device; per step "
                            f"{off.moved['to_host'] // off.steps:,} bytes of gradients down, "
                            f"{off.moved['to_device'] // off.steps:,} of parameters up, "
                            f"{off.seconds / off.steps * 1e3:.2f} ms in the host step")
        places = m["engine"].ledger().bytes_by_place()
        memory_notes.append("model-state bytes by place (this rank; the figure above counts "
                            "every place): " + ", ".join(f"{k} {v:,}" for k, v in places.items()))
    with comm.operation("report"):
        losses = allreduce(comm, np.array(m["losses"], dtype=np.float64), algorithm=algorithm)
    final = m["engine"].full_params()
    rows = comm.comm.gather((m["bytes_sent_per_step"], sum(m["ledger"].values()),
                             m["tracemalloc_bytes"], m["step_peak_bytes"],
                             m["bytes_exact_per_step"]))
    if comm.rank != 0:
        return None
    psi, n = m["engine"].layout.size, comm.size
    f = formulas(psi, n, stage, spec.precision, algorithm)
    ran = m["grad_allreduce"] or "ring reduce-scatter + all-gather"
    notes = [f"Ψ = {psi:,} parameters; ZeRO stage {stage}; precision {spec.precision}",
             "model-state bytes by tracemalloc per rank: " + ", ".join(f"{r[2]:,}" for r in rows),
             "step peak (tracemalloc, activations + transients): "
             + ", ".join(f"{r[3]:,}" for r in rows)]
    if f["allreduce_note"]:
        notes.insert(1, f["allreduce_note"])
    notes += memory_notes
    if not spec.precision.startswith("mixed"):
        notes.append("the paper's memory formulas assume mixed precision (2+2+12 bytes per "
                     "parameter); this run uses the same partitioning with this precision's "
                     "sizes. Run with --precision mixed for the paper's numbers.")
    return {"ranks": n, "data_parallel_ranks": n, "stage": stage, "allreduce": algorithm,
            "grad_allreduce": m["grad_allreduce"],
            "losses": [float(v) for v in losses], "params": final, "psi": psi,
            "bytes_sent_per_rank": [r[0] for r in rows],
            "bytes_exact_per_rank": [r[4] for r in rows],
            "bytes_exact_text": ran.replace("_", " "), "bytes_formula": f["bytes"],
            "bytes_formula_text": f["bytes_text"],
            "model_state_bytes_per_rank": [r[1] for r in rows],
            "model_state_tracemalloc_per_rank": [r[2] for r in rows],
            "model_state_formula": f["model_state"],
            "model_state_formula_text": f["model_state_text"], "notes": notes,
            **({"memory": memory} if memory else {}),
            "model_state_by_place": m["engine"].ledger().bytes_by_place()}
