"""ZeRO's step — шаг ZeRO — ZeRO 的训练步.

EN ZeRO training step (stages 0-3) · RU шаг обучения ZeRO (стадии 0-3) ·
ZH ZeRO 训练步（阶段 0-3）

Rajbhandari et al. 2019, "ZeRO", arXiv 1910.02054, §5.  One step on this rank's
rows of the global batch, with the shards of :mod:`minipar.parallel.zero.shard`
and the hooks of :mod:`minipar.parallel.zero.hooks`:

    forward + backward   the executor's one walk through ``hooks`` (stage 3 all-gathers
                         each unit before its forward and its backward, or prefetches;
                         stages 2-3 reduce-scatter each unit's gradients as backward
                         makes them, then ``finish`` what is still in flight)
    gradients            stage 0: all-reduce the full buffer (plain data parallelism);
                         stage 1: reduce-scatter it, my slice lands in states.grads
    optimizer            every rank agrees to skip (found_inf, loss scaling); each steps
                         its own shard of the fp32 master and moments (element-wise, so
                         stepping the slices equals stepping the whole)
    parameters           stages 1-2: all-gather the updated slices into the full
                         buffer; stage 3: nothing (the next fetch gathers each unit)
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from minipar.collectives import all_gather, allreduce, reduce_scatter
from minipar.nn import executor
from minipar.parallel.common import found_inf

__all__ = ["zero_step"]


def zero_step(stage: int, comm: Any, units: Sequence[Any], hooks: Any, x: Any, y: Any,
              scale: float, states: Any, params: Any, grads: Any, optimizer: Any = None,
              algorithm: str = "auto", zero_hooks: Any = None,
              records: list[Any] | None = None) -> tuple[float, bool]:
    """One ZeRO-``stage`` step of ``units`` on this rank's rows ``x``, ``y``; returns
    (this rank's mean loss, whether the update was taken).

    ``scale``: the gradient scale (the rank's loss weight b_r/B times the loss scale);
    ``states``, ``params``, ``grads``: :func:`~minipar.parallel.zero.shard.shard_states`;
    ``optimizer``: what steps the shard (``states``, or its
    :class:`~minipar.parallel.offload.optimizer.OptimizerOffload`); ``algorithm``: the
    all-reduce of stage 0's gradients and of the found_inf flag (``found_inf``: did any
    rank's shard of the gradients overflow in 16 bits? one all-reduce, so that every
    rank skips the step alike); ``zero_hooks``: the ZeRO hooks under ``hooks``' wrappers
    (remat, offload), whose reduce-scatters in flight (prefetch) finish before the step;
    ``records``: the executor's compute intervals, ``(what, unit, t0, t1)``."""
    loss = executor.loss_and_grads(units, hooks, x, y, scale, records)
    (zero_hooks or hooks).finish()  # the shard's gradients complete
    if stage == 0:
        grads[...] = allreduce(comm, grads, algorithm=algorithm)
    elif stage == 1:
        states.grads[...] = reduce_scatter(comm, grads)  # my slice of the full buffer
    done = (optimizer or states).step(found_inf(comm, states, algorithm))
    if stage in (1, 2):
        params[...] = all_gather(comm, states.params)  # states.params is params[lo:hi]
    return loss, done
