"""The FP8 GEMMs of a linear layer (minipar.nn.fp8) and the ``fp8`` precision policy."""

from __future__ import annotations

import numpy as np
import pytest

from minipar.nn import GPT, GPTConfig, fp8
from minipar.nn.layers import linear_backward, linear_forward, linear_weight_grad
from minipar.nn.weight_grad import deferred, resolve
from minipar.precision import ModelStates, get
from minipar.quantize import dequantize, quantize

RNG = np.random.default_rng(0)
X = RNG.standard_normal((3, 20, 40)).astype(np.float32)  # (B, T, d_in): tails at b = 16
W = (RNG.standard_normal((40, 24)) * 0.1).astype(np.float32)
DY = RNG.standard_normal((3, 20, 24)).astype(np.float32)
B = 16


def deq(a, fmt, block):
    q, s = quantize(a.astype(np.float64), fmt, block)
    return dequantize(q, s, fmt, block, a.shape)


def test_block_gemms_are_the_dequantized_products_promoted_per_chunk():
    """Each GEMM equals the product of its dequantized FP8 inputs (tiles and blocks as
    DeepSeek-V3 cuts them) up to FP32 accumulation."""
    r = fp8.Recipe("block", B)
    x2, dy2 = X.reshape(-1, 40), DY.reshape(-1, 24)
    with fp8.gemms(r):
        y, saved = linear_forward(X, W)
        dx, dw = linear_backward(W, saved, DY)
    want_y = deq(x2, "e4m3", (1, B)) @ deq(W, "e4m3", (B, B))
    want_dx = deq(dy2, "e4m3", (1, B)) @ deq(W, "e4m3", (B, B)).T
    # dW: x and dy in B×1 tiles along each sequence's tokens
    xt = deq(X, "e4m3", (1, B, 1)).reshape(-1, 40)
    dyt = deq(DY, "e4m3", (1, B, 1)).reshape(-1, 24)
    want_dw = xt.T @ dyt
    for got, want in ((y.reshape(-1, 24), want_y), (dx.reshape(-1, 40), want_dx),
                      (dw, want_dw)):
        assert got.dtype == np.float32
        # float32 accumulation (the recipe's FP32) against the float64 product of the same
        # dequantized values: u = 6e-8 over sums of <= 40 terms with cancellation; a wrong
        # scale or tile moves results by >= 2^-4 (E4M3's step), far above this.  The
        # promotion loop is checked exactly in test_promotion_adds_each_chunks_scaled_sum_in_fp32.
        np.testing.assert_allclose(got, want, rtol=2e-5, atol=2e-6)
    assert not np.allclose(y.reshape(-1, 24), x2 @ W, rtol=1e-4)  # it did quantize


def test_tensor_recipe_e4m3_forward_e5m2_gradients():
    r = fp8.Recipe("tensor", B)
    with fp8.gemms(r):
        y, saved = linear_forward(X, W)
        dx, dw = linear_backward(W, saved, DY)
    x2, dy2 = X.reshape(-1, 40), DY.reshape(-1, 24)
    # rtol 2e-5: float32 accumulation against float64, as in the block recipe's test above
    np.testing.assert_allclose(y.reshape(-1, 24), deq(x2, "e4m3", x2.shape)
                               @ deq(W, "e4m3", W.shape), rtol=2e-5, atol=2e-6)
    np.testing.assert_allclose(dx.reshape(-1, 40), deq(dy2, "e5m2", dy2.shape)
                               @ deq(W, "e4m3", W.shape).T, rtol=2e-5, atol=2e-6)
    np.testing.assert_allclose(dw, deq(X, "e4m3", X.shape).reshape(-1, 40).T
                               @ deq(DY, "e5m2", DY.shape).reshape(-1, 24), rtol=2e-5, atol=2e-6)


def test_promotion_adds_each_chunks_scaled_sum_in_fp32():
    qa = RNG.integers(-8, 8, (4, 37)).astype(np.float32)
    qb = RNG.integers(-8, 8, (37, 5)).astype(np.float32)
    sa = RNG.uniform(0.5, 2, (4, 3)).astype(np.float32)
    sb = RNG.uniform(0.5, 2, (3, 5)).astype(np.float32)
    bounds = [(0, 16), (16, 32), (32, 37)]
    want = np.zeros((4, 5), np.float32)
    for c, (lo, hi) in enumerate(bounds):
        want += (qa[:, lo:hi] @ qb[lo:hi]) * sa[:, c:c + 1] * sb[c:c + 1]
    per = [16, 16, 5]  # the scales as the GEMMs hand them: one per element
    got = fp8.promoted(qa, np.repeat(sa, per, axis=1), qb, np.repeat(sb, per, axis=0), bounds)
    assert np.array_equal(got, want)


def test_fp8_error_is_small_and_block_scaling_beats_per_tensor_on_outliers():
    x = RNG.standard_normal((64, 256)).astype(np.float32)
    x[::16, 3] = 1e5  # a few outliers set a per-tensor scale: the rest fall to subnormals
    w = (RNG.standard_normal((256, 64)) * 0.05).astype(np.float32)
    exact = x.astype(np.float64) @ w
    err = {}
    for s in ("block", "tensor"):
        with fp8.gemms(fp8.Recipe(s, 128)):
            y = linear_forward(x, w)[0]
        rows = np.ones(64, bool)
        rows[::16] = False  # the rows without the outlier
        err[s] = np.abs(y - exact)[rows].max() / np.abs(exact[rows]).max()
    assert err["block"] < 0.05 and err["block"] < err["tensor"] / 2  # measured 0.033, 0.11


def test_a_deferred_weight_gradient_keeps_its_recipe():
    r = fp8.Recipe("block", B)
    with fp8.gemms(r):
        now = linear_weight_grad(X, DY)
        _, saved = linear_forward(X, W)
        with deferred():
            _, pending = linear_backward(W, saved, DY)
    assert np.array_equal(resolve({"w": pending})["w"], now)  # W runs after the context


def test_no_recipe_is_the_plain_gemm():
    y, saved = linear_forward(X, W)
    assert np.array_equal(y, X @ W)
    assert np.array_equal(linear_weight_grad(X, DY), X.reshape(-1, 40).T @ DY.reshape(-1, 24))


def test_policy_keeps_fp32_master_and_moments_and_the_model_learns():
    pol = get("fp8")
    assert pol.fp8 and pol.param == "float32" and pol.master is None and pol.state == "float32"
    cfg = GPTConfig(vocab_size=8, block_size=8, d_model=16, n_head=2, dtype="float32",
                    fp8="block", fp8_block=8)
    model = GPT(cfg)
    params = GPT(GPTConfig(vocab_size=8, block_size=8, d_model=16, n_head=2)).init(0)
    states = ModelStates(pol, params, "adamw", lr=1e-2)
    by = states.bytes_by_category()
    n = states.layout.size
    assert by == {"params": 4 * n, "grads": 4 * n, "optimizer states": 8 * n}  # 16 B/param
    rng = np.random.default_rng(1)
    tokens = rng.integers(0, 8, (4, 8))
    targets = np.roll(tokens, -1, axis=1)
    losses = []
    for _ in range(15):
        loss, grads = model.loss_and_grads(states.param_views(), tokens, targets)
        states.set_grads(grads)
        states.step()
        losses.append(loss)
    assert losses[-1] < losses[0] - 0.3
    assert states.params.dtype == np.float32
    _, cache = model.forward(states.param_views(), tokens)
    # the blocks ran under the recipe; the head and embedding hold no FP8 state
    assert [b["fp8"] for b in cache["blocks"]] == [cfg.fp8_recipe()] * cfg.n_layer


def test_bytes_of_a_gemm_input_and_what_a_block_saves():
    """A GEMM's FP8 input: 1 byte per element and an FP32 scale per tile or block; the
    activations a block saves for its backward are FP32, as under the float32 policy."""
    m, k, b = 40, 300, 128
    x = RNG.standard_normal((m, k)).astype(np.float32)
    q, s = quantize(x, "e4m3", (1, b))
    assert q.nbytes + s.nbytes == m * k + 4 * m * -(-k // b)
    q, s = quantize(x, "e4m3", (b, b))
    assert q.nbytes + s.nbytes == m * k + 4 * 1 * 3
    from minipar import trees

    sizes = {}
    for f in ("", "block"):
        cfg = GPTConfig(vocab_size=8, block_size=8, d_model=16, n_head=2, dtype="float32",
                        fp8=f, fp8_block=8)
        params = {n: v.astype(np.float32) for n, v in GPT(cfg).init(0).items()}
        _, cache = GPT(cfg).forward(params, np.zeros((2, 8), dtype=np.int64))
        sizes[f] = sum(a.nbytes for a in trees.arrays(cache["blocks"]))
    assert sizes["block"] == sizes[""]


def test_bad_recipe():
    with pytest.raises(ValueError, match="fp8_block"):
        GPTConfig(fp8="block", fp8_block=0)
    with pytest.raises(ValueError, match="fp8"):
        GPTConfig(fp8="delayed")
