"""Layers with explicit forward and backward — слои с явным прямым и обратным проходом — 显式前向与反向传播的层.

Every layer is a pair of pure functions::

    y, saved = layer_forward(x, *params)        # saved: what backward needs
    dx, *dparams = layer_backward(*params, saved, dy)

No state lives in a layer: the caller keeps ``saved`` (one per micro-batch
in a pipeline, dropped and recomputed under activation checkpointing, moved
to the host under offloading).  ``saved`` holds activations only, never a
parameter (not the array, not a view of it): every backward is handed the
parameters it needs again, so ZeRO-3 can free a gathered weight between
forward and backward, and offloading or recomputing ``saved`` never touches
a weight (tests/test_saved_activations.py checks every layer).  Shapes:
``x`` is ``(..., d_in)``; weights are stored ``(d_in, d_out)`` and applied
as ``x @ W + b``.

The bias is a step of its own (``bias_forward``): a row-parallel shard
(Megatron) computes a partial ``x W`` and adds ``b`` once, after the sum.

Formulas the finite-difference tests check (tests/test_nn_layers.py):

* Linear:     y = x W;   dx = dy Wᵀ,  dW = xᵀ dy.
* Bias:       y = x + b;  db = Σ dy (over every axis but the last).
* Embedding:  y = E[ids];    dE[v] = Σ_{ids = v} dy.
* LayerNorm (Ba, Kiros & Hinton 2016, arXiv 1607.06450), eps = 1e-5:
  x̂ = (x − μ) / sqrt(σ² + eps),  y = γ x̂ + β;
  dx = (1/σ̂) (dx̂ − mean(dx̂) − x̂ · mean(dx̂ x̂)),  dx̂ = γ dy.
* GELU, tanh approximation (Hendrycks & Gimpel 2016, arXiv 1606.08415):
  y = ½ x (1 + tanh u),  u = sqrt(2/π) (x + 0.044715 x³).

16-bit inputs are computed in float32 and rounded back (see ``_dtype``).
"""

from __future__ import annotations

import math
from typing import Any

from minipar.backend import xp
from minipar.nn import fp8
from minipar.nn.dtypes import compute_dtype, down, up
from minipar.nn.weight_grad import weight_grad

LN_EPS = 1e-5
_GELU_C = math.sqrt(2.0 / math.pi)
_GELU_A = 0.044715


# --------------------------------------------------------------------- linear
def linear_forward(x: Any, w: Any) -> tuple[Any, tuple]:
    """y = x @ w for ``x`` of shape (..., d_in), ``w`` (d_in, d_out); saves ``(x,)``.
    Under an FP8 recipe (:func:`minipar.nn.fp8.gemms`) each GEMM takes FP8 inputs."""
    return fp8.forward(x, w), (x,)


def linear_backward(w: Any, saved: tuple, dy: Any) -> tuple[Any, Any]:
    """Return ``(dx, dw)``: dx = dy wᵀ, dw = xᵀ dy (``w`` is the forward's weight)."""
    (x,) = saved
    dx = fp8.dgrad(dy, w)
    dw = weight_grad(linear_weight_grad, x, dy)  # inside a B (zero bubble): deferred to W
    return dx, dw


def linear_weight_grad(x: Any, dy: Any) -> Any:
    """W of a linear layer: dw = xᵀ dy over every row (x (..., d_in), dy (..., d_out)).
    :func:`linear_backward` calls it at once, or — inside
    :func:`minipar.nn.weight_grad.deferred`, a zero-bubble B — hands it to W."""
    return fp8.wgrad(x, dy)


def bias_forward(y: Any, b: Any) -> Any:
    """y + b, added in place into ``y`` (a fresh matmul output) and returned; nothing saved."""
    y += b
    return y


def bias_backward(dy: Any) -> Any:
    """db = Σ dy over all axes but the last, summed in the compute dtype, in ``dy``'s dtype."""
    return down(up(dy).reshape(-1, dy.shape[-1]).sum(axis=0), dy.dtype)


# ------------------------------------------------------------------ embedding
def embedding_forward(table: Any, ids: Any) -> tuple[Any, tuple]:
    """Rows of ``table`` (V, d) picked by integer ``ids`` of any shape -> (*ids.shape, d)."""
    return table[ids], (ids, table.shape, table.dtype)


def embedding_backward(saved: tuple, dy: Any) -> Any:
    """Gradient of the table: dy scattered (summed) into the rows that were read.

    On a GPU (CuPy) the scatter-add adds with atomics, in an order that varies from run
    to run, so the last bits of the gradient of a row read more than once do too (as
    PyTorch's embedding backward without deterministic algorithms)."""
    ids, shape, dtype = saved
    dtable = xp.zeros(shape, dtype=compute_dtype(dy.dtype))
    xp.add.at(dtable, ids.reshape(-1), up(dy).reshape(-1, shape[1]))
    return down(dtable, dtype)


# ------------------------------------------------------------------ layernorm
def layernorm_forward(x: Any, gamma: Any, beta: Any) -> tuple[Any, tuple]:
    """LayerNorm over the last axis (eps = 1e-5)."""
    dt = x.dtype
    xc = up(x)
    mu = xc.mean(axis=-1, keepdims=True)
    xhat = xc - mu  # x − μ; scaled to x̂ in place below
    y = xhat * xhat  # (x − μ)², its buffer reused for y
    var = y.mean(axis=-1, keepdims=True)
    rstd = 1.0 / xp.sqrt(var + LN_EPS)
    xhat *= rstd
    xp.multiply(xhat, up(gamma), out=y)
    y += up(beta)
    return down(y, dt), (down(xhat, dt), rstd)


def layernorm_backward(gamma: Any, saved: tuple, dy: Any) -> tuple[Any, Any, Any]:
    """Return ``(dx, dgamma, dbeta)``; ``gamma`` is the forward's scale."""
    xhat16, rstd = saved
    dt = dy.dtype
    xhat, dyc = up(xhat16), up(dy)
    d = xhat.shape[-1]
    tmp = dyc * xhat  # one scratch buffer for the three products below
    dgamma = tmp.reshape(-1, d).sum(axis=0)
    dbeta = dyc.reshape(-1, d).sum(axis=0)
    dx = dyc * up(gamma)  # dx̂; turned into dx in place
    xp.multiply(dx, xhat, out=tmp)
    mean_dxhat_xhat = tmp.mean(axis=-1, keepdims=True)
    dx -= dx.mean(axis=-1, keepdims=True)
    xp.multiply(xhat, mean_dxhat_xhat, out=tmp)
    dx -= tmp
    dx *= rstd  # (1/σ̂)(dx̂ − mean(dx̂) − x̂ · mean(dx̂ x̂))
    return down(dx, dt), down(dgamma, gamma.dtype), down(dbeta, gamma.dtype)


# ----------------------------------------------------------------------- gelu
def gelu_forward(x: Any) -> tuple[Any, tuple]:
    """GELU, tanh approximation; saves ``x`` and ``tanh(u)`` for the backward."""
    dt = x.dtype
    xc = up(x)
    t = xc * xc
    t *= _GELU_A
    t += 1.0
    t *= xc
    t *= _GELU_C
    xp.tanh(t, out=t)  # t = tanh(u)
    y = t + 1.0
    y *= xc
    y *= 0.5
    return down(y, dt), (x, down(t, dt))


def gelu_backward(saved: tuple, dy: Any) -> Any:
    """dy · [½(1 + t) + ½ x (1 − t²) sqrt(2/π) (1 + 3·0.044715 x²)]."""
    x16, t16 = saved
    x, t = up(x16), up(t16)
    du = x * x
    du *= 3.0 * _GELU_A
    du += 1.0
    du *= _GELU_C  # du/dx
    g = t * t
    xp.subtract(1.0, g, out=g)  # sech²u = 1 − t²
    g *= x
    g *= du
    g += 1.0
    g += t
    g *= 0.5
    g *= up(dy)
    return down(g, dy.dtype)
