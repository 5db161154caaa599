"""Parameter count of minipar's GPT, dense or with mixture-of-experts blocks.

EN parameter count · RU число параметров · ZH 参数量

The count is the model of docs/ARCHITECTURE.md ("The model") exactly:
GPT-2 (Radford et al. 2019), pre-LayerNorm, untied output head.  With d =
``d_model``, f = ``d_ff`` (default 4d), V = ``vocab_size``, T = ``n_ctx``:

    tok_emb V·d + pos_emb T·d + ln_f 2d + lm_head d·V
    per block: ln1 2d + attn (d·3d + 3d + d·d + d) + ln2 2d
               + MLP (d·f + f + f·d + d)                   = 4d² + 2df + 9d + f
    (f = 4d: 12d² + 13d per block)

An MoE block (Switch, Fedus et al. 2021, arXiv 2101.03961; GShard, Lepikhin
et al. 2020, arXiv 2006.16668) replaces the MLP by a router (d, E), no bias,
and E expert MLPs of the same shape.  MoE blocks are the blocks i with
(i + 1) % moe_every == 0, as ``minipar.nn.GPTConfig`` places them
(moe_every = 2: blocks 1, 3, …).  Each token uses only top_k of the E
experts, so the *active* parameters per token are far fewer than the total.
"""

from __future__ import annotations

from minipar.plan._check import count


def moe_block_indices(n_layer: int, moe_every: int = 1) -> list[int]:
    """Indices of the blocks whose MLP is an MoE layer: i with (i + 1) % moe_every == 0."""
    n_layer, moe_every = count("n_layer", n_layer), count("moe_every", moe_every)
    return [i for i in range(n_layer) if (i + 1) % moe_every == 0]


def gpt_param_breakdown(
    n_layer: int, d_model: int, vocab_size: int, n_ctx: int,
    d_ff: int | None = None, n_experts: int = 0, moe_every: int = 1,
    shared_experts: int = 0, expert_width: int | None = None,
) -> dict[str, int]:
    """Parameters of minipar's GPT by part (elements, not bytes).

    Keys: ``embeddings`` (V·d + T·d), ``attention`` (all blocks' ln1, attn,
    ln2), ``mlp`` (dense blocks' MLPs), ``router`` and ``experts`` (MoE
    blocks), ``shared`` (DeepSeekMoE's shared experts, only when there are),
    ``head`` (ln_f + lm_head), ``total``.  The experts, routed and shared, are
    MLPs of width ``expert_width`` (default d_ff: fine-grained experts are narrower).
    """
    L, d = count("n_layer", n_layer), count("d_model", d_model)
    V, T = count("vocab_size", vocab_size), count("n_ctx", n_ctx)
    f = 4 * d if d_ff is None else count("d_ff", d_ff)
    E = count("n_experts", n_experts, minimum=0)
    moe = len(moe_block_indices(L, moe_every)) if E else 0
    mlp = d * f + f + f * d + d
    w = f if expert_width is None else count("expert_width", expert_width)
    expert = d * w + w + w * d + d
    out = {
        "embeddings": V * d + T * d,
        "attention": L * (2 * d + (d * 3 * d + 3 * d + d * d + d) + 2 * d),
        "mlp": (L - moe) * mlp,
        "router": moe * d * E,
        "experts": moe * E * expert,
        "head": 2 * d + d * V,
    }
    if count("shared_experts", shared_experts, minimum=0) and E:
        out["shared"] = moe * shared_experts * expert
    out["total"] = sum(out.values())
    return out


def gpt_param_count(
    n_layer: int, d_model: int, vocab_size: int, n_ctx: int,
    d_ff: int | None = None, n_experts: int = 0, moe_every: int = 1,
    shared_experts: int = 0, expert_width: int | None = None,
) -> int:
    """Total parameters (elements) of minipar's GPT; see the module docstring for the formula.

    ``d_ff`` defaults to 4·d_model; ``n_experts`` = 0 means a dense model.
    """
    return gpt_param_breakdown(n_layer, d_model, vocab_size, n_ctx, d_ff,
                               n_experts, moe_every, shared_experts, expert_width)["total"]


def gpt_active_param_count(
    n_layer: int, d_model: int, vocab_size: int, n_ctx: int,
    d_ff: int | None = None, n_experts: int = 0, moe_every: int = 1, top_k: int = 1,
    shared_experts: int = 0, expert_width: int | None = None,
) -> int:
    """Parameters one token uses: all but the experts it was not routed to.

    An MoE block counts its router, ``top_k`` expert MLPs (Switch top_k =
    1, GShard top_k = 2, DeepSeek-V3 8) and every shared expert (each token uses them
    all).  Equals :func:`gpt_param_count` for a dense model.
    The embedding rows of other tokens are counted, as is customary.
    """
    b = gpt_param_breakdown(n_layer, d_model, vocab_size, n_ctx, d_ff, n_experts, moe_every,
                            shared_experts, expert_width)
    k = count("top_k", top_k)
    E = count("n_experts", n_experts, minimum=0)
    if E and k > E:
        raise ValueError(f"top_k={k} exceeds n_experts={E}")
    return b["total"] - (b["experts"] - b["experts"] // E * k if E else 0)
