"""Mixture of experts — смесь экспертов — 混合专家 (MoE).

Switch Transformer (Fedus, Zoph & Shazeer 2021, arXiv 2101.03961) for
top-1, GShard (Lepikhin et al. 2020, arXiv 2006.16668) for top-2.  An MoE
layer replaces a block's MLP by a router and E expert MLPs; each token
uses only k of the E experts, so the model is *sparse*, not dense.

    P = softmax(h W_router)                       (N, E), W_router: (d, E), no bias
    chosen experts  e_1 … e_k  = the k largest P[n, :]   (ties: lower expert index)
    gates           top-1: g = P[n, e_1]  (Switch, not renormalised)
                    top-2: g_j = P[n, e_j] / (P[n, e_1] + P[n, e_2])  (GShard)
    y[n] = Σ_j kept[n, j] · g_j · Expert_{e_j}(h[n])

Group and capacity.  The *group* is all N = B·T tokens of one forward call
(one micro-batch).  Each expert takes at most

    C = ceil(N / E × capacity_factor)

tokens.  Priority is deterministic: all first choices before any second
choice (GShard), and within a choice rank by token position n (row-major
over (B, T)).  A token beyond an expert's capacity is *dropped* for that
choice: its expert output is 0, so it passes through the block's residual
connection unchanged.

Auxiliary load-balancing loss (Switch eq. 4), added to the model's loss:

    aux = α · E · Σ_i f_i · P_i,   f_i = fraction of tokens whose first choice is i
                                   P_i = mean over tokens of P[n, i]

(α = ``aux_loss_coef``, default 0.01).  The routing decision is a step
function, so its gradient is 0: f_i is a constant, and gradients reach the
router only through the gates g and through P_i.  tests/test_nn_moe.py
checks every gradient by finite differences at points where no token is
near a routing tie.
"""

from __future__ import annotations

import math
from typing import Any

from minipar.backend import xp
from minipar.nn._dtype import down, up
from minipar.nn.mlp import mlp_backward, mlp_forward


def expert_capacity(n_tokens: int, n_experts: int, capacity_factor: float) -> int:
    """C = ceil(n_tokens / n_experts × capacity_factor), tokens per expert per group."""
    return math.ceil(round(n_tokens * capacity_factor / n_experts, 9))


def route(probs: Any, top_k: int, capacity: int) -> dict[str, Any]:
    """Top-k choice, gates and capacity for router probabilities ``probs`` (N, E).

    Returns a dict of arrays: ``expert_index`` (N, k) chosen experts, best
    first; ``gates`` (N, k); ``kept`` (N, k) bool, False where the expert was
    full; ``slot`` (N, k) the position in the expert's buffer.
    """
    n, e = probs.shape
    order = xp.argsort(-probs, axis=1, kind="stable")[:, :top_k]  # ties -> lower index
    chosen = xp.take_along_axis(probs, order, axis=1)
    gates = chosen if top_k == 1 else chosen / chosen.sum(axis=1, keepdims=True)
    flat = order.T.reshape(-1)  # priority: choice rank first, then token position
    onehot = (flat[:, None] == xp.arange(e)[None, :]).astype(xp.int64)
    slot = (xp.cumsum(onehot, axis=0) - 1)[xp.arange(flat.size), flat]
    slot = slot.reshape(top_k, n).T
    return {"expert_index": order, "chosen_probs": chosen, "gates": gates,
            "kept": slot < capacity, "slot": slot}


def moe_forward(
    p: dict[str, Any],
    x: Any,
    n_experts: int,
    top_k: int = 1,
    capacity_factor: float = 1.25,
    aux_loss_coef: float = 0.01,
) -> tuple[Any, dict[str, Any]]:
    """MoE layer on x (B, T, d); ``p`` = {router, experts.{e}.{w_in,b_in,w_out,b_out}}.

    Returns ``(y, saved)``; ``saved`` also carries what plots need:
    ``aux_loss`` (float), ``routed`` (E,) first-choice counts before capacity,
    ``tokens_per_expert`` (E,) assignments kept, ``dropped`` (int)
    assignments dropped, ``capacity``, ``expert_index`` and ``kept``.
    """
    dt = x.dtype
    b, t, d = x.shape
    h = x.reshape(-1, d)
    n = h.shape[0]
    logits = up(h) @ up(p["router"])  # the router runs in fp32 (or fp64)
    probs = logits - logits.max(axis=1, keepdims=True)
    xp.exp(probs, out=probs)
    probs /= probs.sum(axis=1, keepdims=True)
    cap = expert_capacity(n, n_experts, capacity_factor)
    r = route(probs, top_k, cap)
    y = xp.zeros((n, d), dtype=probs.dtype)
    experts = []
    for e in range(n_experts):  # a loop over experts, never over tokens
        tok, j = xp.nonzero((r["expert_index"] == e) & r["kept"])
        pe = expert_params(p, e)
        ye, se = mlp_forward(pe, h[tok])
        y[tok] += r["gates"][tok, j][:, None] * up(ye)
        experts.append((tok, j, ye, se))
    first = (r["expert_index"][:, 0][:, None] == xp.arange(n_experts)[None, :])
    f = first.astype(probs.dtype).mean(axis=0)  # f_i: a constant (no gradient)
    aux = float(aux_loss_coef * n_experts * (f * probs.mean(axis=0)).sum())
    kept_e = xp.where(r["kept"], r["expert_index"], -1).reshape(-1)
    saved = {
        **r, "x_shape": x.shape, "dtype": dt, "h": h, "probs": probs, "f": f,
        "experts": experts, "capacity": cap, "aux_loss": aux,
        "aux_loss_coef": float(aux_loss_coef), "n_experts": n_experts,
        "routed": first.sum(axis=0),
        "tokens_per_expert": xp.bincount(kept_e[kept_e >= 0], minlength=n_experts),
        "dropped": int((~r["kept"]).sum()),
    }
    return down(y.reshape(b, t, d), dt), saved


def expert_params(p: dict[str, Any], e: int) -> dict[str, Any]:
    """Expert ``e``'s MLP parameters {w_in, b_in, w_out, b_out} from the layer's dict."""
    return {k: p[f"experts.{e}.{k}"] for k in ("w_in", "b_in", "w_out", "b_out")}


def moe_backward(
    p: dict[str, Any], saved: dict[str, Any], dy: Any, daux: float = 1.0
) -> tuple[Any, dict[str, Any]]:
    """Return ``(dx, grads)``; ``daux`` = d(total loss)/d(aux_loss) (1 serially)."""
    s = saved
    n, d = s["h"].shape
    e_count = s["n_experts"]
    dy2 = up(dy).reshape(n, d)
    dh = xp.zeros((n, d), dtype=dy2.dtype)
    dgates = xp.zeros(s["gates"].shape, dtype=dy2.dtype)
    grads: dict[str, Any] = {}
    for e, (tok, j, ye, se) in enumerate(s["experts"]):
        dgates[tok, j] = (dy2[tok] * up(ye)).sum(axis=1)
        dye = s["gates"][tok, j][:, None] * dy2[tok]
        dxe, ge = mlp_backward(expert_params(p, e), se, down(dye, s["dtype"]))
        dh[tok] += up(dxe)
        grads.update({f"experts.{e}.{k}": v for k, v in ge.items()})
    if dgates.shape[1] == 1:
        dchosen = dgates
    else:  # g_j = p_j / S  =>  dp_i = (dg_i − Σ_j dg_j g_j) / S
        ssum = s["chosen_probs"].sum(axis=1, keepdims=True)
        dchosen = (dgates - (dgates * s["gates"]).sum(axis=1, keepdims=True)) / ssum
    probs = s["probs"]
    dprobs = xp.zeros_like(probs)
    xp.put_along_axis(dprobs, s["expert_index"], dchosen, axis=1)
    dprobs += (float(daux) * s["aux_loss_coef"] * e_count / n) * s["f"][None, :]
    dlogits = probs * (dprobs - (dprobs * probs).sum(axis=1, keepdims=True))
    h = up(s["h"])
    router = p["router"]
    grads = {"router": down(h.T @ dlogits, router.dtype), **grads}
    dh += dlogits @ up(router).T
    return down(dh.reshape(s["x_shape"]), s["dtype"]), grads
