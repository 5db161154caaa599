"""MoE in three steps: dispatch, experts, combine — диспетчеризация, эксперты,
объединение — 分发、专家、合并.

The serial mixture-of-experts block of ``moe.py`` (Switch Transformer,
Fedus et al. 2021, arXiv 2101.03961; GShard, Lepikhin et al. 2020, arXiv
2006.16668) written as the three steps GShard names, each a forward and
its backward, so that expert parallelism can put an all-to-all between
dispatch and experts and another between experts and combine:

    dispatch   h (N, d) ─→ buffers (E, C, d)   router P = softmax(h W_router), top-k,
                                               capacity C, buffers[e_j, slot_j] = h[n] if kept
    experts    buffers ─→ out (E, C, d)        out[e] = Expert_e(buffers[e])  (loop over experts)
    combine    out ─→ y (N, d)                 y[n] = Σ_j kept[n, j] · g_j · out[e_j, slot_j]

Backward runs the other way: combine gives d(out) and d(gates); experts
give d(buffers) and the experts' gradients; dispatch gives dh (gathered
back from d(buffers), plus the router's term) and the router's gradient,
through the gates and through the aux loss's P_i (f_i is constant).
``minipar.nn.moe.moe_forward`` / ``moe_backward`` (the router, gates and priorities defined
there) are these three in order and equal the
one-piece block bit for bit (tests/test_moe_split.py).

Rows of a buffer beyond the expert's tokens are zero; the expert computes
only its filled rows (dispatch's ``tokens_per_expert`` says how many), so
the padding rows of ``out`` and of every gradient are exactly 0.  Every ``saved`` holds activations
only; each backward is handed the parameters it needs again.
"""

from __future__ import annotations

import math
from typing import Any

from minipar.backend import xp
from minipar.nn.dtypes import compute_dtype, down, up
from minipar.nn.mlp import mlp_backward, mlp_forward
from minipar.nn.moe_routing import (affinities, affinities_backward, balance_backward,
                                   balance_losses, choose, dropless_capacity, gates,
                                   gates_backward, group_mask, normalised)


def expert_capacity(n_tokens: int, n_experts: int, capacity_factor: float) -> int:
    """C = ceil(n_tokens / n_experts × capacity_factor), tokens per expert per group.

    ``n_tokens`` counts *assignments*: a top-k router sends each of N tokens to k
    experts, so the block asks for C over k·N (GShard, arXiv 2006.16668, and Mesh
    TensorFlow's MoE: top-2 with capacity factor 1 has room for every assignment
    when the load is even; over N alone, top-2 would drop at least half)."""
    return math.ceil(round(n_tokens * capacity_factor / n_experts, 9))


def route(probs: Any, top_k: int, capacity: int, order: Any = None,
          scoring: str = "softmax") -> dict[str, Any]:
    """Top-k choice, gates and capacity for router scores ``probs`` (N, E).

    Returns a dict of arrays, each (N, k): ``expert_index`` the chosen
    experts, best first (``order`` when given: chosen by s + b or within groups,
    :mod:`minipar.nn.moe_routing`); ``chosen_probs`` P[n, e_j]; ``gates``;
    ``priority`` the place in the expert's queue (all first choices, then
    all second choices, each in token order); ``kept`` = priority < capacity;
    ``slot`` the row of the expert's buffer a kept assignment takes (its
    rank among that expert's kept tokens in token order, -1 where dropped).

    For top-1 the slot equals the priority.  For top-2 the kept tokens sit in
    token order, so an expert's weight gradient sums its tokens in token
    order, whichever choice brought them.
    """
    n, e = probs.shape
    if order is None:
        order = choose(probs, top_k)
    chosen = xp.take_along_axis(probs, order, axis=1)
    flat = order.T.reshape(-1)  # priority: choice rank first, then token position
    onehot = (flat[:, None] == xp.arange(e)[None, :]).astype(xp.int64)
    priority = (xp.cumsum(onehot, axis=0) - 1)[xp.arange(flat.size), flat]
    priority = priority.reshape(top_k, n).T
    kept = priority < capacity
    flat = order.reshape(-1)  # buffer rows: token position, then choice rank
    onehot = (flat[:, None] == xp.arange(e)[None, :]) & kept.reshape(-1, 1)
    slot = (xp.cumsum(onehot, axis=0) - 1)[xp.arange(flat.size), flat]
    slot = xp.where(kept, slot.reshape(n, top_k), -1)
    return {"expert_index": order, "chosen_probs": chosen, "gates": gates(chosen, scoring),
            "priority": priority, "kept": kept, "slot": slot}


def expert_params(p: dict[str, Any], e: int) -> dict[str, Any]:
    """Expert ``e``'s MLP parameters {w_in, b_in, w_out, b_out} from the layer's dict."""
    return {k: p[f"experts.{e}.{k}"] for k in ("w_in", "b_in", "w_out", "b_out")}


# -------------------------------------------------------------------- dispatch
def dispatch_forward(router: Any, h: Any, n_experts: int, top_k: int = 1,
                     capacity_factor: float | None = 1.25, aux_loss_coef: float = 0.01, *,
                     scoring: str = "softmax", bias: Any = None, groups: tuple = (1, 1),
                     seq_aux_loss_coef: float = 0.0, seq_len: int = 0
                     ) -> tuple[Any, dict[str, Any]]:
    """Route tokens h (N, d) into per-expert buffers (E, C, d) by ``router`` (d, E).

    Returns ``(buffers, saved)``: ``buffers[e, slot]`` is the token routed
    there, zero rows past the expert's count; ``saved`` holds the routing of
    :func:`route` (N, k), ``scores`` s and ``probs`` (N, E), ``f`` (E,), ``h``, and
    the statistics ``capacity``, ``routed``, ``loads`` (top-k assignments per expert,
    before capacity), ``tokens_per_expert``, ``dropped``, ``aux_loss`` (a float).
    ``scoring``, ``bias`` (E,), ``groups`` (G, M), ``seq_aux_loss_coef`` (with the
    sequence length ``seq_len``) and ``capacity_factor=None`` (dropless):
    :mod:`minipar.nn.moe_routing`.  The router runs in fp32 (fp64 for fp64 models).
    """
    n, d = h.shape
    s = affinities(up(h) @ up(router), scoring)
    allowed = group_mask(s, top_k, *groups) if groups[0] > 1 else None
    order = choose(s, top_k, bias, allowed)
    loads = xp.bincount(order.reshape(-1), minlength=n_experts)
    cap = (dropless_capacity(loads) if capacity_factor is None
           else expert_capacity(n * top_k, n_experts, capacity_factor))
    r = route(s, top_k, cap, order, scoring)
    tok, j = xp.nonzero(r["kept"])  # every kept assignment, token by token
    buffers = xp.zeros((n_experts, cap, d), dtype=h.dtype)
    buffers[r["expert_index"][tok, j], r["slot"][tok, j]] = h[tok]
    probs = normalised(s, scoring)
    aux, balance, f = balance_losses(probs, order, aux_loss_coef, seq_aux_loss_coef,
                                     seq_len or n)
    saved = {
        **r, "dtype": h.dtype, "h": h, "scores": s, "probs": probs, "f": f, "capacity": cap,
        "aux_loss": aux, "balance": balance, "scoring": scoring, "n_experts": n_experts,
        "routed": xp.bincount(order[:, 0], minlength=n_experts), "loads": loads,
        "tokens_per_expert": xp.bincount(r["expert_index"][tok, j], minlength=n_experts),
        "dropped": int((~r["kept"]).sum()),
    }
    return buffers, saved


def dispatch_backward(
    router: Any, saved: dict[str, Any], d_buffers: Any, d_gates: Any, daux: float = 1.0
) -> tuple[Any, Any]:
    """Return ``(dh, d_router)`` from d(buffers) (E, C, d), d(gates) (N, k), d(loss)/d(aux).

    dh[n] = Σ_j kept · d_buffers[e_j, slot_j] + dlogits[n] W_routerᵀ, where dlogits
    comes from the gates (normalised: g_j = s_j / S ⇒ ds_i = (dg_i − Σ_j dg_j g_j) / S)
    and from the balance losses (Switch: ∂aux/∂P[n, i] = α · E · f_i / N).
    """
    s = saved
    n, d = s["h"].shape
    dh = xp.zeros((n, d), dtype=compute_dtype(s["dtype"]))
    for j in range(s["kept"].shape[1]):  # a loop over choices, never over tokens
        tok = xp.nonzero(s["kept"][:, j])[0]
        dh[tok] += up(d_buffers[s["expert_index"][tok, j], s["slot"][tok, j]])
    dchosen = gates_backward(s["chosen_probs"], s["gates"], d_gates, s["scoring"])
    ds = xp.zeros_like(s["scores"])
    xp.put_along_axis(ds, s["expert_index"], dchosen, axis=1)
    balance_backward(ds, s["scores"], s["balance"], daux, s["scoring"])
    dlogits = affinities_backward(s["scores"], ds, s["scoring"])
    d_router = down(up(s["h"]).T @ dlogits, router.dtype)
    dh += dlogits @ up(router).T
    return down(dh, s["dtype"]), d_router


# --------------------------------------------------------------------- experts
def experts_forward(
    p: dict[str, Any], buffers: Any, counts: Any, experts: Any = None
) -> tuple[Any, list]:
    """out[i, :c] = Expert_{experts[i]}(buffers[i, :c]), c = counts[i], for buffers (E', C, d).

    ``p`` holds ``experts.{e}.{w_in,b_in,w_out,b_out}``; ``experts`` defaults to
    0 … E'−1 (a rank with expert parallelism passes the ids it owns).  Only the
    ``counts[i]`` filled rows are computed; the padding rows of ``out`` are 0.
    Computing them would cost C − c rows of MLP for nothing, and BLAS may round
    a 1-row product (gemv) differently from the same row inside a larger one
    (gemm), which would break the bit-identity with the one-piece block.
    Returns ``(out, saved)``.
    """
    ids = range(buffers.shape[0]) if experts is None else experts
    out, saved = None, []
    for i, e in enumerate(ids):  # a loop over experts, never over tokens
        c = int(counts[i])
        ye, se = mlp_forward(expert_params(p, e), buffers[i, :c])
        if out is None:
            out = xp.zeros(buffers.shape, dtype=ye.dtype)
        out[i, :c] = ye
        saved.append((e, c, se))
    return out, saved


def experts_backward(
    p: dict[str, Any], saved: list, d_out: Any
) -> tuple[Any, dict[str, Any]]:
    """Return ``(d_buffers, grads)``: d(buffers) (E', C, d), 0 on padding rows, and the
    ``experts.{e}.*`` grads (each sums the expert's tokens in buffer order)."""
    d_buffers, grads = None, {}
    for i, (e, c, se) in enumerate(saved):
        dx, ge = mlp_backward(expert_params(p, e), se, d_out[i, :c])
        if d_buffers is None:
            d_buffers = xp.zeros(d_out.shape, dtype=dx.dtype)
        d_buffers[i, :c] = dx
        grads.update({f"experts.{e}.{k}": v for k, v in ge.items()})
    return d_buffers, grads


# --------------------------------------------------------------------- combine
def combine_forward(out: Any, routing: dict[str, Any]) -> tuple[Any, dict[str, Any]]:
    """y[n] = Σ_j kept[n, j] · g_j · out[e_j, slot_j], y (N, d) in ``out``'s dtype.

    ``routing`` is dispatch's ``saved`` (``expert_index``, ``slot``, ``kept``,
    ``gates``).  A token dropped by every choice gets y = 0.  The sum runs in the
    router's dtype; with k ≤ 2 its order cannot change a bit (a + b = b + a).
    """
    r = routing
    y = xp.zeros((r["kept"].shape[0], out.shape[-1]), dtype=r["gates"].dtype)
    for j in range(r["kept"].shape[1]):  # a loop over choices, never over tokens
        tok = xp.nonzero(r["kept"][:, j])[0]
        rows = up(out[r["expert_index"][tok, j], r["slot"][tok, j]])
        y[tok] += r["gates"][tok, j][:, None] * rows
    saved = {"out": out, **{k: r[k] for k in ("expert_index", "slot", "kept", "gates")}}
    return down(y, out.dtype), saved


def combine_backward(saved: dict[str, Any], dy: Any) -> tuple[Any, Any]:
    """Return ``(d_out, d_gates)`` for dy (N, d): d_out[e_j, slot_j] = g_j · dy[n],
    d_gates[n, j] = ⟨dy[n], out[e_j, slot_j]⟩, both 0 where not kept."""
    s = saved
    dy = up(dy)
    tok, j = xp.nonzero(s["kept"])
    e, slot = s["expert_index"][tok, j], s["slot"][tok, j]
    d_gates = xp.zeros(s["gates"].shape, dtype=dy.dtype)
    d_gates[tok, j] = (dy[tok] * up(s["out"][e, slot])).sum(axis=1)
    d_out = xp.zeros_like(s["out"])
    d_out[e, slot] = down(s["gates"][tok, j][:, None] * dy[tok], s["out"].dtype)
    return d_out, d_gates
