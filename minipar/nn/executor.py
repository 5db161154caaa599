"""The units executor — исполнитель по блокам модели — 模型单元执行器.

EN units executor (one walk over the model) · RU исполнитель по блокам (единый
проход по модели) · ZH 单元执行器（模型的唯一遍历）

Every strategy in minipar trains the same model the same way: forward through
the units (:mod:`minipar.nn.units`: embedding, blocks, head), the loss, then
backward through the units in reverse.  What differs is only *where the
parameters come from*, *what happens to the activations in between* and
*where the gradients go*.  So the walk is written once, here, and a strategy
plugs in through five hooks (the design of PyTorch FSDP's pre-/post-forward
and post-backward hooks, Zhao et al. 2023, arXiv 2304.11277; DeepSpeed's
ZeRO-3 parameter fetching, Rajbhandari et al. 2019, arXiv 1910.02054):

==========================  ==========================================================
hook                        serial default (:class:`Hooks`) / who overrides it
==========================  ==========================================================
``fetch(u) -> p``           views of the parameter dict / ZeRO-3 all-gathers the unit
``release(u, p)``           nothing / ZeRO-3 drops the gathered parameters
``on_saved(u, saved, x)``   keep ``saved`` as is / checkpointing keeps the input x
                            instead, offloading moves ``saved`` to the host
``restore(u, kept)``        give it back / recompute or move back
``on_grads(u, grads)``      collect them in ``hooks.grads`` / DDP fills buckets and
                            starts their all-reduce, ZeRO-2/3 reduce-scatter
==========================  ==========================================================

The walk, for units u_a … u_{b-1} (a pipeline stage runs a slice [a, b)):

    forward:   for u in units:            p = fetch(u); y, saved = u.forward(p, x);
                                          release(u, p); kept.append(on_saved(u, saved, x));
                                          x = y
    loss:      L = CE(logits, targets) + Σ_u aux_u;   dlogits = S · ∂CE/∂logits
    backward:  for u in reversed(units):  p = fetch(u); saved = restore(u, kept.pop());
                                          dx, g = u.backward(p, saved, dx, daux=S);
                                          release(u, p); on_grads(u, g)

or, split (zero-bubble pipelines, Qi et al. 2023): :func:`backward_input` (B) walks
the same way with ``u.backward_input`` and returns dx and, per unit, what W needs;
:func:`backward_weight` (W), later, turns it into each unit's gradients for
``on_grads`` — the same gradients, bit for bit.

with S the gradient scale (a data-parallel rank's loss weight b_r/B times a
mixed-fp16 loss scale).  Because ``saved`` holds activations only, a unit's
parameters are needed exactly inside ``fetch … release``, twice per step.
Each unit's forward and backward can be timed: the optional ``records`` list
receives ``(what, unit name, t_start, t_end)`` (``perf_counter`` seconds),
the compute lanes of a timeline (DDP's overlap figure is drawn from them).
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any

from minipar.nn.loss import cross_entropy_backward, cross_entropy_forward
from minipar.nn.units import Unit

__all__ = ["Hooks", "backward", "backward_input", "backward_weight", "forward",
           "loss_and_grads"]

Record = tuple[str, str, float, float]


class Hooks:
    """The serial run: parameters from a dict of full names, activations kept as they
    are, gradients collected into ``self.grads`` (full names).  Subclass and override
    the hooks a strategy needs; every hook receives the :class:`~minipar.nn.units.Unit`."""

    def __init__(self, params: dict[str, Any] | None = None) -> None:
        self.params = params
        self.grads: dict[str, Any] = {}

    def fetch(self, unit: Unit) -> dict[str, Any]:
        """The unit's parameters by local name (here: the arrays of ``self.params``)."""
        if self.params is None:
            raise ValueError("Hooks() without params: pass the parameter dict or override fetch")
        return unit.params(self.params)

    def release(self, unit: Unit, params: dict[str, Any]) -> None:
        """The unit is done with ``params`` until its next fetch (serially: nothing to do)."""

    def on_saved(self, unit: Unit, saved: Any, x: Any) -> Any:
        """What to keep of the unit's ``saved`` until its backward (serially: all of it).
        ``x`` is the unit's input: checkpointing keeps it and recomputes ``saved``."""
        return saved

    def restore(self, unit: Unit, kept: Any) -> Any:
        """``saved`` again from what :meth:`on_saved` kept (serially: ``kept`` itself)."""
        return kept

    def on_backward_input(self, unit: Unit) -> None:
        """The unit's B (zero bubble) is done: its ``saved`` is dropped, what its W needs
        lives on in the pending gradients (serially: nothing to do; checkpointing takes the
        activations off its ledger here rather than at ``on_grads``, which comes with W)."""

    def on_grads(self, unit: Unit, grads: dict[str, Any]) -> None:
        """The unit's gradients by local name, as soon as its backward made them."""
        self.grads.update({unit.prefix + k: v for k, v in grads.items()})


def _now() -> float:
    return time.perf_counter()


def forward(units: Sequence[Unit], hooks: Hooks, x: Any, records: list[Record] | None = None,
            aux: list[float] | None = None, loads: dict[str, Any] | None = None
            ) -> tuple[Any, list[Any]]:
    """Run ``units`` in order on ``x``; returns ``(y, kept)``, one ``on_saved`` result per unit.

    ``aux``, when given, receives each unit's auxiliary loss (MoE load balancing,
    0.0 for a dense unit), read from ``saved`` before :meth:`Hooks.on_saved` sees it;
    ``loads``, when given, adds up each MoE unit's top-k assignments per expert under its
    prefix (loss-free balancing: counted here, once per forward, never by a recompute)."""
    kept: list[Any] = []
    for u in units:
        p = hooks.fetch(u)
        t0 = _now()
        y, saved = u.forward(p, x)
        if records is not None:
            records.append(("forward", u.name, t0, _now()))
        hooks.release(u, p)
        del p
        if aux is not None:
            aux.append(u.aux_loss(saved))
        if loads is not None and u.loads(saved) is not None:
            loads[u.prefix] = loads.get(u.prefix, 0) + u.loads(saved)
        kept.append(hooks.on_saved(u, saved, x))
        del saved
        x = y
    return x, kept


def backward(units: Sequence[Unit], hooks: Hooks, kept: list[Any], dy: Any, scale: float = 1.0,
             records: list[Record] | None = None) -> Any:
    """Run the backward of ``units`` in reverse from ``dy`` (the gradient of the last
    unit's output); returns the gradient of the first unit's input (None for the embedding).

    ``kept`` is :func:`forward`'s list for these units; it is emptied as the walk goes,
    so each unit's activations are freed right after its backward.  ``scale`` is
    d(scaled loss)/d(aux loss), the factor the MoE auxiliary loss's gradient gets."""
    if len(kept) != len(units):
        raise ValueError(f"{len(kept)} kept activations for {len(units)} units")
    for u in reversed(units):
        p = hooks.fetch(u)
        saved = hooks.restore(u, kept.pop())
        t0 = _now()
        dy, grads = u.backward(p, saved, dy, scale)
        if records is not None:
            records.append(("backward", u.name, t0, _now()))
        del saved
        hooks.release(u, p)
        del p
        hooks.on_grads(u, grads)
        del grads
    return dy


def backward_input(units: Sequence[Unit], hooks: Hooks, kept: list[Any], dy: Any,
                   scale: float = 1.0, records: list[Record] | None = None
                   ) -> tuple[Any, list[Any]]:
    """**B** of ``units`` (Qi et al. 2023): the walk of :func:`backward` with each unit's
    ``backward_input``; returns ``(dx, pending)``, ``pending`` one entry per unit (in
    ``units``' order) for :func:`backward_weight`.  ``kept`` is emptied as in
    :func:`backward`: what B does not hand to W is freed here; nothing reaches
    ``hooks.on_grads`` yet."""
    if len(kept) != len(units):
        raise ValueError(f"{len(kept)} kept activations for {len(units)} units")
    pending: list[Any] = [None] * len(units)
    for i in reversed(range(len(units))):
        u = units[i]
        p = hooks.fetch(u)
        saved = hooks.restore(u, kept.pop())
        t0 = _now()
        dy, pending[i] = u.backward_input(p, saved, dy, scale)
        if records is not None:
            records.append(("backward_input", u.name, t0, _now()))
        del saved
        hooks.on_backward_input(u)
        hooks.release(u, p)
        del p
    return dy, pending


def backward_weight(units: Sequence[Unit], hooks: Hooks, pending: list[Any],
                    records: list[Record] | None = None) -> None:
    """**W** of ``units``: each unit's ``backward_weight`` on what its B kept, in the
    order :func:`backward` would have made them (last unit first), each unit's gradients
    to ``hooks.on_grads``.  Needs no parameter (dW = xᵀ dy) and, outside sequence
    parallelism, no message."""
    if len(pending) != len(units):
        raise ValueError(f"{len(pending)} pending weight gradients for {len(units)} units")
    for i in reversed(range(len(units))):
        u = units[i]
        t0 = _now()
        grads = u.backward_weight(pending[i])
        pending[i] = None
        if records is not None:
            records.append(("backward_weight", u.name, t0, _now()))
        hooks.on_grads(u, grads)
        del grads


def loss_and_grads(units: Sequence[Unit], hooks: Hooks, tokens: Any, targets: Any,
                   scale: float = 1.0, records: list[Record] | None = None,
                   loads: dict[str, Any] | None = None) -> float:
    """Forward, loss, backward of the whole model; the gradients go to ``hooks.on_grads``.

    Loss = mean cross-entropy of the last unit's logits + the units' auxiliary
    losses.  The gradients are those of ``scale`` x loss (dlogits scaled by
    ``scale``, MoE's daux = ``scale``); the returned loss (a float) is not scaled."""
    aux: list[float] = []
    logits, kept = forward(units, hooks, tokens, records, aux, loads)
    ce, s_ce = cross_entropy_forward(logits, targets)
    loss = ce + sum(aux)
    del logits
    dlogits = cross_entropy_backward(s_ce, scale)
    del s_ce
    backward(units, hooks, kept, dlogits, scale, records)
    return loss
