"""Model units — блоки модели (единицы исполнения) — 模型单元.

EN unit (a contiguous piece of the model) · RU блок модели · ZH 模型单元

A *unit* is the piece of the model that one strategy step handles at a time:
FSDP's "FlatParameter unit" and its auto-wrap policy (Zhao et al. 2023,
arXiv 2304.11277), DeepSpeed ZeRO-3's fetched sub-module, a pipeline stage's
share of layers (GPipe, Huang et al. 2018, arXiv 1811.06965).  The GPT is

    embed (tok_emb, pos_emb) · block 0 · … · block L-1 · head (ln_f, lm_head)

and the MLP classifier is one unit per layer.  This module holds what every unit
is (:class:`Unit`) and where it sits in the flat buffer (:func:`spans`); each
model's units live beside the model: ``EmbedUnit``, ``BlockUnit``, ``HeadUnit``
and ``gpt_units`` in :mod:`minipar.nn.gpt`, ``LayerUnit`` and ``mlp_units`` in
:mod:`minipar.nn.mlp_model` (so units import no model, and no cycle forms).  Each unit has

* ``name`` ("embed", "block 3", "head", "layer 1") — what a timeline shows;
* ``prefix`` of its parameters' full names ("blocks.3.", "" for embed and
  head, "layers.1.") and its ``names``, local, in the model's order;
* ``forward(p, x) -> (y, saved)`` and ``backward(p, saved, dy, daux=1.0) ->
  (dx, grads)`` with ``p`` and ``grads`` keyed by local name; the first unit
  returns ``dx = None`` (no gradient flows into token ids or the data);
* ``aux_loss(saved)``: the MoE load-balancing loss it added (0.0 if dense);
  ``daux`` is the gradient that loss gets (the run's loss scale);
* ``backward_input(p, saved, dy, daux) -> (dx, pending)`` — **B** (Qi et al. 2023,
  arXiv 2401.10241): dx now, and what W needs (the linears' inputs and output
  gradients) kept in ``pending``; everything else of ``saved`` may be freed — and
  ``backward_weight(pending) -> grads`` — **W**: the parameter gradients.  ``backward``
  is their composition, bit for bit (:mod:`minipar.nn.weight_grad`).

Units tile the model's parameter order: concatenated, their full names are
``param_shapes`` in order, so a unit is one contiguous span ``[lo, hi)`` of
the flat parameter buffer (:func:`spans`).  ZeRO-3 gathers a unit with one
all-gather for that reason.  ``saved`` holds activations only, never a
parameter (tests/test_saved_activations.py), so the executor
(:mod:`minipar.nn.executor`) may free, offload or recompute it freely.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import Any

from minipar.nn import weight_grad

__all__ = ["Unit", "spans"]


class Unit(ABC):
    """One contiguous piece of a model; subclasses say how it computes (an abstract base:
    ``EmbedUnit``, ``BlockUnit``, ``HeadUnit``, ``LayerUnit`` implement it)."""

    name: str = ""
    prefix: str = ""
    names: tuple[str, ...] = ()
    #: False for a unit whose input is token ids (an embedding): no dx, so its whole
    #: backward is W and its B does nothing
    has_input_grad: bool = True

    @property
    def full_names(self) -> tuple[str, ...]:
        """The parameters' names in the whole model (``prefix`` + local name)."""
        return tuple(self.prefix + n for n in self.names)

    def params(self, full: dict[str, Any]) -> dict[str, Any]:
        """This unit's entries of a dict keyed by full name, keyed by local name."""
        return {n: full[self.prefix + n] for n in self.names}

    @abstractmethod
    def forward(self, p: dict[str, Any], x: Any) -> tuple[Any, Any]:
        """``(y, saved)`` for this unit's parameters ``p`` (local names) and input ``x``;
        ``saved`` holds activations only."""

    @abstractmethod
    def backward(self, p: dict[str, Any], saved: Any, dy: Any,
                 daux: float = 1.0) -> tuple[Any, dict[str, Any]]:
        """``(dx, grads)`` (grads keyed by local name); ``daux`` = d(loss)/d(aux loss)."""

    def aux_loss(self, saved: Any) -> float:
        """The auxiliary loss this unit's forward added to the model's loss."""
        return 0.0

    def loads(self, saved: Any) -> Any:
        """An MoE unit's top-k assignments per expert in this forward (None: no router)."""
        return None

    def backward_input(self, p: dict[str, Any], saved: Any, dy: Any,
                       daux: float = 1.0) -> tuple[Any, Any]:
        """**B**: ``(dx, pending)`` — the input's gradient now; ``pending`` holds the
        gradients that are cheap reductions (biases, LayerNorm's γ, β) and, deferred, the
        weight-gradient products (:class:`~minipar.nn.weight_grad.Deferred`: each keeps the
        input and the output gradient of its linear).  ``saved`` is not needed after B.

        The unit's own :meth:`backward`, run with the weight gradients deferred, so
        B and W are the very code of the whole backward."""
        if not self.has_input_grad:
            return None, weight_grad.Deferred(_grads_of, self.backward, p, saved, dy, daux)
        with weight_grad.deferred():
            return self.backward(p, saved, dy, daux)

    def backward_weight(self, pending: Any) -> dict[str, Any]:
        """**W**: the parameter gradients (keyed by local name) from B's ``pending``."""
        return weight_grad.resolve(pending)

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.name!r}, {len(self.names)} parameter tensors)"


def _grads_of(backward: Any, p: Any, saved: Any, dy: Any, daux: float) -> dict[str, Any]:
    return backward(p, saved, dy, daux)[1]


def spans(units: tuple[Unit, ...] | list[Unit], layout: Any) -> list[tuple[int, int]]:
    """``[lo, hi)`` of each unit in the flat buffer of ``layout`` (a ``minipar.optim.FlatParams``);
    ValueError unless the units' parameters are the layout's, in the same order."""
    names = [n for u in units for n in u.full_names]
    if tuple(names) != tuple(layout.names):
        raise ValueError(f"the units' {len(names)} parameters do not tile the buffer's "
                         f"{len(layout.names)} in order")
    out, i = [], 0
    at = [*layout.offsets, layout.size]  # where parameter i starts; the end last
    for u in units:
        out.append((at[i], at[i + len(u.names)]))
        i += len(u.names)
    return out
