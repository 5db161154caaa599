"""Mixture of experts: expert capacity, load-balancing loss, all-to-all bytes.

EN mixture of experts / expert parallelism · RU смесь экспертов / экспертный параллелизм · ZH 混合专家 / 专家并行

Switch Transformer (Fedus, Zoph & Shazeer 2021, arXiv 2101.03961):

    expert capacity C = ⌈tokens / E × capacity_factor⌉     (tokens per expert)
    aux loss = α · E · Σᵢ fᵢ · Pᵢ                           (α = 0.01)

fᵢ the fraction of tokens whose first choice is expert i, Pᵢ the mean
router probability of expert i; a token over capacity is dropped and
passes through the residual connection.  The loss is α when routing is
perfectly uniform (fᵢ = Pᵢ = 1/E) and grows as it concentrates.

GShard (Lepikhin et al. 2020, arXiv 2006.16668): top-2 gating; expert
parallelism dispatches each token's hidden vector (k times, top_k = k) to
the rank holding its expert with an all-to-all and combines the outputs
with a second all-to-all.

DeepSeek-V3 (arXiv 2412.19437, §2.1.2, §3.2.2): node-limited routing, a token's
k experts in at most M of G groups (nodes), bounds what one token sends across
groups: :func:`node_limited_dispatch_bytes`.  Shared experts (DeepSeekMoE) need
no all-to-all: they are replicated with the dense layers (their parameters:
:func:`minipar.plan.model.gpt_param_breakdown`'s ``shared``).
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from minipar.plan._check import count, non_negative, positive
from minipar.plan.collectives import all_to_all_volume


def expert_capacity(tokens: int, n_experts: int, capacity_factor: float = 1.0) -> int:
    """C = ⌈tokens / E × capacity_factor⌉, tokens one expert takes per group (Switch, §2.2).

    Rounded exactly as ``minipar.nn.moe.expert_capacity`` does: the product
    is rounded to 9 decimals before the ceiling, so 50 tokens, 5 experts and
    factor 1.1 give 11 (the float product is 11.000000000000002), not 12.
    """
    t, E = count("tokens", tokens), count("n_experts", n_experts)
    cf = positive("capacity_factor", capacity_factor)
    return math.ceil(round(t * cf / E, 9))


def load_balancing_loss(f: Sequence[float], P: Sequence[float], alpha: float = 0.01) -> float:
    """Switch auxiliary loss α · E · Σᵢ fᵢ · Pᵢ, E = len(f) (Fedus et al. 2021, eq. 4).

    ``f``: fraction of tokens dispatched to each expert (first choice);
    ``P``: mean router probability of each expert.  Uniform routing gives α.
    """
    f, P = list(f), list(P)
    if not f or len(f) != len(P):
        raise ValueError(f"f and P need one entry per expert, got {len(f)} and {len(P)}")
    fs = [non_negative(f"f[{i}]", x) for i, x in enumerate(f)]
    ps = [non_negative(f"P[{i}]", x) for i, x in enumerate(P)]
    return non_negative("alpha", alpha) * len(fs) * sum(a * b for a, b in zip(fs, ps))


def moe_alltoall_bytes_per_rank(
    tokens: int, d_model: int, ep: int, top_k: int = 1, n_experts: int | None = None,
    capacity_factor: float | None = None, bytes_per_elem: float = 2, backward: bool = False,
) -> float:
    """Bytes one expert-parallel rank sends per MoE layer: dispatch + combine all-to-alls.

    ``tokens`` on this rank, each sent to ``top_k`` experts (Switch 1, GShard
    2) as a d_model vector; experts spread evenly over ``ep`` ranks, so with
    uniform routing (ep−1)/ep of the buffer leaves the rank.  Buffer per
    all-to-all: tokens·top_k·d·bytes, or, with ``capacity_factor`` (and
    ``n_experts``), the fixed-shape padded buffer E·C·d·bytes of GShard /
    Switch with C = :func:`expert_capacity` (tokens·top_k, E, cf).  Two
    all-to-alls forward (dispatch, combine); ``backward`` adds the two
    conjugate all-to-alls of backward.
    """
    t, d, ep, k = count("tokens", tokens), count("d_model", d_model), count("ep", ep), count("top_k", top_k)
    b = positive("bytes_per_elem", bytes_per_elem)
    if capacity_factor is None:
        S = t * k * d * b
    else:
        if n_experts is None:
            raise ValueError("capacity_factor needs n_experts (the padded buffer is E × C × d)")
        E = count("n_experts", n_experts)
        if E % ep:
            raise ValueError(f"n_experts={E} does not split evenly over ep={ep} ranks")
        S = E * expert_capacity(t * k, E, capacity_factor) * d * b
    return (4 if backward else 2) * all_to_all_volume(S, ep)


def node_limited_dispatch_bytes(tokens: int, d_model: int, top_k: int, groups: int = 1,
                                per_token: int = 1, bytes_per_elem: float = 2) -> dict[str, float]:
    """Upper bounds of the bytes one dispatch all-to-all sends out of a group (a node) for
    ``tokens`` tokens routed top-``top_k`` over ``groups`` G groups, at most ``per_token`` M
    groups a token:

    * ``per_assignment``: minipar's dispatch, one d-vector per assignment (k per token),
      whatever the groups: tokens·k·d·b;
    * ``per_group``: DeepSeek-V3's, a token's vector sent once to each group it reaches,
      at most min(k, M) groups (node-limited) — without the limit min(k, G):
      tokens·min(k, M)·d·b;
    * ``per_group_unlimited``: the same bound with M = G (no node limit).

    The combine all-to-all sends the same bytes back; backward repeats both."""
    t, d, k = count("tokens", tokens), count("d_model", d_model), count("top_k", top_k)
    g, m = count("groups", groups), count("per_token", per_token)
    if m > g:
        raise ValueError(f"per_token={m} exceeds groups={g}")
    b = positive("bytes_per_elem", bytes_per_elem)
    return {"per_assignment": t * k * d * b, "per_group": t * min(k, m) * d * b,
            "per_group_unlimited": t * min(k, g) * d * b}
