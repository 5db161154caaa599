"""ZeRO, measured — измерение ZeRO — ZeRO 的测量: what a rank holds and sends, next to the paper.

EN ZeRO measurements · RU измерения ZeRO · ZH ZeRO 测量

:func:`measure_stage` trains ZeRO-K (:class:`minipar.parallel.zero.ZeRO`) on a
communicator and returns this rank's measurements: bytes sent per step (the
traced communicator's counters), model-state bytes by category (the ledger of
the arrays) and by tracemalloc, the step's peak, and what stage 3 gathered.
:func:`formulas` gives the paper's figures for the same run (Rajbhandari et
al. 2019, arXiv 1910.02054; :mod:`minipar.plan.zero`).  ``minipar run zero``,
``minipar bench zero``, notebook 04 and the tests read the same two functions.
"""

from __future__ import annotations

from typing import Any


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
