"""A plain multilayer perceptron — многослойный перцептрон — 多层感知机 (MLP).

The smallest model worth parallelising: data parallelism and pipeline
parallelism are first shown on it before the GPT.

    h_0 = x,   h_{i+1} = GELU(h_i W_i + b_i)  for i < L − 1,
    logits = h_{L−1} W_{L−1} + b_{L−1},   loss = mean cross-entropy.

Parameters ``layers.{i}.w`` (sizes[i], sizes[i+1]) and ``layers.{i}.b``,
in layer order, drawn from ``(seed, name)``: W ~ N(0, 1/fan_in) (LeCun),
b = 0.  ``layer_forward`` / ``layer_backward`` run one layer (the backward
takes the layer's parameters again: ``saved`` holds activations only); each
layer is one unit (:mod:`minipar.nn.units`), so ``MLP.loss_and_grads`` is the
units executor's walk and a pipeline stage runs a contiguous range of layers
with the same code.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass
from typing import Any

from minipar import checks
from minipar.nn import executor
from minipar.nn import init as _init
from minipar.nn.dtypes import check_model_dtype
from minipar.nn.layers import (
    bias_backward,
    bias_forward,
    gelu_backward,
    gelu_forward,
    linear_backward,
    linear_forward,
)
from minipar.nn.loss import check_targets, cross_entropy_forward
from minipar.nn.units import Unit


@dataclass(frozen=True)
class MLPConfig:
    """Layer widths ``sizes`` = (inputs, hidden…, classes) and the storage dtype."""

    sizes: tuple[int, ...] = (2, 32, 32, 3)
    dtype: str = "float64"

    def __post_init__(self) -> None:
        sizes = tuple(self.sizes)
        if len(sizes) < 2 or any(not checks.is_integer(s) or s < 1 for s in sizes):
            raise ValueError(f"sizes must be >= 2 positive integers, got {self.sizes!r}")
        object.__setattr__(self, "sizes", tuple(int(s) for s in sizes))
        check_model_dtype(self.dtype)

    @property
    def n_layers(self) -> int:
        return len(self.sizes) - 1


def layer_forward(p: dict[str, Any], x: Any, last: bool) -> tuple[Any, tuple]:
    """One layer, ``p`` = {w, b}: linear, then GELU unless it is the ``last``."""
    y, s_lin = linear_forward(x, p["w"])
    y = bias_forward(y, p["b"])
    if last:
        return y, (s_lin, None)
    y, s_act = gelu_forward(y)
    return y, (s_lin, s_act)


def layer_backward(p: dict[str, Any], saved: tuple, dy: Any) -> tuple[Any, dict[str, Any]]:
    """Return ``(dx, {w, b})``; ``p`` = {w, b} as in the forward."""
    s_lin, s_act = saved
    if s_act is not None:
        dy = gelu_backward(s_act, dy)
    db = bias_backward(dy)
    dx, dw = linear_backward(p["w"], s_lin, dy)
    return dx, {"w": dw, "b": db}


@dataclass
class MLP:
    """The serial MLP classifier: same API as ``GPT``."""

    cfg: MLPConfig

    def param_shapes(self) -> dict[str, tuple[int, ...]]:
        s = self.cfg.sizes
        out: dict[str, tuple[int, ...]] = {}
        for i in range(self.cfg.n_layers):
            out[f"layers.{i}.w"] = (s[i], s[i + 1])
            out[f"layers.{i}.b"] = (s[i + 1],)
        return out

    def n_params(self) -> int:
        return sum(math.prod(s) for s in self.param_shapes().values())

    def init(self, seed: int = 0) -> dict[str, Any]:
        out = {}
        for name, shape in self.param_shapes().items():
            if name.endswith(".b"):
                out[name] = _init.constant(shape, 0.0, self.cfg.dtype)
            else:
                out[name] = _init.normal(seed, name, shape, 1.0 / math.sqrt(shape[0]), self.cfg.dtype)
        return out

    def _check(self, x: Any, targets: Any | None) -> None:
        if getattr(x, "ndim", None) != 2 or x.shape[1] != self.cfg.sizes[0]:
            raise ValueError(f"x must have shape (batch, {self.cfg.sizes[0]}), got {getattr(x, 'shape', None)}")
        if targets is not None:
            if targets.shape != (x.shape[0],):
                raise ValueError(f"targets must have shape ({x.shape[0]},), got {targets.shape}")
            check_targets(targets, self.cfg.sizes[-1])

    def units(self) -> tuple[Any, ...]:
        """layer 0 … layer L-1 as :class:`minipar.nn.units.Unit` s."""
        return mlp_units(self.cfg)

    def forward(self, params: dict[str, Any], x: Any) -> tuple[Any, list[tuple]]:
        """Logits (B, classes) and one ``saved`` per layer."""
        self._check(x, None)
        return executor.forward(self.units(), executor.Hooks(params), x)

    def loss(self, params: dict[str, Any], x: Any, targets: Any) -> float:
        self._check(x, targets)
        return cross_entropy_forward(self.forward(params, x)[0], targets)[0]

    def loss_and_grads(
        self, params: dict[str, Any], x: Any, targets: Any, loss_scale: float = 1.0
    ) -> tuple[float, dict[str, Any]]:
        """(mean cross-entropy, grads of ``loss_scale``·loss keyed and ordered like ``params``):
        one walk of :func:`minipar.nn.executor.loss_and_grads` with the serial hooks."""
        self._check(x, targets)
        hooks = executor.Hooks(params)
        loss = executor.loss_and_grads(self.units(), hooks, x, targets, loss_scale)
        return loss, {k: hooks.grads[k] for k in params}


# -- the MLP as units (minipar.nn.units) -----------------------------------------------

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
def mlp_units(cfg: MLPConfig) -> tuple[Unit, ...]:
    """layer 0 … layer L-1."""
    return tuple(LayerUnit(cfg, i) for i in range(cfg.n_layers))
