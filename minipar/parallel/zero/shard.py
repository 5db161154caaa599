"""ZeRO's shards: which slice of the flat buffer each rank owns — шарды ZeRO — ZeRO 的分片.

EN parameter / gradient partitioning · RU разбиение параметров и градиентов ·
ZH 参数与梯度分区

Rajbhandari et al. 2019, "ZeRO", arXiv 1910.02054, §5 (P_os, P_g, P_p).
Rank r of N owns the slice ``[lo_r, hi_r)`` of the flat buffer of Ψ elements
(:func:`shard_range`, the ``numpy.array_split`` rule of :mod:`minipar.spans`:
C_r = Ψ//N elements, one more for the first Ψ mod N ranks).  A unit
(:mod:`minipar.nn.units`: embedding, block, head) is the span ``[a, b)`` of the
buffer (:func:`unit_table`, :func:`units_table`); its part on rank r is the
overlap of the two (:func:`overlap`), and rank q's part of a unit holds

    max(0, min(b, hi_q) - max(a, lo_q))  elements,

so the units' parts tile the shards: gathering every unit once moves exactly
one all-gather of the buffer.  Example: Ψ = 10 on N = 3 gives [0, 4), [4, 7),
[7, 10); the unit [3, 8) is 1, 3 and 1 elements on ranks 0, 1, 2.

What rank r holds at each stage, and how the optimizer's slice *aliases* the full
buffers (:func:`shard_states`): the optimizer steps ``states.params`` and reads
``states.grads``, which for stages 1-2 are views into the full buffers — so the
reduce-scatter lands in my slice of the full gradient buffer, the step writes my
slice of the full parameters, and the all-gather fills the rest of that same buffer.
"""

from __future__ import annotations

import functools
from typing import Any

from minipar import spans
from minipar.backend import xp
from minipar.nn.gpt import GPT, GPTConfig
from minipar.nn.units import Unit
from minipar.nn.units import spans as unit_spans
from minipar.optim import FlatParams
from minipar.precision import ModelStates


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


def shard_states(stage: int, flat: Any, shard: tuple[int, int], policy: Any, optimizer: str,
                 **opt_kwargs: Any) -> tuple[Any, Any, ModelStates]:
    """``(params, grads, states)``: what rank r holds at ``stage`` of the flat float64
    initial parameters ``flat`` (Ψ elements), owning ``shard`` = [lo, hi) of them.

    ==========  ==================  ===============  =====================================
    stage       params (full, Ψ)    grads (full, Ψ)  states: master, moments over ...
    ==========  ==================  ===============  =====================================
    0           yes                 yes              [0, Ψ): every rank steps everything
    1           yes                 yes              [lo, hi); .params, .grads views of
                                                     params[lo:hi], grads[lo:hi]
    2           yes                 None             [lo, hi); .params = params[lo:hi];
                                                     .grads its own shard (the hooks
                                                     reduce-scatter into it)
    3           None                None             [lo, hi): params, grads, states,
                                                     all of the shard only
    ==========  ==================  ===============  =====================================
    """
    lo, hi = (0, flat.size) if stage == 0 else shard
    states = ModelStates(policy, {"shard": flat[lo:hi]}, optimizer, **opt_kwargs)
    params = None if stage == 3 else flat.astype(policy.param_dtype)
    grads = xp.zeros(flat.size, policy.param_dtype) if stage <= 1 else None
    if params is not None:
        states.params = params[lo:hi]  # a view: the step writes my slice of the full params
    if grads is not None:
        states.grads = grads[lo:hi]  # a view: the reduce-scatter lands in my slice
    return params, grads, states
