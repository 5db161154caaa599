"""B and W: a layer's backward split in two — разделение обратного прохода на B и W — 反向传播拆分为 B 与 W.

EN backward split (B: input gradient, W: weight gradient) · RU разделение обратного прохода
· ZH 反向拆分

Zero-bubble pipelines (Qi et al. 2023, "Zero Bubble Pipeline Parallelism", arXiv
2401.10241) split every backward into **B**, the gradient with respect to the
input (the previous pipeline stage waits for it), and **W**, the gradient with
respect to the weights (only the optimizer step needs it).  For a linear layer
y = x W::

    B:  dx = dy Wᵀ          needs W and dy       -> sent down the pipeline now
    W:  dW = xᵀ dy          needs x and dy       -> any time before the step

so between B and W a stage keeps only the layer's input x and its output
gradient dy; everything else the backward needed (the attention probabilities,
GELU's tanh, LayerNorm's x̂, ...) is freed after B.

minipar writes every backward by hand, so the split is one switch: inside
:func:`deferred`, the weight-gradient products (:func:`~minipar.nn.layers.linear_backward`'s
xᵀ dy, an embedding table's scatter, the tensor-parallel layers' own) are not
computed but returned as :class:`Deferred` — the function and the arrays it
will read — and :func:`resolve` computes them later (W).  The same code, the
same arrays, the same order of operations: the gradients are bit-identical to
the unsplit backward (tests/test_backward_split.py).  The small reductions on
the way (biases, LayerNorm's γ and β, an MoE router's gradient) stay in B: they
read what B frees.  This is the design of the paper's own implementation (its
``WeightGradStore`` queues the linear layers' (input, output gradient) pairs).

With sequence parallelism a column-parallel layer keeps only its sequence shard
of x and all-gathers it again for dW (Megatron's re-gather, op ``sp_regather``):
that all-gather is part of W, so W talks to the tensor-parallel group, and B
does not wait for it.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

from minipar.nn import fp8

__all__ = ["Deferred", "deferred", "deferring", "kept_bytes", "resolve", "weight_grad"]

_STATE = threading.local()


class Deferred:
    """A weight gradient not computed yet: ``fn(*args)`` when W runs (:meth:`value`).

    ``a + b`` of two deferred gradients (an expert's gradient summed over the ranks that
    sent it tokens) is deferred too, and computed as ``a.value() + b.value()``: the same
    sum in the same order."""

    __slots__ = ("args", "fn")

    def __init__(self, fn: Callable[..., Any], *args: Any) -> None:
        self.fn, self.args = fn, args

    def value(self) -> Any:
        return self.fn(*(a.value() if isinstance(a, Deferred) else a for a in self.args))

    def arrays(self) -> Iterator[Any]:
        """The arrays W will read (what stays alive from B to W; parameters, which live
        anyway, are passed to W in dicts and not counted)."""
        yield from _arrays(self.args)

    def __add__(self, other: Any) -> Deferred:
        return Deferred(_add, self, other)

    def __radd__(self, other: Any) -> Deferred:
        return Deferred(_add, other, self)

    def __repr__(self) -> str:
        return f"Deferred({getattr(self.fn, '__name__', self.fn)})"


def _arrays(x: Any) -> Iterator[Any]:
    if isinstance(x, Deferred):
        yield from x.arrays()
    elif hasattr(x, "nbytes") and hasattr(x, "dtype") and hasattr(x, "__array_interface__"):
        yield x
    elif isinstance(x, (tuple, list)):
        for y in x:
            yield from _arrays(y)


def _add(a: Any, b: Any) -> Any:
    return a + b


def deferring() -> bool:
    """True inside :func:`deferred` (in this thread): weight gradients wait for W."""
    return getattr(_STATE, "on", False)


@contextmanager
def deferred() -> Iterator[None]:
    """Run a backward as its B: every weight gradient made inside is a :class:`Deferred`."""
    before = deferring()
    _STATE.on = True
    try:
        yield
    finally:
        _STATE.on = before


def weight_grad(fn: Callable[..., Any], *args: Any) -> Any:
    """``fn(*args)`` now, or a :class:`Deferred` of it inside :func:`deferred` (B); a
    deferred one runs under the FP8 recipe of its B (:func:`minipar.nn.fp8.bound`)."""
    return Deferred(fp8.bound(fn), *args) if deferring() else fn(*args)


def resolve(pending: Any) -> Any:
    """W: every :class:`Deferred` in ``pending`` (a dict of gradients, or one Deferred of
    such a dict) computed; arrays passed through."""
    if isinstance(pending, Deferred):
        pending = pending.value()
    return {k: v.value() if isinstance(v, Deferred) else v for k, v in pending.items()}


def kept_bytes(pending: Any) -> int:
    """Bytes kept only for W: the distinct arrays the deferred gradients of ``pending``
    (a dict, a Deferred or a list of them) will read."""
    seen: dict[tuple[int, int], int] = {}
    items = pending if isinstance(pending, list) else [pending]
    for p in items:
        ds = [p] if isinstance(p, Deferred) else \
            [v for v in (p.values() if isinstance(p, dict) else []) if isinstance(v, Deferred)]
        for d in ds:
            for a in d.arrays():  # views of one buffer counted once
                key = (a.__array_interface__["data"][0], int(a.nbytes))
                seen[key] = int(a.nbytes)
    return sum(seen.values())
