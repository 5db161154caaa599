"""The serial GPT and MLP: finite-difference gradients, names and order, init, determinism, errors."""

from __future__ import annotations

import math

import ml_dtypes
import numpy as np
import pytest

from minipar.nn import (
    GPT,
    MLP,
    GPTConfig,
    MLPConfig,
    block_backward,
    block_forward,
    embed_backward,
    embed_forward,
    head_backward,
    head_forward,
    sub,
)
from minipar.nn.gradcheck import numerical_grad, rel_error
from minipar.nn.loss import cross_entropy_backward, cross_entropy_forward

TINY = {"vocab_size": 7, "block_size": 6, "n_layer": 2, "n_head": 2, "d_model": 8, "d_ff": 12}


def perturbed(model: GPT | MLP, seed: int = 0, scale: float = 0.1) -> dict[str, np.ndarray]:
    """Initial weights plus noise, so that gamma, beta and biases are not trivial."""
    p = model.init(seed)
    r = np.random.default_rng(seed + 100)
    return {k: v + scale * r.standard_normal(v.shape) for k, v in p.items()}


def tokens(cfg: GPTConfig, b: int = 2, t: int = 5, seed: int = 3) -> tuple[np.ndarray, np.ndarray]:
    r = np.random.default_rng(seed)
    return r.integers(0, cfg.vocab_size, (b, t)), r.integers(0, cfg.vocab_size, (b, t))


def gradcheck_model(model, params, x, y) -> dict[str, float]:
    loss, grads = model.loss_and_grads(params, x, y)
    assert abs(loss - model.loss(params, x, y)) == 0.0
    errs = {}
    for name, p in params.items():
        num = numerical_grad(lambda: model.loss(params, x, y), p)
        errs[name] = rel_error(grads[name], num)
    worst = max(errs, key=errs.get)
    assert errs[worst] < 1e-6, (worst, errs[worst])
    return errs


def test_gpt_gradients_match_finite_differences() -> None:
    model = GPT(GPTConfig(**TINY))
    x, y = tokens(model.cfg)
    gradcheck_model(model, perturbed(model), x, y)


@pytest.mark.parametrize("kv", [1, 2])
def test_grouped_query_attention_gradients_match_finite_differences(kv: int) -> None:
    """GQA (K = 2 of H = 4) and multi-query (K = 1): w_qkv (d, (H + 2K)·d/H)."""
    model = GPT(GPTConfig(**{**TINY, "n_head": 4}, n_kv_head=kv))
    assert model.init(0)["blocks.0.attn.w_qkv"].shape == (8, (4 + 2 * kv) * 2)
    x, y = tokens(model.cfg)
    gradcheck_model(model, perturbed(model), x, y)


def test_grouped_query_attention_is_multi_head_with_shared_key_value_heads() -> None:
    """Query head h reads key/value head h // (H/K): copying each shared head's columns
    into a multi-head model (K = H) gives the same loss; K = H is today's model."""
    h, kv, dh = 4, 2, 2
    gqa = GPT(GPTConfig(**{**TINY, "n_head": h}, n_kv_head=kv))
    mha = GPT(GPTConfig(**{**TINY, "n_head": h}))
    assert GPTConfig(**TINY) == GPTConfig(**TINY, n_kv_head=TINY["n_head"])
    p = perturbed(gqa)
    q = dict(p)
    for n in p:
        if n.endswith("qkv"):
            cols = p[n][..., h * dh:].reshape(*p[n].shape[:-1], 2, kv, dh)
            wide = np.repeat(cols, h // kv, axis=-2).reshape(*p[n].shape[:-1], 2 * h * dh)
            q[n] = np.concatenate([p[n][..., :h * dh], wide], axis=-1)
    x, y = tokens(gqa.cfg)
    assert abs(gqa.loss(p, x, y) - mha.loss(q, x, y)) < 1e-12


def routing_margin(model: GPT, params, x) -> float:
    """Smallest gap between the k-th and (k+1)-th router logit (log-probability) over all tokens.

    A finite-difference step of 1e-6 moves a logit by far less than 1e-3, so
    with a larger margin no routing decision flips inside the check."""
    _, cache = model.forward(params, x)
    gaps = []
    for s in cache["blocks"]:
        if isinstance(s["ffn"], dict):
            p = np.sort(np.log(s["ffn"]["probs"]), axis=1)[:, ::-1]
            k = model.cfg.top_k
            gaps.append((p[:, k - 1] - p[:, k]).min())
    return float(min(gaps))


@pytest.mark.parametrize("top_k,moe_every", [(1, 2), (2, 1)])
def test_gpt_with_experts_gradients_match_finite_differences(top_k: int, moe_every: int) -> None:
    cfg = GPTConfig(**TINY, n_experts=3, top_k=top_k, moe_every=moe_every,
                    capacity_factor=1.0, aux_loss_coef=0.05)
    model = GPT(cfg)
    params = perturbed(model, seed=1)
    for k in params:  # a router with opinions: well-separated probabilities
        if k.endswith("moe.router"):
            params[k] *= 30.0
    x, y = tokens(cfg, b=2, t=6, seed=4)
    assert routing_margin(model, params, x) > 1e-3  # no token near a routing tie
    _, cache = model.forward(params, x)
    stats = model.moe_stats(cache)
    assert len(stats) == (2 if moe_every == 1 else 1)
    assert sum(s["dropped"] for s in stats) > 0  # the check covers dropped tokens too
    gradcheck_model(model, params, x, y)


def test_parameter_names_order_and_shapes() -> None:
    cfg = GPTConfig(vocab_size=11, block_size=9, n_layer=2, n_head=2, d_model=4, d_ff=6,
                    n_experts=2, moe_every=2)
    p = GPT(cfg).init(0)
    blk = lambda i, ffn: [f"blocks.{i}.{n}" for n in (
        "ln1.gamma", "ln1.beta", "attn.w_qkv", "attn.b_qkv", "attn.w_out", "attn.b_out",
        "ln2.gamma", "ln2.beta", *ffn)]
    mlp = ["mlp.w_in", "mlp.b_in", "mlp.w_out", "mlp.b_out"]
    moe = ["moe.router"] + [f"moe.experts.{e}.{n}" for e in range(2)
                            for n in ("w_in", "b_in", "w_out", "b_out")]
    expected = ["tok_emb", "pos_emb", *blk(0, mlp), *blk(1, moe), "ln_f.gamma", "ln_f.beta", "lm_head"]
    assert list(p) == expected
    assert p["tok_emb"].shape == (11, 4) and p["pos_emb"].shape == (9, 4)
    assert p["blocks.0.attn.w_qkv"].shape == (4, 12) and p["lm_head"].shape == (4, 11)
    assert p["blocks.1.moe.router"].shape == (4, 2)
    assert p["blocks.1.moe.experts.1.w_out"].shape == (6, 4)
    assert GPT(cfg).n_params() == sum(v.size for v in p.values())


def test_init_scales_and_partition_independence() -> None:
    cfg = GPTConfig(vocab_size=50, block_size=16, n_layer=4, n_head=4, d_model=64)
    p = GPT(cfg).init(7)
    assert np.all(p["blocks.0.ln1.gamma"] == 1) and np.all(p["blocks.0.ln1.beta"] == 0)
    assert np.all(p["blocks.3.mlp.b_in"] == 0) and np.all(p["blocks.2.attn.b_qkv"] == 0)
    assert abs(p["blocks.0.mlp.w_in"].std() - 0.02) < 0.001
    assert abs(p["blocks.0.mlp.w_out"].std() - 0.02 / math.sqrt(8)) < 0.0005
    assert abs(p["blocks.1.attn.w_out"].std() - 0.02 / math.sqrt(8)) < 0.0005
    # a parameter's values depend on (seed, name) only, not on the rest of the model
    other = GPT(GPTConfig(vocab_size=50, block_size=16, n_layer=2, n_head=2, d_model=64,
                          n_experts=2)).init(7)
    np.testing.assert_array_equal(p["tok_emb"], other["tok_emb"])
    np.testing.assert_array_equal(p["blocks.1.attn.w_qkv"], other["blocks.1.attn.w_qkv"])
    assert not np.array_equal(p["blocks.0.attn.w_qkv"], p["blocks.1.attn.w_qkv"])


def test_same_seed_same_bits() -> None:
    cfg = GPTConfig(**TINY, n_experts=2, top_k=2)
    a, b, c = GPT(cfg).init(5), GPT(cfg).init(5), GPT(cfg).init(6)
    assert all(np.array_equal(a[k], b[k]) for k in a)
    assert not np.array_equal(a["tok_emb"], c["tok_emb"])
    x, y = tokens(cfg)
    la, ga = GPT(cfg).loss_and_grads(a, x, y)
    lb, gb = GPT(cfg).loss_and_grads(b, x, y)
    assert la == lb and all(np.array_equal(ga[k], gb[k]) for k in ga)


def test_pieces_compose_to_the_model() -> None:
    """What pipeline / tensor parallel code runs: embed, blocks, head, loss by hand."""
    cfg = GPTConfig(**TINY, n_experts=2, moe_every=2)
    model = GPT(cfg)
    params = perturbed(model)
    x, y = tokens(cfg)
    loss, grads = model.loss_and_grads(params, x, y)
    h, s_emb = embed_forward(params, x, cfg)
    saved = []
    aux = 0.0
    for i in range(cfg.n_layer):
        h, s = block_forward(sub(params, f"blocks.{i}."), h, cfg)
        saved.append(s)
        aux += s["ffn"]["aux_loss"] if isinstance(s["ffn"], dict) else 0.0
    logits, s_head = head_forward(params, h)
    ce, s_ce = cross_entropy_forward(logits, y)
    assert ce + aux == loss
    dh, g = head_backward(params, s_head, cross_entropy_backward(s_ce))
    for i in reversed(range(cfg.n_layer)):
        dh, gb = block_backward(sub(params, f"blocks.{i}."), saved[i], dh)
        g.update({f"blocks.{i}.{k}": v for k, v in gb.items()})
    g.update(embed_backward(params, s_emb, dh))
    assert set(g) == set(grads) and all(np.array_equal(g[k], grads[k]) for k in g)


@pytest.mark.parametrize("dtype", ["float32", "bfloat16", "float16"])
def test_lower_precision_keeps_its_dtype(dtype: str) -> None:
    cfg64 = GPTConfig(**TINY, n_experts=2)
    cfg = GPTConfig(**TINY, n_experts=2, dtype=dtype)
    x, y = tokens(cfg)
    l64, _ = GPT(cfg64).loss_and_grads(GPT(cfg64).init(0), x, y)
    p = GPT(cfg).init(0)
    loss, grads = GPT(cfg).loss_and_grads(p, x, y)
    assert isinstance(loss, float)
    want = np.dtype(ml_dtypes.bfloat16) if dtype == "bfloat16" else np.dtype(dtype)
    assert all(v.dtype == want for v in p.values()) and all(g.dtype == want for g in grads.values())
    assert abs(loss - l64) < (1e-5 if dtype == "float32" else 2e-2)


@pytest.mark.parametrize("kwargs,match", [
    ({"d_model": 10, "n_head": 4}, "n_head 4 does not divide d_model 10"),
    ({"n_layer": 0}, "n_layer"),
    ({"n_experts": 2, "top_k": 3}, "top_k 3 exceeds n_experts 2"),
    ({"n_experts": 2, "top_k": 0}, "top_k"),
    ({"n_experts": 1, "top_k": 2}, "exceeds"),
    ({"n_experts": 2, "capacity_factor": 0.0}, "capacity_factor"),
    ({"n_experts": 2, "moe_every": 5}, "moe_every"),
    ({"n_experts": -1}, "n_experts"),
    ({"dtype": "int32"}, "dtype"),
    ({"dtype": "nonsense"}, "dtype"),
    ({"n_head": 2, "n_kv_head": 3}, "n_kv_head 3 does not divide n_head 2"),
])
def test_bad_config_raises(kwargs, match) -> None:
    with pytest.raises(ValueError, match=match):
        GPTConfig(**{**TINY, **kwargs})


def test_bad_inputs_raise() -> None:
    cfg = GPTConfig(**TINY)
    model = GPT(cfg)
    p = model.init(0)
    ok = np.zeros((2, 6), dtype=np.int64)
    with pytest.raises(ValueError, match="position table"):
        model.loss_and_grads(p, np.zeros((2, 7), np.int64), np.zeros((2, 7), np.int64))
    with pytest.raises(ValueError, match="vocab_size"):
        model.loss_and_grads(p, ok + 7, ok)
    with pytest.raises(ValueError, match="vocab_size"):
        model.loss_and_grads(p, ok, ok - 1)
    with pytest.raises(ValueError, match="integer"):
        model.loss_and_grads(p, ok.astype(float), ok)
    with pytest.raises(ValueError, match="must match"):
        model.loss_and_grads(p, ok, ok[:, :3])
    with pytest.raises(ValueError, match="2-D"):
        model.loss_and_grads(p, ok[0], ok[0])


def test_mlp_model_gradients_and_errors() -> None:
    model = MLP(MLPConfig(sizes=(3, 5, 4, 2)))
    params = perturbed(model)
    assert list(params) == ["layers.0.w", "layers.0.b", "layers.1.w", "layers.1.b",
                            "layers.2.w", "layers.2.b"]
    r = np.random.default_rng(0)
    x, y = r.standard_normal((6, 3)), r.integers(0, 2, 6)
    gradcheck_model(model, params, x, y)
    with pytest.raises(ValueError, match="shape"):
        model.loss_and_grads(params, x[:, :2], y)
    with pytest.raises(ValueError, match=r"\[0, 2\)"):
        model.loss_and_grads(params, x, y + 2)
    with pytest.raises(ValueError, match="sizes"):
        MLPConfig(sizes=(3,))
