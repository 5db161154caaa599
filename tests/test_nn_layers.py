"""Every layer's backward equals central finite differences in float64 (rel. error < 1e-6)."""

from __future__ import annotations

import numpy as np
import pytest

from minipar.nn import (
    attention_backward,
    attention_core_backward,
    attention_core_forward,
    attention_forward,
    bias_backward,
    bias_forward,
    cross_entropy_backward,
    cross_entropy_forward,
    embedding_backward,
    embedding_forward,
    gelu_backward,
    gelu_forward,
    layernorm_backward,
    layernorm_forward,
    linear_backward,
    linear_forward,
    mlp_backward,
    mlp_forward,
)
from minipar.nn.gradcheck import numerical_grad, rel_error

TOL = 1e-6


def rng(seed: int = 0) -> np.random.Generator:
    return np.random.default_rng(seed)


def check(forward, backward, inputs: dict[str, np.ndarray], seed: int = 1) -> dict[str, float]:
    """L = Σ y·R for a fixed random R; compare backward(R) with finite differences."""
    y, saved = forward()
    r = rng(seed).standard_normal(y.shape)
    analytic = backward(saved, r)

    def loss() -> float:
        return float((forward()[0] * r).sum())

    errors = {}
    for name, x in inputs.items():
        errors[name] = rel_error(analytic[name], numerical_grad(loss, x))
        assert errors[name] < TOL, (name, errors[name])
    return errors


def test_linear_and_bias() -> None:
    """Linear then bias, each with its own backward (the weight is passed, not saved)."""
    x, w, b = rng().standard_normal((2, 3, 4)), rng(2).standard_normal((4, 5)), rng(3).standard_normal(5)

    def fwd():
        y, s = linear_forward(x, w)
        return bias_forward(y, b), s

    def bwd(s, dy):
        dx, dw = linear_backward(w, s, dy)
        return {"x": dx, "w": dw, "b": bias_backward(dy)}

    check(fwd, bwd, {"x": x, "w": w, "b": b})
    y, s = linear_forward(x, w)
    np.testing.assert_array_equal(y, x @ w)
    assert len(s) == 1 and s[0] is x  # only the input is saved
    np.testing.assert_array_equal(bias_forward(y, b), x @ w + b)


def test_bias_backward_sums_over_leading_axes_in_fp32() -> None:
    import ml_dtypes

    dy = np.full((64, 3, 2), 1.0 / 3, dtype=ml_dtypes.bfloat16)
    db = bias_backward(dy)
    assert db.dtype == dy.dtype and db.shape == (2,)
    # summed in float32, rounded once: 192 x bf16(1/3), not a 16-bit running sum
    want = (dy.astype(np.float32).reshape(-1, 2).sum(0)).astype(ml_dtypes.bfloat16)
    np.testing.assert_array_equal(db, want)


def test_embedding_with_repeated_ids() -> None:
    table = rng().standard_normal((5, 3))
    ids = np.array([[0, 2, 2], [4, 0, 2]])
    y, _s = embedding_forward(table, ids)
    np.testing.assert_array_equal(y, table[ids])
    check(lambda: embedding_forward(table, ids), lambda s, dy: {"t": embedding_backward(s, dy)},
          {"t": table})


def test_layernorm() -> None:
    x = rng().standard_normal((2, 3, 6)) * 3 + 1
    g, b = rng(2).standard_normal(6), rng(3).standard_normal(6)

    def bwd(s, dy):
        dx, dg, db = layernorm_backward(g, s, dy)
        return {"x": dx, "g": dg, "b": db}

    check(lambda: layernorm_forward(x, g, b), bwd, {"x": x, "g": g, "b": b})
    y, _ = layernorm_forward(x, np.ones(6), np.zeros(6))
    np.testing.assert_allclose(y.mean(-1), 0, atol=1e-12)
    np.testing.assert_allclose(y.var(-1), 1 / (1 + 1e-5 / x.var(-1)), rtol=1e-10)


def test_gelu_matches_formula_and_gradient() -> None:
    x = np.linspace(-4, 4, 17).reshape(1, 17) + 0.01
    y, _ = gelu_forward(x)
    ref = 0.5 * x * (1 + np.tanh(np.sqrt(2 / np.pi) * (x + 0.044715 * x**3)))
    np.testing.assert_allclose(y, ref, rtol=1e-14, atol=1e-15)
    check(lambda: gelu_forward(x), lambda s, dy: {"x": gelu_backward(s, dy)}, {"x": x})


def test_cross_entropy_value_gradient_and_stability() -> None:
    z = rng().standard_normal((2, 3, 5))
    t = np.array([[0, 4, 2], [1, 1, 3]])
    loss, s = cross_entropy_forward(z, t)
    p = np.exp(z) / np.exp(z).sum(-1, keepdims=True)
    ref = -np.log(np.take_along_axis(p, t[..., None], -1)).mean()
    assert isinstance(loss, float) and abs(loss - ref) < 1e-14
    g = cross_entropy_backward(s)
    num = numerical_grad(lambda: cross_entropy_forward(z, t)[0], z)
    assert rel_error(g, num) < TOL
    big = np.array([[1000.0, -1000.0, 0.0]])
    loss_big, _ = cross_entropy_forward(big, np.array([1]))
    assert np.isfinite(loss_big) and abs(loss_big - 2000.0) < 1e-9


def test_cross_entropy_rejects_bad_targets() -> None:
    z = np.zeros((2, 3))
    with pytest.raises(ValueError, match=r"\[0, 3\)"):
        cross_entropy_forward(z, np.array([0, 3]))
    with pytest.raises(ValueError, match="integers"):
        cross_entropy_forward(z, np.array([0.0, 1.0]))
    with pytest.raises(ValueError, match="disagree"):
        cross_entropy_forward(z, np.array([0, 1, 2]))


def test_attention_core_is_causal_and_differentiable() -> None:
    q, k, v = (rng(i).standard_normal((2, 2, 5, 3)) for i in range(3))
    o, _ = attention_core_forward(q, k, v)
    # output at position t must not depend on keys/values after t
    v2 = v.copy()
    v2[:, :, 3:] += 10.0
    k2 = k.copy()
    k2[:, :, 3:] -= 5.0
    o2, _ = attention_core_forward(q, k2, v2)
    np.testing.assert_array_equal(o[:, :, :3], o2[:, :, :3])

    def bwd(s, dy):
        dq, dk, dv = attention_core_backward(s, dy)
        return {"q": dq, "k": dk, "v": dv}

    check(lambda: attention_core_forward(q, k, v), bwd, {"q": q, "k": k, "v": v})


def test_attention_matches_loop_reference_and_gradients() -> None:
    b, t, d, h = 2, 4, 6, 3
    x = rng().standard_normal((b, t, d))
    p = {"w_qkv": rng(1).standard_normal((d, 3 * d)) * 0.5, "b_qkv": rng(2).standard_normal(3 * d),
         "w_out": rng(3).standard_normal((d, d)) * 0.5, "b_out": rng(4).standard_normal(d)}
    y, _ = attention_forward(p, x, h)
    # a deliberately slow, loop-by-head reference
    qkv = x @ p["w_qkv"] + p["b_qkv"]
    q, k, v = qkv[..., :d], qkv[..., d:2 * d], qkv[..., 2 * d:]
    outs = []
    dh = d // h
    for i in range(h):
        sl = slice(i * dh, (i + 1) * dh)
        s = q[..., sl] @ k[..., sl].transpose(0, 2, 1) / np.sqrt(dh)
        s = np.where(np.tril(np.ones((t, t), bool)), s, -np.inf)
        a = np.exp(s - s.max(-1, keepdims=True))
        outs.append((a / a.sum(-1, keepdims=True)) @ v[..., sl])
    ref = np.concatenate(outs, -1) @ p["w_out"] + p["b_out"]
    np.testing.assert_allclose(y, ref, rtol=1e-12, atol=1e-12)

    def bwd(s, dy):
        dx, g = attention_backward(p, s, dy)
        return {"x": dx, **g}

    check(lambda: attention_forward(p, x, h), bwd, {"x": x, **p})


def test_mlp_block() -> None:
    x = rng().standard_normal((2, 3, 4))
    p = {"w_in": rng(1).standard_normal((4, 8)), "b_in": rng(2).standard_normal(8),
         "w_out": rng(3).standard_normal((8, 4)), "b_out": rng(4).standard_normal(4)}

    def bwd(s, dy):
        dx, g = mlp_backward(p, s, dy)
        return {"x": dx, **g}

    check(lambda: mlp_forward(p, x), bwd, {"x": x, **p})
