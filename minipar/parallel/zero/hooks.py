"""ZeRO's hooks on the units executor — хуки ZeRO — ZeRO 的钩子.

EN parameter / gradient partitioning · RU разбиение параметров и градиентов ·
ZH 参数与梯度分区

Rajbhandari et al. 2019, "ZeRO", arXiv 1910.02054, §5 (P_os, P_g, P_p).
A unit is the span ``[a, b)`` of the flat buffer and rank q owns ``[lo_q, hi_q)``
(:mod:`minipar.parallel.zero.shard`), so

    fetch (stage 3):   all-gather the unit's parts      -> the unit's b - a parameters
    grads (stages 2-3): reduce-scatter the unit's grads, cut at the shard borders
                        (rank q receives max(0, min(b, hi_q) - max(a, lo_q)) elements)

:class:`ZeroHooks` plugs these into the one model walk
(:mod:`minipar.nn.executor`): ``fetch`` gives views of the full buffer
(stages 0-2) or the all-gathered unit (stage 3, held in ``gathered`` until
``release`` drops it — between a unit's forward and its backward nothing of
it stays, since ``saved`` holds activations only); ``on_grads`` writes the
full gradient buffer (stages 0-1) or reduce-scatters the unit's gradients to
their owners (stages 2-3), so no rank ever holds a full gradient buffer.
"""

from __future__ import annotations

from typing import Any

from minipar.collectives import all_gather, reduce_scatter
from minipar.nn import executor
from minipar.nn.units import Unit
from minipar.parallel.zero.shard import overlap, shard_range


class ZeroHooks(executor.Hooks):
    """The executor's hooks of ZeRO-``stage`` over ``comm`` (the N ranks that share the
    flat buffer of ``size`` elements; this rank owns ``shard`` = [lo, hi) of it).

    ``states``: the :class:`~minipar.precision.ModelStates` of my shard (stage 3 gathers
    from ``states.params`` and writes ``states.grads``); ``table``: the units and their
    spans (:func:`~minipar.parallel.zero.shard.unit_table` of a GPT,
    :func:`~minipar.parallel.zero.shard.units_table` of other units, a pipeline stage's);
    ``params`` / ``grads``: the full flat buffers where the stage keeps them (parameters:
    stages 0-2; gradients: stages 0-1; else None); ``dtype``: the gradients' on the wire
    (the parameter dtype); ``accumulate=True``: stages 2-3 *add* each reduce-scattered
    gradient to the shard (a pipeline's micro-batches; the caller zeroes it each step).

    ``gathered`` holds the all-gathered parameters of the units between their
    ``fetch`` and ``release`` (stage 3; at most one unit at a time: the shell measures
    the most it ever held, :class:`~minipar.parallel.zero.engine.MeteredZeroHooks`)."""

    def __init__(self, stage: int, comm: Any, size: int, shard: tuple[int, int], states: Any,
                 table: Any, *, params: Any = None, grads: Any = None, dtype: Any = None,
                 accumulate: bool = False) -> None:
        super().__init__()
        self.stage, self.comm, self.shard, self.states = stage, comm, shard, states
        self.params, self.grads, self.dtype = params, grads, dtype
        self.accumulate = accumulate
        self.table = {u.name: (lo, hi, lay) for u, lo, hi, lay in table}
        self.gathered: dict[str, Any] = {}
        n = comm.size
        self.shards = [shard_range(size, n, q) for q in range(n)]

    def fetch(self, unit: Unit) -> dict[str, Any]:
        """Views of the full buffer (stages 0-2), or the unit all-gathered (stage 3)."""
        a, b, lay = self.table[unit.name]
        if self.stage < 3:
            return lay.unflatten(self.params[a:b])
        i, j = overlap(a, b, *self.shard)
        flat = all_gather(self.comm, self.states.params[i:j])
        self.gathered[unit.name] = flat
        return lay.unflatten(flat)

    def release(self, unit: Unit, params: dict[str, Any]) -> None:
        """Stage 3: drop the unit's gathered parameters (the executor drops its views)."""
        self.gathered.pop(unit.name, None)

    def on_grads(self, unit: Unit, grads: dict[str, Any]) -> None:
        """Into the full gradient buffer (stages 0-1) or reduce-scattered to the owners (2-3)."""
        a, b, lay = self.table[unit.name]
        if self.stage <= 1:
            for name, view in lay.unflatten(self.grads[a:b]).items():
                view[...] = grads[name]
            return
        flat = lay.flatten({k: grads[k] for k in lay.names}, self.dtype)
        counts = [max(0, min(b, hi) - max(a, lo)) for lo, hi in self.shards]
        i, j = overlap(a, b, *self.shard)
        mine = reduce_scatter(self.comm, flat, counts=counts)
        if self.accumulate:
            self.states.grads[i:j] += mine
        else:
            self.states.grads[i:j] = mine
