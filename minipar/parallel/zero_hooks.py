"""ZeRO's shards and its hooks on the units executor — шарды ZeRO и его хуки — ZeRO 的分片与钩子.

EN parameter / gradient partitioning · RU разбиение параметров и градиентов ·
ZH 参数与梯度分区

Rajbhandari et al. 2019, "ZeRO", arXiv 1910.02054, §5 (P_os, P_g, P_p).
Rank r of N owns the slice ``[lo_r, hi_r)`` of the flat buffer of Ψ elements
(the ``numpy.array_split`` rule of :mod:`minipar.spans`).  A unit
(:mod:`minipar.nn.units`: embedding, block, head) is the span ``[a, b)``;
its part on rank r is the overlap of the two, so

    fetch (stage 3):   all-gather the unit's parts      -> the unit's b - a parameters
    grads (stages 2-3): reduce-scatter the unit's grads, cut at the shard borders
                        (rank q receives max(0, min(b, hi_q) - max(a, lo_q)) elements)

and fetching every unit once moves exactly one all-gather of the buffer.
:class:`ZeroHooks` plugs these into the one model walk
(:mod:`minipar.nn.executor`): ``fetch`` gives views of the full buffer
(stages 0-2) or the all-gathered unit (stage 3, held in ``gathered`` until
``release`` drops it — between a unit's forward and its backward nothing of
it stays, since ``saved`` holds activations only); ``on_grads`` writes the
full gradient buffer (stages 0-1) or reduce-scatters the unit's gradients to
their owners (stages 2-3), so no rank ever holds a full gradient buffer.
"""

from __future__ import annotations

import functools
from typing import TYPE_CHECKING, Any

import numpy as np

from minipar import spans
from minipar.collectives import all_gather, reduce_scatter
from minipar.nn import executor
from minipar.nn.gpt import GPT, GPTConfig
from minipar.nn.units import Unit
from minipar.nn.units import spans as unit_spans
from minipar.optim import FlatParams

if TYPE_CHECKING:
    from minipar.parallel.zero import ZeRO

STAGES = (0, 1, 2, 3)
#: the all-reduces ZeRO can run for stage 0's gradients and the one-number reductions
#: (``minipar.collectives.allreduce``'s names; ``"auto"`` by message size and N)
ALLREDUCE_CHOICES = ("auto", "ring", "recursive_doubling", "tree")


def check_stage(stage: Any) -> int:
    """The stage as an int; ValueError unless 0, 1, 2 or 3."""
    if isinstance(stage, bool) or not isinstance(stage, (int, np.integer)) or stage not in STAGES:
        raise ValueError(f"ZeRO stage must be 0 (plain DP), 1 (optimizer states), 2 (+ gradients) "
                         f"or 3 (+ parameters); got {stage!r}")
    return int(stage)


def check_allreduce(algorithm: Any) -> str:
    """The all-reduce algorithm's name; ValueError unless one of :data:`ALLREDUCE_CHOICES`."""
    if algorithm not in ALLREDUCE_CHOICES:
        raise ValueError(f"ZeRO's all-reduce must be one of {', '.join(ALLREDUCE_CHOICES)}; "
                         f"got {algorithm!r}")
    return str(algorithm)


def shard_range(psi: int, world: int, rank: int) -> tuple[int, int]:
    """[lo, hi) of the flat buffer of ``psi`` elements that ``rank`` owns (array_split rule)."""
    if world > psi:
        raise ValueError(f"{world} ranks but only {psi} parameters to shard: every rank must own "
                         "at least one element; use fewer ranks or a bigger model")
    return spans.span(psi, world, rank)


@functools.lru_cache(maxsize=16)
def layout_of(cfg: GPTConfig) -> FlatParams:
    """The flat buffer's layout (cached: one table per configuration, not per engine)."""
    return FlatParams.from_shapes(GPT(cfg).param_shapes())


@functools.lru_cache(maxsize=16)
def unit_table(cfg: GPTConfig) -> tuple[tuple[Unit, int, int, FlatParams], ...]:
    """(unit, lo, hi, the unit's own layout by local name) for each unit of the GPT, in
    buffer order (cached per configuration, like :func:`layout_of`)."""
    return units_table(GPT(cfg).units(), layout_of(cfg))


def units_table(units: Any, layout: FlatParams) -> tuple[tuple[Unit, int, int, FlatParams], ...]:
    """:func:`unit_table` of any units that tile ``layout`` in order (a pipeline stage's)."""
    out = []
    for u, (lo, hi) in zip(units, unit_spans(units, layout)):
        shapes = {n: layout.shapes[layout.names.index(u.prefix + n)] for n in u.names}
        out.append((u, lo, hi, FlatParams.from_shapes(shapes)))
    return tuple(out)


def overlap(a: int, b: int, lo: int, hi: int) -> tuple[int, int]:
    """[a, b) ∩ [lo, hi) as offsets into [lo, hi) (an empty range when they do not meet)."""
    start = min(max(a, lo), hi)
    return start - lo, max(min(b, hi), start) - lo


class ZeroHooks(executor.Hooks):
    """The executor's hooks for one :class:`~minipar.parallel.zero.ZeRO` engine.

    ``gathered`` holds the all-gathered parameters of the units between their
    ``fetch`` and ``release`` (stage 3; at most one unit at a time), and
    ``peak_gathered_bytes`` the most it ever held at once: the measured answer
    to "does stage 3 free what it gathers?".  ``table``: :func:`units_table` of other units
    (a pipeline stage's; default the GPT's); ``accumulate=True``: stages 2-3 *add* each
    reduce-scattered gradient to the shard (a pipeline's micro-batches; the caller zeroes
    it each step)."""

    def __init__(self, eng: ZeRO, table: Any = None, accumulate: bool = False) -> None:
        super().__init__()
        self.eng, self.accumulate = eng, accumulate
        table = unit_table(eng.model.cfg) if table is None else table
        self.table = {u.name: (lo, hi, lay) for u, lo, hi, lay in table}
        self.gathered: dict[str, np.ndarray] = {}
        self.peak_gathered_bytes = 0
        n = eng.comm.size
        self.shards = [shard_range(eng.layout.size, n, q) for q in range(n)]

    def fetch(self, unit: Unit) -> dict[str, Any]:
        """Views of the full buffer (stages 0-2), or the unit all-gathered (stage 3)."""
        e = self.eng
        a, b, lay = self.table[unit.name]
        if e.stage < 3:
            return lay.unflatten(e.params[a:b])
        i, j = overlap(a, b, *e.shard)
        flat = all_gather(e.comm, e.states.params[i:j])
        self.gathered[unit.name] = flat
        self.peak_gathered_bytes = max(self.peak_gathered_bytes,
                                       sum(v.nbytes for v in self.gathered.values()))
        return lay.unflatten(flat)

    def release(self, unit: Unit, params: dict[str, Any]) -> None:
        """Stage 3: drop the unit's gathered parameters (the executor drops its views)."""
        self.gathered.pop(unit.name, None)

    def on_grads(self, unit: Unit, grads: dict[str, Any]) -> None:
        """Into the full gradient buffer (stages 0-1) or reduce-scattered to the owners (2-3)."""
        e = self.eng
        a, b, lay = self.table[unit.name]
        if e.stage <= 1:
            for name, view in lay.unflatten(e.grads[a:b]).items():
                view[...] = grads[name]
            return
        flat = lay.flatten({k: grads[k] for k in lay.names}, e.policy.param_dtype)
        counts = [max(0, min(b, hi) - max(a, lo)) for lo, hi in self.shards]
        i, j = overlap(a, b, *e.shard)
        mine = reduce_scatter(e.comm, flat, counts=counts)
        if self.accumulate:
            e.states.grads[i:j] += mine
        else:
            e.states.grads[i:j] = mine
