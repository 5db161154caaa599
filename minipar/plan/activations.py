"""Activation memory per transformer layer, and what sequence parallelism moves.

EN activation memory · RU память активаций · ZH 激活内存

Korthikanti, Casper, Lym, McAfee, Andersch, Shoeybi & Catanzaro 2022,
"Reducing Activation Recomputation in Large Transformer Models",
arXiv 2205.05198.  Bytes of activations one transformer layer keeps for
backward, 16-bit activations and 1-byte dropout masks, s sequence length,
b micro-batch, h hidden size, a attention heads, t tensor-parallel size:

    none                 sbh (34 + 5as/h)
    tp                   sbh (10 + 24/t + 5as/(ht))
    tp+sp                sbh (34/t + 5as/(ht))
    tp+selective         sbh (10 + 24/t)
    tp+sp+selective      34 sbh / t
    full                 2 sbh          (full recomputation: the layer input only)

The 5as/h term is the attention scores, softmax and its dropout mask
(s² per head); selective recomputation drops exactly that term.  The 10 of
plain TP is the LayerNorm and dropout activations TP leaves replicated;
sequence parallelism splits them along the sequence.

DeepSpeed-Ulysses (Jacobs et al. 2023, arXiv 2309.14509) splits the
sequence over P ranks and all-to-alls to heads for attention: per layer,
per link, 4Nh/P elements (N the sequence length), constant when N and P
grow together; Megatron-SP's all-gather / reduce-scatter moves 4Nh per link
whatever P is.  Ring attention (Liu, Zaharia & Abbeel 2023, arXiv
2310.01889) circulates K/V blocks around a ring of P ranks.
"""

from __future__ import annotations

from minipar.plan._check import count, positive

ACTIVATION_MODES: tuple[str, ...] = (
    "none", "tp", "tp+sp", "tp+selective", "tp+sp+selective", "full")


def activation_bytes_per_layer(
    s: int, b: int, h: int, a: int, t: int = 1, mode: str = "none"
) -> float:
    """Bytes of activations one transformer layer stores (Korthikanti et al. 2022, Table 2).

    ``mode`` is one of :data:`ACTIVATION_MODES`; ``t`` is ignored by ``none``
    and ``full``.  Each tensor-parallel rank holds this many bytes for each
    of its layers.
    """
    s, b, h, a, t = (count(n, v) for n, v in (("s", s), ("b", b), ("h", h), ("a", a), ("t", t)))
    sbh, att = float(s * b * h), 5.0 * a * s / h
    if mode == "none":
        return sbh * (34 + att)
    if mode == "tp":
        return sbh * (10 + 24 / t + att / t)
    if mode == "tp+sp":
        return sbh * (34 / t + att / t)
    if mode == "tp+selective":
        return sbh * (10 + 24 / t)
    if mode == "tp+sp+selective":
        return sbh * 34 / t
    if mode == "full":
        return 2 * sbh
    raise ValueError(f"unknown activation mode {mode!r}; one of {', '.join(ACTIVATION_MODES)}")


#: minipar's block (no dropout) for the modes it measures
#: (:func:`minipar.parallel.tensor_parallel.measure.activation_bytes_per_block`)
MINIPAR_ACTIVATION_MODES: tuple[str, ...] = ("none", "tp", "tp+sp")


def minipar_activation_formula(
    s: int, b: int, h: int, a: int, t: int = 1, mode: str = "none", itemsize: int = 2
) -> float:
    """Bytes of activations one minipar block saves for backward (``itemsize``-byte
    activations; the LayerNorms' 1/σ rows in the compute dtype: fp32 for 16-bit).

    The paper's 34·sbh + 5as²b (16-bit, dropout) term by term, against the arrays in
    minipar's ``saved`` (:mod:`minipar.nn.gpt` ``block_forward``), x·sbh meaning x bytes
    per element of b·s·h at 2 bytes:

    ====================================  ==========  =========================================
    paper's term                          paper       minipar's saved array
    ====================================  ==========  =========================================
    LayerNorm inputs (2 LNs)              4 sbh       x̂ of ln1 and ln2 (2 × 2sbh), + 1/σ (2×4sb)
    QKV input                             2 sbh       ln1's output (``attn`` linear input)
    Q, K (QKᵀ inputs)                     4 sbh       q, k: views of the fused qkv array
    V                                     2 sbh       v: the third view of qkv
    softmax output                        2 as²b      A (the attention probabilities)
    softmax dropout mask                  as²b        — (no dropout)
    dropout output (A·V input)            2 as²b      — (A itself is the A·V input)
    output projection input               2 sbh       o, merged heads
    attention dropout mask                sbh         — (no dropout)
    MLP input                             2 sbh       ln2's output
    GELU input                            8 sbh       x of gelu (the 4h pre-activation)
    —                                     —           tanh(u) of gelu: 8 sbh (kept, not recomputed)
    GELU output (W_out input)             8 sbh       gelu's output
    MLP dropout mask                      sbh         — (no dropout)
    ====================================  ==========  =========================================

    Sum, 16-bit: **sbh(40 + 2as/h) + 8sb** (34 − 2 masks + 8 tanh; 5as²b − 3as²b).  With
    tensor parallelism the LN x̂'s and the two column-parallel inputs stay replicated
    (8 sbh + 8sb) and the rest is split t ways: **sbh(8 + 32/t + 2as/(ht)) + 8sb**.  With
    sequence parallelism everything is split along the sequence or the heads (the
    column-parallel layers keep their sequence shard and all-gather it again in backward):
    **sbh(40/t + 2as/(ht)) + 8sb/t**.  For other ``itemsize`` the sbh and as²b terms scale
    by itemsize/2 and 1/σ has 4 bytes (8 for float64).
    """
    s, b, h, a, t = (count(n, v) for n, v in (("s", s), ("b", b), ("h", h), ("a", a), ("t", t)))
    e = count("itemsize", itemsize)
    stat = 8 if e == 8 else 4  # 1/σ: the compute dtype
    sbh, att = float(s * b * h) * e / 2, float(a * s * s * b) * e  # att: the A array, as²b·e
    if mode == "none":
        return 40 * sbh + att + 2 * stat * s * b
    if mode == "tp":
        return 8 * sbh + 32 * sbh / t + att / t + 2 * stat * s * b
    if mode == "tp+sp":
        return 40 * sbh / t + att / t + 2 * stat * s * b / t
    raise ValueError(f"unknown mode {mode!r} for minipar's block; one of "
                     f"{', '.join(MINIPAR_ACTIVATION_MODES)}")


def activation_bytes(
    n_layer: int, s: int, b: int, h: int, a: int, t: int = 1, mode: str = "none"
) -> float:
    """Bytes for ``n_layer`` transformer layers: n_layer × :func:`activation_bytes_per_layer`.

    Embedding, final LayerNorm and output-layer activations are not counted
    (the paper's per-layer figures).
    """
    return count("n_layer", n_layer) * activation_bytes_per_layer(s, b, h, a, t, mode)


def activation_table(s: int, b: int, h: int, a: int, t: int = 1, n_layer: int = 1
                     ) -> list[dict[str, object]]:
    """One row per mode: ``mode``, ``per_layer`` bytes and ``total`` bytes for n_layer layers."""
    return [{"mode": m, "per_layer": activation_bytes_per_layer(s, b, h, a, t, m),
             "total": activation_bytes(n_layer, s, b, h, a, t, m)} for m in ACTIVATION_MODES]


def ulysses_alltoall_elements_per_link(N: int, h: int, P: int) -> float:
    """DeepSpeed-Ulysses per layer, per link: 4Nh/P elements (arXiv 2309.14509, §3.2).

    Four all-to-alls (Q, K, V in, output back) of N·h/P elements each; N is
    the sequence length (times the batch), P the sequence-parallel size.
    """
    return 4.0 * count("N", N) * count("h", h) / count("P", P)


def megatron_sp_elements_per_link(N: int, h: int, P: int) -> float:
    """Megatron-SP per layer, per link: 4Nh elements, independent of P (arXiv 2309.14509, §3.2).

    ``P`` is validated but does not change the result: that is the point.
    """
    count("P", P)
    return 4.0 * count("N", N) * count("h", h)


def ring_attention_bytes_per_rank(
    s: int, b: int, h: int, P: int, bytes_per_elem: float = 2
) -> float:
    """K/V bytes one rank sends per layer forward in ring attention (arXiv 2310.01889).

    Each rank owns a block of s/P tokens; its K and V blocks (2·b·(s/P)·h
    elements) pass P−1 times around the ring: (P−1) × 2·b·s·h/P × bytes.
    """
    s, b, h, P = count("s", s), count("b", b), count("h", h), count("P", P)
    return (P - 1) * 2.0 * b * s * h / P * positive("bytes_per_elem", bytes_per_elem)


#: the kinds of context parallelism :func:`cp_bytes_per_layer` knows
CP_KINDS = ("ring", "allgather", "ulysses", "usp")


def cp_bytes_per_layer(kind: str, b: int, s: int, heads: int, kv_heads: int, head_dim: int,
                       c: int, ulysses: int = 1, bytes_per_elem: float = 2,
                       acc_bytes: float | None = None) -> tuple[float, float]:
    """(forward, backward) bytes one rank sends per layer for attention under context
    parallelism of size c — the closed forms of what minipar's code counts
    (:mod:`minipar.parallel.context_parallel.measure`), P dividing everything.

    ``heads`` H and ``kv_heads`` K are those of the rank's tensor slice; E = b·(s/c)·d_h:
    ring 2(c−1)·K·E forward, the same plus 2c·K·E (dK, dV, ``acc_bytes``) backward;
    all-gather (c−1)·2K·E each way (Llama 3); Ulysses (2H + 2K')·E·(c−1)/c each way,
    K' = max(K, c); USP (U = ``ulysses``, R = c/U, K' = max(K, U)): Ulysses over U on
    s/R positions plus the ring over R on K'/U heads (Fang & Zhao 2024)."""
    if kind not in CP_KINDS:
        raise ValueError(f"cp kind must be one of {', '.join(CP_KINDS)}, got {kind!r}")
    b, s, c = count("b", b), count("s", s), count("c", c)
    e = positive("bytes_per_elem", bytes_per_elem)
    acc = e if acc_bytes is None else acc_bytes
    E = b * s / c * head_dim
    if kind == "ring":
        return 2 * (c - 1) * kv_heads * E * e, 2 * (c - 1) * kv_heads * E * e + (
            2 * c * kv_heads * E * acc if c > 1 else 0)
    if kind == "allgather":
        return (c - 1) * 2 * kv_heads * E * e, (c - 1) * 2 * kv_heads * E * acc
    u = count("ulysses", ulysses) if kind == "usp" else c
    kvp = max(kv_heads, u)
    a2a = (2 * heads + 2 * kvp) * E * (u - 1) / u * e
    if kind == "ulysses":
        return a2a, a2a
    ring_f, ring_b = cp_bytes_per_layer("ring", b, s, heads, kvp / u, head_dim, c // u, 1, e,
                                        acc)  # R = c/U ranks of s/R positions, K'/U heads
    return a2a + ring_f, a2a + ring_b
