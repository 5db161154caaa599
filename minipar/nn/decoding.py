"""Incremental decoding with a key/value cache — инкрементальное декодирование с кэшем
ключей и значений — 基于键值缓存的增量解码.

EN key/value cache, prefill and decode, temperature and top-k sampling · RU кэш ключей
и значений, предзаполнение и декодирование, температура и top-k · ZH 键值缓存、预填充与
解码、温度与 top-k 采样

A GPT writes text one token at a time: the next id is drawn from the logits at the
last position, appended, and the model runs again (autoregressive decoding).  Run
naively, step t recomputes all t positions although only the newest is new.  In a
causal model the earlier positions cannot see the new token, so their keys and
values in every block are the same as at the step before: keep them (the *key/value
cache*) and run each step on the one new token (Shazeer 2019, "Fast Transformer
Decoding", arXiv 1911.02150; the *prefill* and *decode* phases of Pope et al. 2022,
"Efficiently Scaling Transformer Inference", arXiv 2211.05102):

    prefill(tokens[:T])   one forward over the prompt; block i keeps K_i, V_i (B, K, T, d_h)
    decode_step(x_t)      x = tok_emb[x_t] + pos_emb[t]        (the position is the cache's length)
                          per block: [q | k | v] = ln1(x) W_qkv + b_qkv;  K_i ← [K_i; k], V_i ← [V_i; v]
                                     o = softmax(q K_iᵀ / sqrt(d_h)) V_i   (every cached key is visible)
                                     the rest of the block (residuals, ln2, FFN) on the one row
                          logits = ln_f(x) @ lm_head

A step costs O(t·d) in attention and O(d²) elsewhere instead of a forward over t
positions.  The logits equal a full forward of the whole prefix at every position
(float64, to rounding: one row through a matrix product may round differently from
the same row inside a larger one; tests/test_generate.py checks 1e-12 relative).  The
block is the serial code (:func:`minipar.nn.gpt.block_forward`) given a cached
attention step, as tensor and expert parallelism give theirs; its core is the serial
causal one for a prefill and, for a step,
:func:`minipar.nn.blockwise_attention.attention_block_forward`, whose query offset
(the cache's length) places the causal mask.  Forward only: nothing is saved for a
backward.

**Past block_size.**  The position table has ``block_size`` rows, so, as nanoGPT
does, the model sees only the last ``block_size`` tokens (the window).  Once the
window is full, each new token slides it by one: every token moves one position
earlier and the oldest one leaves, which changes every cached key and value
(GPT-2's positions are learned absolute embeddings added at the input, so a key
carries its position through every block; and keys of block ≥ 1 attended to the
token that left).  No shift of the cache is exact, so :func:`decode_step` rebuilds
it: a prefill of the new window (``KVCache.rebuilds`` counts them).  Past
block_size a step therefore costs what nanoGPT pays at every step, and the logits
still equal a full forward of the window.  (Models with relative positions, RoPE,
can shift a cache; keeping a shorter window to rebuild less often would change what
the model sees, so it is not done.)

**Mixture of experts: no capacity at inference.**  A full forward routes its B·T
tokens as one group, each expert taking at most C = ceil(k·N/E · capacity_factor)
of them (``moe.py``).  That makes a forward over a prefix non-causal: whether token
t is dropped depends on N, and for top-2 on the first choices of *later* tokens, so
appending a token can change the logits at earlier positions (a test shows it), and
no cache can reproduce it.  Decoding therefore routes *dropless*: every token goes
to its top-k experts, y = Σ_j g_j · Expert_{e_j}(h), which is per token and causal.
That is the forward with capacity_factor = E/k (then C = N, room for every
assignment: :func:`dropless`), and the serial MoE code runs with it unchanged.
Inference without capacity limits is what Mixtral, DeepSeek-MoE and the dropless
MoE of MegaBlocks (Gale et al. 2022, arXiv 2211.15841) do; Switch Transformer
(Fedus et al. 2021, arXiv 2101.03961) raises the capacity factor for evaluation.
A dense model is unaffected.

**Sampling** (:func:`next_token_probs`, :func:`sample_token`).  From the logits z at
the last position: temperature τ > 0 scales them, p ∝ exp(z/τ) (τ < 1 sharper, τ > 1
flatter; Ackley, Hinton & Sejnowski 1985); top-k keeps the k largest logits and
renormalises (Fan, Lewis & Dauphin 2018, arXiv 1805.04833; ties at the k-th value go
to the lower id, so exactly k ids remain); τ = 0 is greedy decoding, argmax (lowest
id on a tie), and draws nothing.  A draw is the inverse CDF of one uniform number u
from ``numpy.random.Generator(seed)`` on the host: the first id whose cumulative
probability exceeds u, so a seed gives the same ids on every backend.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np  # host-side RNG only: the same draws under any backend

from minipar import checks
from minipar.backend import xp
from minipar.nn.attention import attention_core_forward, merge_heads, split_qkv
from minipar.nn.blockwise_attention import attention_block_forward
from minipar.nn.gpt import GPT, block_forward, embed_forward, head_forward, sub
from minipar.nn.gpt_config import GPTConfig
from minipar.nn.layers import bias_forward, linear_forward

__all__ = ["KVCache", "decode_step", "dropless", "generate", "next_token_probs", "prefill",
           "sample_token"]


def dropless(cfg: GPTConfig) -> GPTConfig:
    """``cfg`` with an MoE that drops no token: capacity_factor = E/k, so C = ceil(k·N/E ·
    E/k) = N, and an expert (chosen at most once per token) has room for every token.
    The decoding model; a dense ``cfg`` is returned as it is."""
    if not cfg.n_experts:
        return cfg
    return dataclasses.replace(cfg, capacity_factor=cfg.n_experts / cfg.top_k)


@dataclass
class KVCache:
    """The keys and values of the tokens in the window, per block, and the window itself.

    ``keys[i]`` / ``values[i]``: block i's (B, H, block_size, d_h) buffers in the model's
    storage dtype, positions ``[0, length)`` filled; ``tokens`` (B, block_size) the ids
    at those positions; ``rebuilds``: how many times the window slid and the cache was
    recomputed (past block_size, once per step).  Updated in place by
    :func:`decode_step`."""

    cfg: GPTConfig
    keys: list[Any]
    values: list[Any]
    tokens: Any
    length: int = 0
    rebuilds: int = 0

    @classmethod
    def empty(cls, cfg: GPTConfig, batch: int, dtype: Any) -> KVCache:
        """Room for ``block_size`` positions of ``batch`` sequences, nothing filled."""
        shape = (batch, cfg.n_kv_head, cfg.block_size, cfg.d_model // cfg.n_head)
        return cls(cfg, [xp.zeros(shape, dtype=dtype) for _ in range(cfg.n_layer)],
                   [xp.zeros(shape, dtype=dtype) for _ in range(cfg.n_layer)],
                   xp.zeros((batch, cfg.block_size), dtype=xp.int64))

    @property
    def batch(self) -> int:
        return int(self.tokens.shape[0])

    def nbytes(self) -> int:
        """Bytes held by the keys and values: 2 · L · B · block_size · K·d_h · itemsize
        (K·d_h = d without grouped-query attention; d·K/H with it)."""
        return sum(int(a.nbytes) for a in (*self.keys, *self.values))


def _no_backward(*_: Any) -> Any:
    raise RuntimeError("decoding is forward only: there is no backward through a KV cache")


def _cached_attention(cache: KVCache, i: int, n_head: int, n_kv_head: int) -> Any:
    """Block i's attention step over the cache: the new rows' k, v are written at
    positions [length, length + T) and their queries attend to every position up to
    their own (a prefill from position 0 is the serial causal core)."""
    t0 = cache.length

    def forward(q: dict[str, Any], a: Any) -> tuple[Any, None]:
        qkv, _ = linear_forward(a, q["w_qkv"])  # as attention_forward: one fused projection
        qkv = bias_forward(qkv, q["b_qkv"])
        qh, kh, vh = split_qkv(qkv, n_head, n_kv_head)
        t1 = t0 + a.shape[1]
        cache.keys[i][:, :, t0:t1] = kh
        cache.values[i][:, :, t0:t1] = vh
        if t0 == 0:  # a prefill: the serial causal core, as in training
            o, _ = attention_core_forward(qh, kh, vh)
        else:  # queries at t0 … t1-1 over every cached key before them
            o, _ = attention_block_forward(qh, cache.keys[i][:, :, :t1],
                                           cache.values[i][:, :, :t1], q_offset=t0)
        y, _ = linear_forward(merge_heads(o), q["w_out"])
        return bias_forward(y, q["b_out"]), None

    return forward, _no_backward


def _extend(cfg: GPTConfig, params: dict[str, Any], cache: KVCache, tokens: Any,
            last_only: bool) -> Any:
    """Run ``tokens`` (B, T) at positions [length, length + T) through the model, adding
    their keys and values to ``cache``; the logits (B, T, V), or (B, 1, V) if last_only."""
    t0, t1 = cache.length, cache.length + tokens.shape[1]
    x, _ = embed_forward(params, tokens, cfg, pos_offset=t0)
    run = dropless(cfg)
    for i in range(cfg.n_layer):
        x, _ = block_forward(sub(params, f"blocks.{i}."), x, run,
                             attn=_cached_attention(cache, i, cfg.n_head, cfg.n_kv_head))
    cache.tokens[:, t0:t1] = tokens
    cache.length = t1
    logits, _ = head_forward(params, x[:, -1:] if last_only else x)
    return logits


def _as_ids(name: str, ids: Any, ndim: int) -> Any:
    """``ids`` as an array; ValueError unless it is non-empty with ``ndim`` axes."""
    a = xp.asarray(ids)
    if a.ndim != ndim or a.size == 0:
        shape = "2-D (batch, time)" if ndim == 2 else "1-D"
        raise ValueError(f"{name} must be a non-empty {shape} array of token ids, "
                         f"got shape {a.shape}")
    return a


def prefill(model: GPT, params: dict[str, Any], tokens: Any) -> tuple[Any, KVCache]:
    """One forward over ``tokens`` (B, T), 1 <= T <= block_size: ``(logits (B, T, V),
    cache)``, the cache holding every block's keys and values for the T positions, in
    the activations' storage dtype (that of ``params["tok_emb"]``)."""
    cfg = model.cfg
    tokens = _as_ids("tokens", tokens, 2)
    cfg.check_tokens(tokens)
    cache = KVCache.empty(cfg, tokens.shape[0], params["tok_emb"].dtype)
    return _extend(cfg, params, cache, tokens, last_only=False), cache


def decode_step(model: GPT, params: dict[str, Any], cache: KVCache, token: Any) -> Any:
    """Append ``token`` (B,) to every sequence of ``cache`` and return the next-token
    logits (B, V): those of a full forward over the window (the last block_size tokens)
    at its last position.  The cache is updated in place; when it is full the window
    slides by one and the cache is rebuilt by a prefill (``cache.rebuilds`` + 1)."""
    cfg = model.cfg
    if cache.cfg != cfg:
        raise ValueError("the cache was built for another model configuration")
    token = _as_ids("token", token, 1)
    if token.shape[0] != cache.batch:
        raise ValueError(f"token has {token.shape[0]} rows, the cache {cache.batch} "
                         "(one id per sequence)")
    token = token[:, None]
    cfg.check_tokens(token, what="token")
    if cache.length == cfg.block_size:  # the window slides: every position changes
        window = xp.concatenate([cache.tokens[:, 1:], token], axis=1)
        cache.length, cache.rebuilds = 0, cache.rebuilds + 1
        return _extend(cfg, params, cache, window, last_only=True)[:, 0]
    return _extend(cfg, params, cache, token, last_only=True)[:, 0]


# ------------------------------------------------------------------------- sampling
def next_token_probs(logits: Any, temperature: float = 1.0, top_k: int | None = None) -> Any:
    """p (V,) in float64 from logits (V,): softmax(z/τ) over the top_k largest logits
    (ties at the k-th to the lower id), 0 elsewhere; τ = ``temperature`` > 0."""
    v = int(logits.shape[-1])
    tau = checks.real("temperature", temperature, greater_than=0.0)
    k = v if top_k is None else checks.integer("top_k", top_k, least=1, most=v)
    z = xp.asarray(logits).astype(xp.float64)
    keep = xp.argsort(-z, kind="stable")[:k]
    s = (z[keep] - z[keep].max()) / tau  # <= 0: no overflow for a small τ
    e = xp.exp(s)
    p = xp.zeros(v, dtype=xp.float64)
    p[keep] = e / e.sum()
    return p


def sample_token(logits: Any, temperature: float, top_k: int | None,
                 rng: np.random.Generator) -> int:
    """The next id from logits (V,): argmax if ``temperature`` is 0 (no draw), else the
    inverse CDF of ``next_token_probs`` at one uniform draw u of ``rng``."""
    if temperature == 0:
        return int(xp.argmax(logits))
    p = next_token_probs(logits, temperature, top_k)
    cdf = xp.cumsum(p)
    i = int(xp.searchsorted(cdf, rng.random() * cdf[-1], side="right"))
    return min(i, int(xp.flatnonzero(p)[-1]))  # u·total rounded up to total: the last id


def generate(model: GPT, params: dict[str, Any], prompt_ids: Any, n_tokens: int,
             temperature: float = 1.0, top_k: int | None = None, seed: int = 0,
             kv_cache: bool = True) -> list[int]:
    """The prompt followed by ``n_tokens`` new ids (a list of ints, len(prompt) + n_tokens).

    ``prompt_ids``: a non-empty 1-D sequence of ids in [0, vocab_size); only its last
    block_size ids are seen.  ``temperature`` >= 0 (0: greedy), ``top_k`` None or
    1 … vocab_size, ``seed`` of ``numpy.random.default_rng`` (one draw per sampled id).
    ``kv_cache=False`` recomputes the window at every step (nanoGPT's loop, the
    oracle and the baseline of the speed measurement); both give the logits of a
    full forward of the window.  Bad arguments: a one-line ValueError before any work."""
    new = stream(model, params, prompt_ids, n_tokens, temperature, top_k, seed, kv_cache)
    return [int(t) for t in _as_ids("prompt_ids", prompt_ids, 1).tolist()] + list(new)


def stream(model: GPT, params: dict[str, Any], prompt_ids: Any, n_tokens: int,
           temperature: float = 1.0, top_k: int | None = None, seed: int = 0,
           kv_cache: bool = True) -> Iterator[int]:
    """:func:`generate`'s new ids one at a time, as each is sampled (a caller can show
    them, count them, or stop early); the arguments are checked now, before any work."""
    cfg = model.cfg
    n_tokens = checks.integer("n_tokens", n_tokens, least=0)
    temperature = checks.real("temperature", temperature, at_least=0.0)
    if top_k is not None:
        checks.integer("top_k", top_k, least=1, most=cfg.vocab_size)
    seed = checks.integer("seed", seed, least=0)
    checks.one_of("kv_cache", kv_cache, (True, False))
    prompt = _as_ids("prompt_ids", prompt_ids, 1)
    cfg.check_tokens(prompt.reshape(-1, 1), what="prompt_ids")  # integer ids in range
    return _sampled(model, params, [int(t) for t in prompt.tolist()], n_tokens, temperature,
                    top_k, np.random.default_rng(seed), kv_cache)


def _sampled(model: GPT, params: dict[str, Any], ids: list[int], n_tokens: int,
             temperature: float, top_k: int | None, rng: Any, kv_cache: bool) -> Iterator[int]:
    cfg = model.cfg
    cache = None
    for _ in range(n_tokens):
        window = xp.asarray([ids[-cfg.block_size:]], dtype=xp.int64)
        if not kv_cache:  # nanoGPT: a forward over the whole window at every step
            last = _window_logits(cfg, params, window)
        elif cache is None:
            logits, cache = prefill(model, params, window)
            last = logits[0, -1]
        else:
            last = decode_step(model, params, cache, window[0, -1:])[0]
        ids.append(sample_token(last, temperature, top_k, rng))
        yield ids[-1]


def _window_logits(cfg: GPTConfig, params: dict[str, Any], window: Any) -> Any:
    """Next-token logits (V,) of a plain forward over ``window`` (1, T), no cache: the
    serial blocks (causal-mask attention) with the decoding MoE; the head on the last
    position only (nanoGPT's inference shortcut)."""
    x, _ = embed_forward(params, window, cfg)
    run = dropless(cfg)
    for i in range(cfg.n_layer):
        x, _ = block_forward(sub(params, f"blocks.{i}."), x, run)
    return head_forward(params, x[:, -1:])[0][0, 0]
