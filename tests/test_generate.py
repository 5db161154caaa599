"""Incremental decoding (minipar.nn.decoding): the KV cache equals a full forward of the
window at every position (dense, MoE, past block_size), greedy = argmax of recomputation,
top-k stays in the top k, seeds are deterministic, and bad arguments are one line."""

from __future__ import annotations

import numpy as np
import pytest

from minipar.nn import (
    GPT,
    GPTConfig,
    decode_step,
    dropless,
    generate,
    next_token_probs,
    prefill,
    sample_token,
)

SMALL = {"vocab_size": 11, "block_size": 8, "n_layer": 2, "n_head": 2, "d_model": 16, "d_ff": 24}
CONFIGS = {
    "dense": GPTConfig(**SMALL),
    "moe-top1": GPTConfig(**SMALL, n_experts=3, top_k=1, moe_every=2, capacity_factor=1.0),
    "moe-top2": GPTConfig(**SMALL, n_experts=3, top_k=2, capacity_factor=1.0),
    "multi-query": GPTConfig(**SMALL, n_kv_head=1),  # GQA, K = 1: a cache of one head
}


def noisy_params(model: GPT, seed: int = 0, scale: float = 0.3) -> dict[str, np.ndarray]:
    """Initial weights plus noise: sharp attention, non-trivial LayerNorms and biases,
    routers far from uniform."""
    r = np.random.default_rng(seed + 100)
    return {k: v + scale * r.standard_normal(v.shape) for k, v in model.init(seed).items()}


def rel(a: np.ndarray, b: np.ndarray) -> float:
    """max |a − b| / max |b|."""
    return float(np.abs(a - b).max() / np.abs(b).max())


def full_logits(cfg: GPTConfig, params, seq: np.ndarray) -> np.ndarray:
    """Logits (B, V) at the last position of a plain forward over the window (the last
    block_size tokens of ``seq``), the decoding MoE (dropless) included."""
    return GPT(dropless(cfg)).forward(params, seq[:, -cfg.block_size:])[0][:, -1]


@pytest.mark.parametrize("name", CONFIGS)
def test_incremental_logits_equal_a_full_forward_at_every_position(name: str) -> None:
    cfg = CONFIGS[name]
    model = GPT(cfg)
    params = noisy_params(model)
    seq = np.random.default_rng(1).integers(0, cfg.vocab_size, (2, 21))
    logits, cache = prefill(model, params, seq[:, :3])
    ref = GPT(dropless(cfg)).forward(params, seq[:, :3])[0]
    assert logits.shape == (2, 3, cfg.vocab_size)
    assert np.array_equal(logits, ref)  # a prefill is the serial forward, bit for bit
    worst = 0.0
    for t in range(3, seq.shape[1]):  # past block_size = 8 from t = 8 on
        out = decode_step(model, params, cache, seq[:, t])
        assert out.shape == (2, cfg.vocab_size)
        worst = max(worst, rel(out, full_logits(cfg, params, seq[:, :t + 1])))
        assert cache.length == min(t + 1, cfg.block_size)
        assert np.array_equal(cache.tokens[:, :cache.length], seq[:, t + 1 - cache.length:t + 1])
    assert worst <= 1e-12, worst
    assert cache.rebuilds == seq.shape[1] - cfg.block_size  # one per step past the window


def test_with_capacity_limits_a_forward_over_the_prefix_is_not_causal() -> None:
    """Why decoding routes dropless: at the training capacity the logits at position t
    change when later tokens join the group (tokens are dropped by capacity), so no
    cache could reproduce them; with capacity_factor = E/k no token is dropped and the
    forward is causal again."""
    cfg = CONFIGS["moe-top2"]
    params = noisy_params(GPT(cfg))
    seq = np.random.default_rng(1).integers(0, cfg.vocab_size, (1, cfg.block_size))
    gaps = {}
    for c in (cfg, dropless(cfg)):
        model = GPT(c)
        whole, saved = model.forward(params, seq)
        dropped = sum(s["dropped"] for s in model.moe_stats(saved))
        gap = max(rel(model.forward(params, seq[:, :t + 1])[0][:, t], whole[:, t])
                  for t in range(cfg.block_size))
        gaps[c.capacity_factor] = (dropped, gap)
    (d_train, g_train), (d_free, g_free) = gaps[1.0], gaps[cfg.n_experts / cfg.top_k]
    assert d_train > 0 and g_train > 1e-3, gaps
    assert d_free == 0 and g_free <= 1e-12, gaps


@pytest.mark.parametrize("name", ["dense", "moe-top2"])
@pytest.mark.parametrize("kv_cache", [True, False])
def test_greedy_generation_is_the_argmax_of_full_recomputation(name: str, kv_cache: bool) -> None:
    cfg = CONFIGS[name]
    model = GPT(cfg)
    params = noisy_params(model, seed=2)
    got = generate(model, params, [3, 1], 14, temperature=0, kv_cache=kv_cache)
    ids = [3, 1]
    for _ in range(14):  # past block_size: the window is cropped to the last 8 ids
        ids.append(int(np.argmax(full_logits(cfg, params, np.array([ids]))[0])))
    assert got == ids
    assert generate(model, params, [3, 1], 14, temperature=0, seed=9) == ids  # no draw


@pytest.mark.parametrize("name", ["dense", "moe-top1"])
def test_sampling_is_the_same_with_and_without_the_cache_and_seeded(name: str) -> None:
    cfg = CONFIGS[name]
    model = GPT(cfg)
    params = noisy_params(model, seed=3)
    a = generate(model, params, [5], 20, temperature=1.3, seed=4)
    assert len(a) == 21 and a[0] == 5
    assert a == generate(model, params, [5], 20, temperature=1.3, seed=4, kv_cache=False)
    assert a == generate(model, params, [5], 20, temperature=1.3, seed=4)  # same seed
    assert a != generate(model, params, [5], 20, temperature=1.3, seed=5)
    assert generate(model, params, [5], 0) == [5]


def test_top_k_never_picks_outside_the_top_k() -> None:
    cfg = CONFIGS["dense"]
    model = GPT(cfg)
    params = noisy_params(model, seed=4)
    ids = generate(model, params, [2, 7], 14, temperature=3.0, top_k=3, seed=0)
    for t in range(2, len(ids)):  # each new id among the 3 largest logits of its step
        z = full_logits(cfg, params, np.array([ids[:t]]))[0]
        assert ids[t] in np.argsort(-z)[:3], (t, ids[t], z)
    assert generate(model, params, [2, 7], 14, top_k=1, seed=0) == \
        generate(model, params, [2, 7], 14, temperature=0)  # top-1 is greedy


def test_next_token_probs_temperature_top_k_and_ties() -> None:
    z = np.array([0.5, 2.0, -1.0, 1.0, 2.0, 0.0])
    p = next_token_probs(z, 0.5, 3)
    top = [1, 4, 3]  # 2.0, 2.0 (tie: both in), 1.0
    e = np.exp((z[top] - 2.0) / 0.5)
    np.testing.assert_allclose(p[top], e / e.sum(), rtol=1e-15)
    assert np.count_nonzero(p) == 3 and p.sum() == pytest.approx(1.0, abs=1e-15)
    assert np.flatnonzero(next_token_probs(z, 1.0, 1)).tolist() == [1]  # tie -> lower id
    full = next_token_probs(z, 2.0)
    np.testing.assert_allclose(full, np.exp(z / 2) / np.exp(z / 2).sum(), rtol=1e-14)
    assert np.isfinite(next_token_probs(z, 1e-300)).all()  # a tiny τ: no overflow


def test_draws_follow_the_distribution_and_stay_in_the_top_k() -> None:
    z = np.random.default_rng(0).normal(size=11) * 2
    p = next_token_probs(z, 1.0, 4)
    rng = np.random.default_rng(7)
    n = 4000
    draws = np.array([sample_token(z, 1.0, 4, rng) for _ in range(n)])
    assert set(draws.tolist()) == set(np.flatnonzero(p).tolist())
    freq = np.bincount(draws, minlength=11) / n
    assert np.all(np.abs(freq - p) <= 5 * np.sqrt(p * (1 - p) / n) + 1e-12), (freq, p)


def test_float32_decodes_in_float32() -> None:
    cfg = GPTConfig(**SMALL, dtype="float32")
    model = GPT(cfg)
    params = {k: v.astype(np.float32) for k, v in noisy_params(model).items()}
    seq = np.random.default_rng(1).integers(0, cfg.vocab_size, (1, 10))
    logits, cache = prefill(model, params, seq[:, :4])
    assert logits.dtype == np.float32 and cache.keys[0].dtype == np.float32
    assert cache.nbytes() == 2 * cfg.n_layer * cfg.block_size * cfg.d_model * 4
    for t in range(4, 10):
        out = decode_step(model, params, cache, seq[:, t])
        assert out.dtype == np.float32
        assert rel(out, full_logits(cfg, params, seq[:, :t + 1])) <= 1e-5


V = SMALL["vocab_size"]


@pytest.mark.parametrize("kwargs, fragment", [
    ({"n_tokens": -1}, "n_tokens must be an integer >= 0, got -1"),
    ({"n_tokens": 2.5}, "n_tokens"),
    ({"temperature": -0.5}, "temperature must be >= 0, got -0.5"),
    ({"temperature": float("nan")}, "temperature"),
    ({"top_k": 0}, f"top_k must be an integer from 1 to {V}, got 0"),
    ({"top_k": V + 1}, f"top_k must be an integer from 1 to {V}, got {V + 1}"),
    ({"seed": -1}, "seed"),
    ({"prompt_ids": []}, "prompt_ids must be a non-empty"),
    ({"prompt_ids": [[1, 2]]}, "prompt_ids must be a non-empty"),
    ({"prompt_ids": [1, V]}, f"prompt_ids ids must lie in [0, vocab_size={V})"),
    ({"prompt_ids": [-1]}, "prompt_ids ids must lie in"),
    ({"prompt_ids": [1.5]}, "prompt_ids must be integer ids"),
])
def test_bad_arguments_are_one_line_before_any_work(kwargs, fragment) -> None:
    args = {"prompt_ids": [1, 2], "n_tokens": 3, **kwargs}
    with pytest.raises(ValueError) as e:  # params={}: any work would be a KeyError
        generate(GPT(CONFIGS["dense"]), {}, **args)
    assert fragment in str(e.value) and "\n" not in str(e.value), str(e.value)


def test_prefill_and_decode_step_refuse_bad_input() -> None:
    cfg = CONFIGS["dense"]
    model = GPT(cfg)
    params = noisy_params(model)
    with pytest.raises(ValueError, match="exceed the position table"):
        prefill(model, params, np.zeros((1, cfg.block_size + 1), dtype=np.int64))
    with pytest.raises(ValueError, match="non-empty"):
        prefill(model, params, np.zeros((1, 0), dtype=np.int64))
    _, cache = prefill(model, params, np.zeros((2, 3), dtype=np.int64))
    with pytest.raises(ValueError, match="token has 1 rows, the cache 2"):
        decode_step(model, params, cache, np.array([1]))
    with pytest.raises(ValueError, match="token ids must lie"):
        decode_step(model, params, cache, np.array([1, V]))
    with pytest.raises(ValueError, match="another model configuration"):
        decode_step(GPT(CONFIGS["moe-top1"]), params, cache, np.array([1, 1]))
    assert cache.length == 3  # nothing was appended by the refused steps
