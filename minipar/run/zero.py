"""``minipar run zero --stage K``: ZeRO, its options and its measurements.

EN ZeRO, Zero Redundancy Optimizer · RU оптимизатор без избыточности · ZH 零冗余优化器

Launcher side: ``--stage`` (0-3) and the batch check.  Rank side:
:func:`measure_stage` trains ZeRO-K (:class:`minipar.parallel.zero.ZeRO`;
Rajbhandari et al. 2019, arXiv 1910.02054) and measures; :func:`measure`
reports it per rank next to the paper's figures (:func:`formulas`):
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


def measure_stage(comm: Any, spec: Any, stage: int) -> dict[str, Any]:
    """Train ``spec.steps`` steps of ZeRO-``stage`` on ``comm``; this rank's measurements.

    Returns ``engine``, local ``losses`` (weighted), ``bytes_sent_per_step`` (all
    operations of the steps), ``ledger`` by category, ``tracemalloc_bytes`` (net
    bytes of building the engine), ``held_after_steps_bytes`` (net bytes still
    held after the steps: a full gradient buffer left behind by stage 2, or
    gathered parameters not freed by stage 3, would show here),
    ``step_peak_bytes`` (activations and transients), ``peak_gathered_bytes``,
    ``gathered_after_steps`` and ``shard``.  ``minipar bench zero`` and the
    tests reuse it.
    """
    import gc

    from minipar.comm import traced
    from minipar.memory import measure
    from minipar.parallel.common import loss_weight
    from minipar.parallel.zero import ZeRO, check_stage

    c = traced(comm)
    check_stage(stage)
    model, init = spec.model(), spec.initial_params()
    w = loss_weight(spec.batch, c.rank, c.size)
    warm = ZeRO(c, model, init, stage, spec.precision, spec.optimizer, **spec.opt_kwargs())
    warm.train_step(*spec.local_batch(0, c.rank, c.size), w)  # first-use caches (causal
    del warm  # masks, layout tables, NumPy's dtype caches) fill outside the measured regions
    c.stats.reset()
    gc.collect()
    losses, peak = [0.0] * spec.steps, 0
    with measure() as whole:
        with measure() as built:
            eng = ZeRO(c, model, init, stage, spec.precision, spec.optimizer, **spec.opt_kwargs())
        for s in range(spec.steps):
            with measure() as step:
                losses[s] = eng.train_step(*spec.local_batch(s, c.rank, c.size), w)
            peak = max(peak, step.peak_bytes)
        gc.collect()  # cyclic garbage of the steps is not held memory
    return {"engine": eng, "losses": losses,
            "bytes_sent_per_step": c.stats.bytes_sent() / spec.steps,
            "ledger": eng.ledger().bytes_by_category(), "tracemalloc_bytes": built.current_bytes,
            "held_after_steps_bytes": whole.current_bytes, "step_peak_bytes": peak,
            "peak_gathered_bytes": eng.hooks.peak_gathered_bytes,
            "gathered_after_steps": len(eng.hooks.gathered), "shard": eng.shard}


def formulas(psi: int, n: int, stage: int, precision: str) -> dict[str, Any]:
    """The paper's per-rank figures for this run: model-state bytes and bytes sent per step."""
    import numpy as np

    from minipar.plan.zero import STAGE_FORMULAS, zero_comm_bytes_per_rank, zero_model_state_bytes
    from minipar.precision import get

    pol = get(precision)
    p = pol.param_dtype.itemsize
    k = 12 if pol.master_dtype is not None else 2 * np.dtype(pol.state_dtype).itemsize
    sizes = "" if precision == "mixed" else f" with {p}-byte params and grads (2 in the paper)"
    return {"model_state": zero_model_state_bytes(psi, n, stage, k, p, p),
            "model_state_text": f"{STAGE_FORMULAS[stage]}{sizes}, K={k}",
            "bytes": zero_comm_bytes_per_rank(psi, n, stage, p),
            "bytes_text": f"{3 if stage == 3 else 2}Ψ(N-1)/N x {p} bytes"}


def measure(options: dict[str, Any], spec: Any) -> dict[str, Any] | None:
    """Rank side: ZeRO-``--stage``; rank 0 returns every rank's figures."""
    import numpy as np
    from mpi4py import MPI

    from minipar.collectives import ring_allreduce
    from minipar.comm import TracedComm

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
