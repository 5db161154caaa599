"""The transformer MLP (feed-forward) block — блок MLP (прямого распространения) — 前馈 (MLP) 块.

    h = GELU(x W_in + b_in),   y = h W_out + b_out,   d -> d_ff -> d

(Vaswani et al. 2017, arXiv 1706.03762; GELU with the tanh approximation as
in GPT-2.)  Megatron tensor parallelism (Shoeybi et al. 2019, arXiv
1909.08053) splits W_in by columns — GELU stays local — and W_out by rows;
this function works on either shard, since it never looks at d_ff.
The same function is one expert of a mixture of experts (``moe.py``).
"""

from __future__ import annotations

from typing import Any

from minipar.nn.layers import (
    bias_backward,
    bias_forward,
    gelu_backward,
    gelu_forward,
    linear_backward,
    linear_forward,
)


def mlp_forward(p: dict[str, Any], x: Any) -> tuple[Any, tuple]:
    """y = GELU(x W_in + b_in) W_out + b_out, ``p`` = {w_in, b_in, w_out, b_out}."""
    a, s1 = linear_forward(x, p["w_in"])
    h, s2 = gelu_forward(bias_forward(a, p["b_in"]))
    y, s3 = linear_forward(h, p["w_out"])
    return bias_forward(y, p["b_out"]), (s1, s2, s3)


def mlp_backward(p: dict[str, Any], saved: tuple, dy: Any) -> tuple[Any, dict[str, Any]]:
    """Return ``(dx, grads)`` with grads keyed like ``p`` (its weights are read, not saved)."""
    s1, s2, s3 = saved
    db_out = bias_backward(dy)
    dh, dw_out = linear_backward(p["w_out"], s3, dy)
    da = gelu_backward(s2, dh)
    db_in = bias_backward(da)
    dx, dw_in = linear_backward(p["w_in"], s1, da)
    return dx, {"w_in": dw_in, "b_in": db_in, "w_out": dw_out, "b_out": db_out}
