"""The serial arithmetic of a hybrid's ZeRO++ run — последовательная арифметика ZeRO++ в
гибриде — 混合并行中 ZeRO++ 的串行算术.

EN serial reference of ZeRO++ in a pipeline · RU последовательный эталон ZeRO++ в конвейере ·
ZH 流水线中 ZeRO++ 的串行参考

The hybrid's ZeRO-3 with ZeRO++ (:mod:`minipar.parallel.hybrid.sync`, ``zeropp``) equals,
bit for bit, the serial run that repeats :mod:`minipar.parallel.zero.oracle`'s arithmetic
stage by stage and micro-batch by micro-batch: :func:`hybrid_zeropp_reference`.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from minipar.nn import executor
from minipar.parallel.zero.oracle import FixedHooks, qgz_sum, ring_sum
from minipar.parallel.zero.shard import shard_range
from minipar.parallel.zero.zeropp import BlockCodec
from minipar.precision import ModelStates, get


def mpi4py_sum(xs: list[float]) -> float:
    """Σ xs as mpi4py's ``allreduce`` of Python floats adds them (the pipeline's global loss,
    :meth:`~minipar.parallel.pipeline.engine.PipelineParallel._global`): a binomial tree
    to rank 0, ((x0 + x1) + (x2 + x3)) + ...; any order for two numbers and zeros."""
    acc, mask = list(xs), 1
    while mask < len(acc):
        for r in range(0, len(acc) - mask, 2 * mask):
            acc[r] = acc[r] + acc[r + mask]
        mask <<= 1
    return float(acc[0])


def hybrid_zeropp_reference(spec: Any, dp: int, pp: int, m: int, parts: tuple[str, ...],
                            node: int, block: int, schedule: str = "1f1b") -> dict[str, Any]:
    """The serial ZeRO++ run of the hybrid's ZeRO-3 on dp x pp ranks (tp = cp = 1, one chunk
    per stage, a dense GPT), ``m`` micro-batches of ``schedule``, nodes of ``node`` over the dp ranks of a
    stage: what :func:`zeropp_reference` does, per pipeline stage (its units, its flat
    buffer cut N = dp ways), per micro-batch i of replica d (rows ``spans.span``, loss
    weight w_i = b_i/B: the stage loop's, :mod:`minipar.parallel.pipeline.stage_loop`):

    1. every stage's weights as the all-gathers deliver them (qwZ's int8 parts, hpZ's copies);
    2. micro-batch i of replica d through the stages in turn (the wire carries the exact
       activations and their gradients), each stage's loss Σ_i (w_i Σ aux + w_i ce_i on the
       last), the gradients of w_i·ℓ_i per unit;
    3. per micro-batch, in the order of the stage's backwards (its schedule's Backward or
       BackwardWeight instructions: GPipe's last micro-batch first), each part's sum over the dp ranks (qgZ's or the ring's, as in :func:`zeropp_reference`)
       *added* to the shard's gradient (ZeRO-3's accumulation, from 0);
    4. each stage's optimizer on its whole buffer; the loss: every rank's part summed as
       mpi4py adds them (:func:`mpi4py_sum`, world rank d·pp + s).  Its ``losses``, final
       ``params`` (the serial order) and ``initial`` (float64)."""
    from minipar import spans
    from minipar.nn.loss import cross_entropy_backward, cross_entropy_forward
    from minipar.optim import FlatParams
    from minipar.parallel.pipeline.partition import check_pipeline, stage_units
    from minipar.parallel.pipeline.parts import replica_rows
    from minipar.parallel.pipeline.schedule import stage_schedule
    from minipar.parallel.pipeline.stage_loop import Backward, BackwardWeight
    from minipar.parallel.zero.shard import units_table

    model, policy = spec.model(), get(spec.precision)
    units, init = model.units(), spec.initial_params()
    balance = check_pipeline(spec.layers, pp, m, schedule, 1, None,
                             spans.counts(spec.batch, dp)[-1], None)
    stages = []
    for s in range(pp):
        su = stage_units(units, balance, s, pp, 1, "loop")[0]
        whole = ModelStates(policy, {n: init[n] for u in su for n in u.full_names},
                            spec.optimizer, **spec.opt_kwargs())
        st = ModelStates(policy, {"flat": whole.params.copy()}, spec.optimizer,
                         **spec.opt_kwargs())
        size = whole.layout.size
        stages.append((su, whole.layout, st, units_table(su, whole.layout),
                       [shard_range(size, dp, r) for r in range(dp)]))
    pd, int8 = policy.param_dtype, BlockCodec("int8", block)
    order = [[i.mb for i in stage_schedule(schedule, s, pp, m, 1)
              if isinstance(i, (Backward, BackwardWeight))] for s in range(pp)]
    table = [row for *_, t, _ in stages for row in t]
    losses = []
    for step in range(spec.steps):
        batch = spec.batch_at(step)
        weights = {}
        for _, _, st, tab, shards in stages:
            for u, a, b, _ in tab:
                pieces = [st.params[max(a, lo):max(a, min(b, hi))] for lo, hi in shards]
                weights[u.name] = np.concatenate(
                    [int8.roundtrip(p) if "qwz" in parts else p for p in pieces])
        local = [[0.0] * pp for _ in range(dp)]
        xs = [replica_rows(batch, d, dp) for d in range(dp)]
        by_mb = []
        for i in range(m):
            by_rank = []
            for d in range(dp):
                x, y = xs[d]
                lo, hi = spans.span(len(x), m, i)
                w = 1.0 * (hi - lo) / batch.size
                hooks, h, kept = FixedHooks(weights, table, pd), x[lo:hi], []
                for s, (su, *_) in enumerate(stages):
                    aux: list[float] = []
                    h, k = executor.forward(su, hooks, h, aux=aux)
                    kept.append(k)
                    local[d][s] += w * sum(aux)
                ce, saved = cross_entropy_forward(h, y[lo:hi])
                local[d][-1] += w * ce
                scale = w * stages[0][2].loss_scale  # (one scaler's decisions: the world's)
                dy = cross_entropy_backward(saved, scale)
                for s in reversed(range(pp)):
                    dy = executor.backward(stages[s][0], hooks, kept[s], dy, scale)
                by_rank.append(hooks.flat)
            by_mb.append(by_rank)
        for s, (_, _, st, tab, shards) in enumerate(stages):
            st.grads[...] = 0
            for i in order[s]:
                by_rank = by_mb[i]
                for u, a, b, _ in tab:
                    for q, (lo, hi) in enumerate(shards):
                        i0, j0 = max(a, lo), max(a, min(b, hi))
                        if i0 < j0:
                            parts_q = [g[u.name][i0 - a:j0 - a] for g in by_rank]
                            st.grads[i0:j0] += (qgz_sum(parts_q, node, block) if "qgz" in parts
                                                else ring_sum(parts_q, q))
        found = (any(st.local_found_inf() for *_, st, _, _ in stages)
                 if stages[0][2].scaler is not None else None)
        for *_, st, _, _ in stages:
            st.step(found)
        losses.append(mpi4py_sum([local[d][s] for d in range(dp) for s in range(pp)]))
    full: dict[str, Any] = {}
    for _, lay, st, _, _ in stages:
        full.update(lay.unflatten(st.params))
    full = {n: full[n] for n in model.param_shapes()}
    return {"losses": losses, "params": FlatParams.like(full).flatten(full),
            "initial": FlatParams.like(init).flatten(init)}

