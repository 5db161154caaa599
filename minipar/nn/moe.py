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

    C = ceil(k·N / E × capacity_factor)

tokens: the group makes k·N assignments (top-1: N, Switch; top-2: 2N, GShard's
capacity), so a capacity factor of 1 has room for all of them when the load is
even.  Priority is deterministic: all first choices before any second
choice (GShard), and within a choice rank by token position n (row-major
over (B, T)).  A token beyond an expert's capacity is *dropped* for that
choice: its expert output is 0, so it passes through the block's residual
connection unchanged.

Three steps — dispatch, experts, combine (``moe_steps.py``).  The block is
computed as three functions, each with its backward, so that expert
parallelism can put an all-to-all between them.  E = 4, C = 3, top-1, N = 8
tokens whose first choices are 0 2 0 1 0 0 3 2 (capacity_factor 1.5):

     dispatch                    experts                       combine
     router, top-k, capacity     out[e] = Expert_e(buf[e])     y[n] = g · out[e, slot]

    h (N, d)     buffers (E, C, d)             out (E, C, d)              y (N, d)
    t0 → e0      e0 [t0 t2 t4]    Expert_0     e0 [o0 o2 o4]     ─→   y0 y2 y4
    t1 → e2      e1 [t3  0  0]    Expert_1     e1 [o3  0  0]     ─→   y3
    t2 → e0      e2 [t1 t7  0]    Expert_2     e2 [o1 o7  0]     ─→   y1 y7
    t3 → e1      e3 [t6  0  0]    Expert_3     e3 [o6  0  0]     ─→   y6
    t4 → e0
    t5 → e0  ✗   e0 is full (t5 is its 4th token, C = 3): dropped, y5 = 0,
    t6 → e3      the residual connection carries t5 on unchanged
    t7 → e2
                              ▲              ▲
    expert parallelism: all-to-all #1   all-to-all #2 (the reverse)

The buffers have a fixed shape (E, C, d): zero rows where an expert got
fewer than C tokens (an expert computes only its filled rows).  With
expert parallelism over ep ranks, rank r holds experts r·E/ep …
(r+1)·E/ep − 1: all-to-all #1 sends buffers[E/ep·s : E/ep·(s+1)] (and
their counts) to rank s, the experts run, all-to-all #2 brings their
outputs back, and combine runs on the rank that owns the tokens; backward
mirrors both: d(out) goes to the experts' ranks, d(buffers) comes back.

Auxiliary load-balancing loss (Switch eq. 4), added to the model's loss:

    aux = α · E · Σ_i f_i · P_i,   f_i = fraction of tokens whose first choice is i
                                   P_i = mean over tokens of P[n, i]

(α = ``aux_loss_coef``, default 0.01).  The routing decision is a step
function, so its gradient is 0: f_i is a constant, and gradients reach the
router only through the gates g and through P_i.  tests/test_nn_moe.py and
tests/test_moe_split.py check every gradient by finite differences at
points where no token is near a routing tie.

DeepSeek-V3's experts (``minipar/nn/moe_routing.py``, every option composable with the
above, tests/test_moe_routing.py): ``n_shared`` shared experts added to every token's
output, top-k beyond 2 with normalised gates, ``scoring="sigmoid"``, the loss-free bias
``p["expert_bias"]`` (selection only, not a parameter), the sequence-wise balance loss,
``capacity_factor=None`` (dropless: C = the largest load) and ``groups=(G, M)``
(node-limited routing).
"""

from __future__ import annotations

from typing import Any

from minipar.nn.moe_steps import (
    combine_backward,
    combine_forward,
    dispatch_backward,
    dispatch_forward,
    expert_capacity,
    expert_params,
    experts_backward,
    experts_forward,
    route,
)
from minipar.nn.moe_routing import shared_backward, shared_forward

__all__ = ["expert_capacity", "expert_params", "moe_backward", "moe_forward", "route"]


def moe_forward(
    p: dict[str, Any],
    x: Any,
    n_experts: int,
    top_k: int = 1,
    capacity_factor: float | None = 1.25,
    aux_loss_coef: float = 0.01,
    n_shared: int = 0,
    **routing: Any,
) -> tuple[Any, dict[str, Any]]:
    """MoE layer on x (B, T, d); ``p`` = {router, experts.{e}.{w_in,b_in,w_out,b_out},
    shared.{j}.* (``n_shared`` shared experts), expert_bias (optional, loss-free)}.

    dispatch → experts → combine (+ the shared experts).  Returns ``(y, saved)``;
    ``saved`` is the dispatch's (routing and what plots need: ``aux_loss`` (float),
    ``routed`` (E,) first-choice counts before capacity, ``loads`` (E,) top-k assignments,
    ``tokens_per_expert`` (E,) assignments kept, ``dropped`` (int) assignments dropped,
    ``capacity``, ``expert_index`` and ``kept``) plus ``experts``, ``combine`` and
    ``shared``.  ``routing``: :func:`~minipar.nn.moe_steps.dispatch_forward`'s keywords
    (``scoring``, ``groups``, ``seq_aux_loss_coef``).
    """
    h = x.reshape(-1, x.shape[-1])
    buffers, s_dispatch = dispatch_forward(p["router"], h, n_experts, top_k, capacity_factor,
                                           aux_loss_coef, bias=p.get("expert_bias"),
                                           seq_len=x.shape[-2], **routing)
    out, s_experts = experts_forward(p, buffers, s_dispatch["tokens_per_expert"])
    y, s_combine = combine_forward(out, s_dispatch)
    ys, s_shared = shared_forward(p, h, n_shared)
    if ys is not None:
        y = y + ys
    saved = {**s_dispatch, "x_shape": x.shape, "experts": s_experts, "combine": s_combine,
             "shared": s_shared}
    return y.reshape(x.shape), saved


def moe_backward(
    p: dict[str, Any], saved: dict[str, Any], dy: Any, daux: float = 1.0
) -> tuple[Any, dict[str, Any]]:
    """Return ``(dx, grads)``; ``daux`` = d(total loss)/d(aux_loss) (1 serially).

    combine⁻¹ → experts⁻¹ → dispatch⁻¹ (+ the shared experts'); grads keyed like ``p``
    (router first, no ``expert_bias``: it is not a parameter).
    """
    dy = dy.reshape(-1, dy.shape[-1])
    d_out, d_gates = combine_backward(saved["combine"], dy)
    d_buffers, g_experts = experts_backward(p, saved["experts"], d_out)
    dh, d_router = dispatch_backward(p["router"], saved, d_buffers, d_gates, daux)
    d_shared, g_shared = shared_backward(p, saved["shared"], dy)
    if d_shared is not None:
        dh = dh + d_shared
    return dh.reshape(saved["x_shape"]), {"router": d_router, **g_experts, **g_shared}
