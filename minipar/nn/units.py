"""Model units — блоки модели (единицы исполнения) — 模型单元.

EN unit (a contiguous piece of the model) · RU блок модели · ZH 模型单元

A *unit* is the piece of the model that one strategy step handles at a time:
FSDP's "FlatParameter unit" and its auto-wrap policy (Zhao et al. 2023,
arXiv 2304.11277), DeepSpeed ZeRO-3's fetched sub-module, a pipeline stage's
share of layers (GPipe, Huang et al. 2018, arXiv 1811.06965).  The GPT is

    embed (tok_emb, pos_emb) · block 0 · … · block L-1 · head (ln_f, lm_head)

and the MLP classifier is one unit per layer.  Each unit has

* ``name`` ("embed", "block 3", "head", "layer 1") — what a timeline shows;
* ``prefix`` of its parameters' full names ("blocks.3.", "" for embed and
  head, "layers.1.") and its ``names``, local, in the model's order;
* ``forward(p, x) -> (y, saved)`` and ``backward(p, saved, dy, daux=1.0) ->
  (dx, grads)`` with ``p`` and ``grads`` keyed by local name; the first unit
  returns ``dx = None`` (no gradient flows into token ids or the data);
* ``aux_loss(saved)``: the MoE load-balancing loss it added (0.0 if dense);
  ``daux`` is the gradient that loss gets (the run's loss scale).

Units tile the model's parameter order: concatenated, their full names are
``param_shapes`` in order, so a unit is one contiguous span ``[lo, hi)`` of
the flat parameter buffer (:func:`spans`).  ZeRO-3 gathers a unit with one
all-gather for that reason.  ``saved`` holds activations only, never a
parameter (tests/test_saved_activations.py), so the executor
(:mod:`minipar.nn.executor`) may free, offload or recompute it freely.
"""

from __future__ import annotations

import functools
from abc import ABC, abstractmethod
from typing import Any

from minipar.nn.gpt import (
    block_aux_loss,
    block_backward,
    block_forward,
    embed_backward,
    embed_forward,
    head_backward,
    head_forward,
    param_shapes,
)
from minipar.nn.gpt_config import GPTConfig
from minipar.nn.mlp_model import MLPConfig, layer_backward, layer_forward

__all__ = ["BlockUnit", "EmbedUnit", "HeadUnit", "LayerUnit", "Unit", "gpt_units", "mlp_units",
           "spans"]


class Unit(ABC):
    """One contiguous piece of a model; subclasses say how it computes (an abstract base:
    ``EmbedUnit``, ``BlockUnit``, ``HeadUnit``, ``LayerUnit`` implement it)."""

    name: str = ""
    prefix: str = ""
    names: tuple[str, ...] = ()

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

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.name!r}, {len(self.names)} parameter tensors)"


class EmbedUnit(Unit):
    """x = tok_emb[tokens] + pos_emb[:T]; the first unit (its dx is None)."""

    def __init__(self, cfg: GPTConfig) -> None:
        self.cfg, self.name, self.names = cfg, "embed", ("tok_emb", "pos_emb")

    def forward(self, p: dict[str, Any], tokens: Any) -> tuple[Any, Any]:
        return embed_forward(p, tokens, self.cfg)

    def backward(self, p: dict[str, Any], saved: Any, dx: Any,
                 daux: float = 1.0) -> tuple[None, dict[str, Any]]:
        return None, embed_backward(p, saved, dx)


class BlockUnit(Unit):
    """Transformer block ``i``: x + attn(ln1(x)), then + MLP or MoE(ln2(·))."""

    def __init__(self, cfg: GPTConfig, i: int) -> None:
        self.cfg, self.name, self.prefix = cfg, f"block {i}", f"blocks.{i}."
        self.names = tuple(n[len(self.prefix):] for n in param_shapes(cfg)
                           if n.startswith(self.prefix))

    def forward(self, p: dict[str, Any], x: Any) -> tuple[Any, Any]:
        return block_forward(p, x, self.cfg)

    def backward(self, p: dict[str, Any], saved: Any, dy: Any,
                 daux: float = 1.0) -> tuple[Any, dict[str, Any]]:
        return block_backward(p, saved, dy, daux)

    def aux_loss(self, saved: Any) -> float:
        return block_aux_loss(saved)


class HeadUnit(Unit):
    """logits = LayerNorm_f(x) @ lm_head; the last unit."""

    def __init__(self, cfg: GPTConfig) -> None:
        self.cfg, self.name, self.names = cfg, "head", ("ln_f.gamma", "ln_f.beta", "lm_head")

    def forward(self, p: dict[str, Any], x: Any) -> tuple[Any, Any]:
        return head_forward(p, x)

    def backward(self, p: dict[str, Any], saved: Any, dlogits: Any,
                 daux: float = 1.0) -> tuple[Any, dict[str, Any]]:
        return head_backward(p, saved, dlogits)


class LayerUnit(Unit):
    """Layer ``i`` of the MLP classifier: linear, then GELU unless it is the last.
    The first layer casts the data to the model's dtype and returns dx = None."""

    def __init__(self, cfg: MLPConfig, i: int) -> None:
        self.cfg, self.i, self.name, self.prefix = cfg, i, f"layer {i}", f"layers.{i}."
        self.names, self.last = ("w", "b"), i == cfg.n_layers - 1

    def forward(self, p: dict[str, Any], x: Any) -> tuple[Any, Any]:
        if self.i == 0:
            x = x.astype(self.cfg.dtype, copy=False)
        return layer_forward(p, x, self.last)

    def backward(self, p: dict[str, Any], saved: Any, dy: Any,
                 daux: float = 1.0) -> tuple[Any, dict[str, Any]]:
        dx, grads = layer_backward(p, saved, dy)
        return (None if self.i == 0 else dx), grads


@functools.lru_cache(maxsize=32)
def gpt_units(cfg: GPTConfig) -> tuple[Unit, ...]:
    """embed, block 0 … block L-1, head (cached per configuration: units hold no state)."""
    return (EmbedUnit(cfg), *(BlockUnit(cfg, i) for i in range(cfg.n_layer)), HeadUnit(cfg))


@functools.lru_cache(maxsize=32)
def mlp_units(cfg: MLPConfig) -> tuple[Unit, ...]:
    """layer 0 … layer L-1."""
    return tuple(LayerUnit(cfg, i) for i in range(cfg.n_layers))


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
