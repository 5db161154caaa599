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

**Prefetch** (stage 3, ``prefetch = K >= 1``; FSDP's ``forward_prefetch`` /
``backward_prefetch``, DeepSpeed's prefetch bucket): the shell tells the hooks the
walk's order of fetches (:meth:`ZeroHooks.plan`: forward, then backward in reverse;
a pipeline stage's instruction list), and each fetch posts the non-blocking
all-gathers of the next K positions (:mod:`minipar.collectives.iring`) before it
waits for its own; ``on_grads`` posts the unit's reduce-scatter and goes on; every
hook advances what is in flight (``progress``), and :meth:`ZeroHooks.finish` completes
the reduce-scatters, in the order posted, before the optimizer needs the shard.
``reshard=False`` (FSDP2's ``reshard_after_forward=False``): a unit gathered in
forward stays until its last fetch of the walk, its backward gathers nothing.
"""

from __future__ import annotations

from typing import Any

from minipar.collectives import all_gather, reduce_scatter
from minipar.collectives.iring import RingAllgatherRequest, RingReduceScatterRequest
from minipar.comm.tags import nonblocking_tag
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
    the most it ever held, :class:`~minipar.parallel.zero.engine.MeteredZeroHooks`).
    ``prefetch`` K and ``reshard`` (stage 3): the module docstring; ``inflight`` the
    all-gathers posted, by position of the walk, ``pending`` the reduce-scatters."""

    def __init__(self, stage: int, comm: Any, size: int, shard: tuple[int, int], states: Any,
                 table: Any, *, params: Any = None, grads: Any = None, dtype: Any = None,
                 accumulate: bool = False, prefetch: int = 0, reshard: bool = True) -> None:
        super().__init__()
        self.stage, self.comm, self.shard, self.states = stage, comm, shard, states
        self.params, self.grads, self.dtype = params, grads, dtype
        self.accumulate, self.prefetch, self.reshard = accumulate, prefetch, reshard
        self.table = {u.name: (lo, hi, lay) for u, lo, hi, lay in table}
        self.gathered: dict[str, Any] = {}
        n = comm.size
        self.shards = [shard_range(size, n, q) for q in range(n)]
        self.order: list[str] = []  # the walk's fetches, by unit name (plan)
        self.at = self.scattered = 0  # the next position of ``order``; reduce-scatters posted
        self.inflight: dict[int, Any] = {}  # position -> its all-gather, posted
        self.pending: list[tuple[Any, int, int]] = []  # (reduce-scatter, i, j), posted

    def plan(self, order: list[str]) -> None:
        """The units this walk fetches, in order (stage 3; the shell's: when to gather)."""
        self.order, self.at, self.scattered = list(order), 0, 0

    def _counts(self, a: int, b: int) -> list[int]:
        return [max(0, min(b, hi) - max(a, lo)) for lo, hi in self.shards]

    def _post(self, k: int) -> None:
        """Post the all-gather of position ``k`` unless it is posted or stays gathered."""
        name = self.order[k]
        if k in self.inflight or (not self.reshard and (
                name in self.gathered or name in self.order[self.at - 1:k])):
            return
        a, b, _ = self.table[name]
        i, j = overlap(a, b, *self.shard)
        self.inflight[k] = RingAllgatherRequest(self.comm, self.states.params[i:j],
                                                self._counts(a, b), nonblocking_tag(k))

    def progress(self) -> None:
        """Advance what is in flight; apply the reduce-scatters done, in the order posted."""
        for req in self.inflight.values():
            req.progress()
        while self.pending and self.pending[0][0].progress():
            self._apply(*self.pending.pop(0))

    def _apply(self, req: Any, i: int, j: int) -> None:
        if self.accumulate:
            self.states.grads[i:j] += req.result()
        else:
            self.states.grads[i:j] = req.result()

    def finish(self) -> None:
        """Complete every reduce-scatter posted (before the optimizer reads the shard)."""
        for req, i, j in self.pending:
            req.wait()
            self._apply(req, i, j)
        self.pending = []

    def _fetch_planned(self, unit: Unit) -> Any:
        k, self.at = self.at, self.at + 1
        if self.order[k] != unit.name:
            raise ValueError(f"ZeRO-3 walk: fetch of {unit.name} where the plan has "
                             f"{self.order[k]} at position {k}")
        for q in range(k, min(k + 1 + self.prefetch, len(self.order))):
            self._post(q)
        if k in self.inflight:  # (a unit fetched twice, remat's, is gathered twice)
            self.gathered[unit.name] = self.inflight.pop(k).wait()
        self.progress()
        return self.gathered[unit.name]

    def fetch(self, unit: Unit) -> dict[str, Any]:
        """Views of the full buffer (stages 0-2), or the unit all-gathered (stage 3)."""
        a, b, lay = self.table[unit.name]
        if self.stage < 3:
            return lay.unflatten(self.params[a:b])
        if self.at < len(self.order):
            return lay.unflatten(self._fetch_planned(unit))
        i, j = overlap(a, b, *self.shard)
        flat = all_gather(self.comm, self.states.params[i:j])
        self.gathered[unit.name] = flat
        return lay.unflatten(flat)

    def release(self, unit: Unit, params: dict[str, Any]) -> None:
        """Stage 3: drop the unit's gathered parameters (the executor drops its views),
        unless not resharding and the walk fetches the unit again."""
        if self.reshard or unit.name not in self.order[self.at:]:
            self.gathered.pop(unit.name, None)
        self.progress()

    def on_grads(self, unit: Unit, grads: dict[str, Any]) -> None:
        """Into the full gradient buffer (stages 0-1) or reduce-scattered to the owners (2-3)."""
        a, b, lay = self.table[unit.name]
        if self.stage <= 1:
            for name, view in lay.unflatten(self.grads[a:b]).items():
                view[...] = grads[name]
            return
        flat = lay.flatten({k: grads[k] for k in lay.names}, self.dtype)
        counts = self._counts(a, b)
        i, j = overlap(a, b, *self.shard)
        if self.prefetch:
            tag = nonblocking_tag(len(self.order) + self.scattered)
            self.scattered += 1
            self.pending.append((RingReduceScatterRequest(self.comm, flat, counts, tag), i, j))
            return self.progress()
        mine = reduce_scatter(self.comm, flat, counts=counts)
        if self.accumulate:
            self.states.grads[i:j] += mine
        else:
            self.states.grads[i:j] = mine
