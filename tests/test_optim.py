"""SGD and AdamW against hand-computed steps; flat layout; slice steps == full step, bit for bit."""

from __future__ import annotations

import itertools

import numpy as np
import pytest

from minipar.nn import GPT, GPTConfig
from minipar.optim import SGD, AdamW, FlatParams, make


def test_flat_layout_roundtrip_and_views() -> None:
    p = GPT(GPTConfig(n_layer=1, d_model=8, n_head=2)).init(0)
    lay = FlatParams.like(p)
    flat = lay.flatten(p)
    assert flat.shape == (sum(v.size for v in p.values()),) and lay.size == flat.size
    back = lay.unflatten(flat)
    assert list(back) == list(p) and all(np.array_equal(back[k], p[k]) for k in p)
    back["lm_head"][0, 0] = 123.0  # views: writing a parameter writes the buffer
    lo, hi = lay.span("lm_head")
    assert flat[lo] == 123.0 and hi == lay.size
    with pytest.raises(ValueError, match="shape"):
        lay.unflatten(flat[:-1])
    with pytest.raises(ValueError, match="names"):
        lay.flatten(dict(reversed(list(p.items()))))


def test_sgd_momentum_by_hand() -> None:
    p = np.array([1.0, -2.0])
    opt = SGD(2, lr=0.1, momentum=0.9, weight_decay=0.5)
    g1, g2 = np.array([0.5, 1.0]), np.array([-1.0, 2.0])
    opt.step(p, g1)
    # g = g1 + 0.5 * [1, -2] = [1, 0]; b = [1, 0]; p = [0.9, -2]
    np.testing.assert_allclose(p, [0.9, -2.0], rtol=0, atol=1e-15)
    opt.step(p, g2)
    # g = [-1 + 0.45, 2 - 1] = [-0.55, 1]; b = 0.9*[1, 0] + g = [0.35, 1]; p = [0.865, -2.1]
    np.testing.assert_allclose(p, [0.865, -2.1], rtol=0, atol=1e-15)


def test_adamw_by_hand() -> None:
    p = np.array([1.0, -1.0])
    opt = AdamW(2, lr=0.1, betas=(0.9, 0.99), eps=1e-8, weight_decay=0.1)
    g = np.array([0.2, -0.4])
    opt.step(p, g)
    # step 1: m̂ = g, v̂ = g², update = g/(|g| + eps) = sign(g) (to 1e-7)
    want = np.array([1.0, -1.0]) * (1 - 0.01) - 0.1 * g / (np.abs(g) + 1e-8)
    np.testing.assert_allclose(p, want, rtol=0, atol=1e-15)
    g2 = np.array([0.1, 0.3])
    m = 0.9 * (0.1 * g) + 0.1 * g2
    v = 0.99 * (0.01 * g * g) + 0.01 * g2 * g2
    want = want * (1 - 0.01) - 0.1 * (m / (1 - 0.81)) / (np.sqrt(v / (1 - 0.99**2)) + 1e-8)
    opt.step(p, g2)
    np.testing.assert_allclose(p, want, rtol=1e-14, atol=0)
    assert opt.t == 2


@pytest.mark.parametrize("name", ["sgd", "adamw"])
def test_slice_steps_equal_full_step_bitwise(name: str) -> None:
    r = np.random.default_rng(0)
    n, cuts = 37, [0, 5, 6, 20, 37]
    p_full = r.standard_normal(n)
    p_sliced = p_full.copy()
    grads = [r.standard_normal(n) for _ in range(3)]
    full = make(name, n, lr=0.05, weight_decay=0.1)
    parts = [make(name, hi - lo, lr=0.05, weight_decay=0.1) for lo, hi in itertools.pairwise(cuts)]
    for g in grads:
        full.step(p_full, g)
        for opt, lo, hi in zip(parts, cuts, cuts[1:]):
            opt.step(p_sliced[lo:hi], g[lo:hi])  # a view: updated in place
    np.testing.assert_array_equal(p_full, p_sliced)
    for key in full.state_dict():
        if key != "t":
            np.testing.assert_array_equal(
                full.state_dict()[key], np.concatenate([o.state_dict()[key] for o in parts]))


@pytest.mark.parametrize("name", ["sgd", "adamw"])
def test_state_dict_roundtrip_continues_identically(name: str) -> None:
    r = np.random.default_rng(1)
    p = r.standard_normal(10)
    a = make(name, 10, lr=0.01)
    for _ in range(3):
        a.step(p, r.standard_normal(10))
    state = a.state_dict()
    b = make(name, 10, lr=0.01)
    b.load_state_dict(state)
    assert b.t == 3
    g = r.standard_normal(10)
    pa, pb = p.copy(), p.copy()
    a.step(pa, g)
    b.step(pb, g)
    np.testing.assert_array_equal(pa, pb)


def test_float32_state_stays_float32() -> None:
    p = np.ones(4, np.float32)
    opt = AdamW(4, lr=1e-3, dtype="float32")
    opt.step(p, np.full(4, 0.5, np.float32))
    assert p.dtype == opt.m.dtype == opt.v.dtype == np.float32


def test_bad_arguments() -> None:
    with pytest.raises(ValueError, match="lr"):
        AdamW(3, lr=0.0)
    with pytest.raises(ValueError, match="momentum"):
        SGD(3, momentum=1.0)
    with pytest.raises(ValueError, match="owns 3"):
        AdamW(3).step(np.zeros(4), np.zeros(4))
    with pytest.raises(ValueError, match="optimizer must be one of sgd, adamw; got .lion."):
        make("lion", 3)


@pytest.mark.parametrize("dtype,grad_dtype", [(np.float64, np.float64), (np.float32, np.float32),
                                              (np.float32, np.float16)])
def test_fused_adamw_equals_the_formulas_bitwise(dtype, grad_dtype) -> None:
    """The blocked (fused) step and the formulas as written, one pass per operation: the
    same bits for sizes below, at, across and far beyond a block, with and without decay."""
    rng = np.random.default_rng(7)
    block = AdamW.BLOCK
    for n, wd in itertools.product((1, 1000, block, block + 7, 3 * block + 1), (0.0, 0.01)):
        p0 = rng.standard_normal(n).astype(dtype)
        fused, plain = (AdamW(n, weight_decay=wd, dtype=dtype) for _ in range(2))
        pf, pp = p0.copy(), p0.copy()
        for _ in range(3):
            g = rng.standard_normal(n).astype(grad_dtype)
            fused.step(pf, g)
            plain.step_unfused(pp, g)
        assert fused.t == plain.t == 3
        for a, b in ((pf, pp), (fused.m, plain.m), (fused.v, plain.v)):
            assert a.dtype == b.dtype and np.array_equal(a, b), (n, wd)
