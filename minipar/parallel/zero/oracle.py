"""The serial arithmetic of a ZeRO++ run — последовательная арифметика ZeRO++ — ZeRO++ 的串行算术.

EN serial reference of ZeRO++ · RU последовательный эталон ZeRO++ · ZH ZeRO++ 的串行参考

A ZeRO++ run (:mod:`minipar.parallel.zero.zeropp`) cannot equal the unquantized
serial run: it computes with int8-rounded weights and adds int4-rounded gradients.
It equals, bit for bit, the serial run that does the same arithmetic on the same
numbers, :func:`zeropp_reference`, one process standing for the N ranks:

1. every unit's weights are what the all-gather delivers: each rank's part of the
   unit (the unit's span cut at the N shard borders), packed and unpacked
   (:meth:`~minipar.parallel.zero.zeropp.BlockCodec.roundtrip`, qwZ) or as it is; hpZ's
   backward reads the same numbers (its secondary slices are copies of them);
2. each rank's gradient is that of w_r x its rows' loss, computed by the same units
   executor with those weights;
3. a unit's part q of the gradient is the sum of the N ranks' parts q: with qgZ the
   node sums (local ranks in order, each contribution round-tripped in int4 when the
   node has more than one rank) then the nodes' sums (each round-tripped when there
   is more than one node), :func:`~minipar.collectives.quantized.add` in order; without,
   the ring reduce-scatter's order, x_q + (x_{q-1} + (... + (x_{q+2} + x_{q+1})));
4. the optimizer steps the whole buffer (element-wise: the shards' steps, bit for
   bit), and the reported loss is Σ_r w_r ℓ_r in the order of the all-reduce that ran
   (recursive doubling, or the ring for one element).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from minipar.collectives.quantized import add
from minipar.nn import executor
from minipar.parallel.common import local_rows, loss_weight
from minipar.parallel.zero.shard import layout_of, shard_range, unit_table
from minipar.parallel.zero.zeropp import BlockCodec
from minipar.precision import ModelStates, get


class FixedHooks(executor.Hooks):
    """The executor's hooks of one virtual rank: the given weights, its gradients kept."""

    def __init__(self, weights: dict[str, Any], table: Any, dtype: Any) -> None:
        super().__init__()
        self.weights, self.dtype = weights, dtype
        self.lay = {u.name: lay for u, _, _, lay in table}
        self.flat: dict[str, Any] = {}

    def fetch(self, unit: Any) -> dict[str, Any]:
        return self.lay[unit.name].unflatten(self.weights[unit.name].copy())

    def on_grads(self, unit: Any, grads: dict[str, Any]) -> None:
        lay = self.lay[unit.name]
        self.flat[unit.name] = lay.flatten({k: grads[k] for k in lay.names}, self.dtype)


def ring_sum(xs: list[Any], q: int) -> Any:
    """Chunk q of a ring reduce-scatter of ``xs`` (one per rank), in the ring's order."""
    n = len(xs)
    acc = xs[(q + 1) % n].copy()
    for t in range(2, n + 1):
        acc = xs[(q + t) % n] + acc
    return acc


def recursive_doubling_sum(xs: list[float]) -> float:
    """Σ xs as :func:`~minipar.collectives.recursive_doubling_allreduce` adds them."""
    n = len(xs)
    p = 1 << (n.bit_length() - 1)
    rem = n - p
    y = [np.float64(xs[2 * v + 1]) + np.float64(xs[2 * v]) for v in range(rem)]
    y += [np.float64(xs[v + rem]) for v in range(rem, p)]
    m = 1
    while m < p:
        y = [y[v] + y[v ^ m] for v in range(p)]
        m <<= 1
    return float(y[0])


def qgz_sum(xs: list[Any], node: int, block: int) -> Any:
    """A part's qgZ sum of the N ranks' contributions ``xs`` (nodes of ``node`` ranks)."""
    k, m, int4 = node, len(xs) // node, BlockCodec("int4", block)
    sums = [add([int4.roundtrip(x) if k > 1 else x for x in xs[i * k:(i + 1) * k]])
            for i in range(m)]
    return add([int4.roundtrip(s) if m > 1 else s for s in sums])


def zeropp_reference(spec: Any, world: int, parts: tuple[str, ...], node: int,
                     block: int, allreduce: str = "recursive_doubling") -> dict[str, Any]:
    """The serial ZeRO++ run of ``spec`` on ``world`` ranks in nodes of ``node``: its
    ``losses``, final flat ``params`` and the ``initial`` ones (float64)."""
    model = spec.model()
    table, layout, policy = unit_table(model.cfg), layout_of(model.cfg), get(spec.precision)
    units = tuple(u for u, *_ in table)
    flat = layout.flatten(spec.initial_params(), np.float64)
    states = ModelStates(policy, {"flat": flat}, spec.optimizer, **spec.opt_kwargs())
    shards = [shard_range(flat.size, world, r) for r in range(world)]
    pd, int8 = policy.param_dtype, BlockCodec("int8", block)
    losses = []
    for s in range(spec.steps):
        batch = spec.batch_at(s)
        weights = {}
        for u, a, b, _ in table:
            pieces = [states.params[max(a, lo):max(a, min(b, hi))] for lo, hi in shards]
            weights[u.name] = np.concatenate(
                [int8.roundtrip(p) if "qwz" in parts else p for p in pieces])
        by_rank, local = [], []
        for r in range(world):
            lo, hi = local_rows(spec.batch, r, world)
            hooks, w = FixedHooks(weights, table, pd), loss_weight(spec.batch, r, world)
            loss = executor.loss_and_grads(units, hooks, batch.tokens[lo:hi].copy(),
                                           batch.targets[lo:hi].copy(), w * states.loss_scale)
            by_rank.append(hooks.flat)
            local.append(w * loss)
        for u, a, b, _ in table:
            for q, (lo, hi) in enumerate(shards):
                i, j = max(a, lo), max(a, min(b, hi))
                if i >= j:
                    continue
                xs = [g[u.name][i - a:j - a] for g in by_rank]
                states.grads[i:j] = (qgz_sum(xs, node, block) if "qgz" in parts
                                     else ring_sum(xs, q))
        found = states.local_found_inf() if states.scaler is not None else None
        states.step(found)
        losses.append(ring_sum([np.array([x]) for x in local], 0)[0]
                      if allreduce == "ring" else recursive_doubling_sum(local))
    return {"losses": [float(x) for x in losses], "params": states.params,
            "initial": flat}

