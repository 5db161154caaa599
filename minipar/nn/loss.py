"""Softmax cross-entropy — перекрёстная энтропия с softmax — softmax 交叉熵.

Mean over all N positions of  −log softmax(z)[target]  computed stably as
``logsumexp(z) − z[target]`` with ``logsumexp(z) = m + log Σ exp(z − m)``,
``m = max z`` (so no exp overflows).  Gradient (tests/test_nn_layers.py):

    dL/dz = (softmax(z) − onehot(target)) / N.

Logits of shape (..., V), integer targets of shape (...).  The loss is
returned as a Python float (computed in float64 or float32, never 16-bit).
"""

from __future__ import annotations

from typing import Any

from minipar.backend import xp
from minipar.nn.dtypes import down, up


def check_targets(targets: Any, n_classes: int, what: str = "targets") -> None:
    """ValueError unless ``targets`` are integers in [0, n_classes)."""
    if targets.dtype.kind not in "iu":
        raise ValueError(f"{what} must be integers, got dtype {targets.dtype}")
    if targets.size and (int(targets.min()) < 0 or int(targets.max()) >= n_classes):
        raise ValueError(
            f"{what} must lie in [0, {n_classes}); got min {int(targets.min())}, "
            f"max {int(targets.max())}"
        )


def cross_entropy_forward(logits: Any, targets: Any) -> tuple[float, tuple]:
    """Mean softmax cross-entropy; returns ``(loss, saved)``."""
    if logits.shape[:-1] != targets.shape:
        raise ValueError(
            f"logits {logits.shape} and targets {targets.shape} disagree: "
            "expected logits of shape targets.shape + (V,)"
        )
    check_targets(targets, logits.shape[-1])
    v = logits.shape[-1]
    z = up(logits).reshape(-1, v)
    t = targets.reshape(-1)
    n = z.shape[0]
    p = z - z.max(axis=-1, keepdims=True)
    xp.exp(p, out=p)
    s = p.sum(axis=-1, keepdims=True)
    p /= s  # softmax, kept for the backward
    rows = xp.arange(n)
    # -log p[target], from the shifted logits so no log(0) can occur
    zt = z[rows, t] - z.max(axis=-1)
    loss = float((xp.log(s[:, 0]) - zt).mean())
    return loss, (p, t, logits.shape, logits.dtype)


def cross_entropy_backward(saved: tuple, dloss: float = 1.0) -> Any:
    """dL/dlogits = dloss · (softmax − onehot) / N, in the logits' dtype."""
    p, t, shape, dtype = saved
    n = p.shape[0]
    g = p.copy()
    g[xp.arange(n), t] -= 1.0
    g *= float(dloss) / n
    return down(g.reshape(shape), dtype)
