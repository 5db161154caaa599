"""Experts: the router's load per expert against the capacity factor, and the dropped tokens.

EN experts explorer · RU нагрузка экспертов · ZH 专家负载

:func:`experts` routes N tokens to E experts (top-k) with the package's own router
(:func:`minipar.nn.moe.route`, the capacity rule of :func:`minipar.nn.moe.expert_capacity`:
C = ⌈k·N/E × capacity factor⌉, Switch, arXiv 2101.03961; GShard, arXiv 2006.16668) from
router probabilities drawn with a seed and a *skew* (a logit bias that favours the first
experts, what an unbalanced router looks like), and shows the load of each expert against
C, the assignments dropped (they pass the residual connection), Switch's auxiliary loss
α·E·Σ fᵢPᵢ (:func:`minipar.plan.moe.load_balancing_loss`) and the fraction dropped against
the capacity factor.  A router is one entry of :data:`ROUTERS`, a balancing rule one of
:data:`BALANCING`: ``loss-free`` is DeepSeek-V3's auxiliary-loss-free balancing (Wang et al.
2024, arXiv 2408.15664): a bias b per expert, added to the scores for the choice only and
updated after each step by b_i + u·sign(mean load − load_i)
(:func:`minipar.nn.moe_routing.update_bias`), here over :data:`BIAS_STEPS` steps of fresh
tokens from the same router before the batch shown.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
from matplotlib.figure import Figure

from minipar.nn.moe import expert_capacity, route
from minipar.nn.moe_routing import choose, update_bias
from minipar.plan.moe import load_balancing_loss
from minipar.viz.explore.view import View


def _softmax(logits: np.ndarray) -> np.ndarray:
    z = np.exp(logits - logits.max(axis=1, keepdims=True))
    return z / z.sum(axis=1, keepdims=True)


def _probs(tokens: int, n_experts: int, skew: float, seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    bias = -skew * np.arange(n_experts) / max(1, n_experts - 1)
    return _softmax(rng.standard_normal((tokens, n_experts)) + bias)


#: router name -> probabilities (tokens, E) from (tokens, E, skew, seed)
ROUTERS: dict[str, Callable[[int, int, float, int], np.ndarray]] = {"softmax top-k": _probs}
BIAS_STEPS, BIAS_RATE = 50, 0.002  # steps of bias updates before the batch shown, u


def _loss_free(router: str, tokens: int, n_experts: int, top_k: int, skew: float,
               seed: int) -> np.ndarray:
    bias = np.zeros(n_experts)
    for step in range(BIAS_STEPS):  # fresh tokens each step, the same router
        probs = ROUTERS[router](tokens, n_experts, skew, seed + 1 + step)
        loads = np.bincount(choose(probs, top_k, bias).reshape(-1), minlength=n_experts)
        bias = update_bias(bias, loads, BIAS_RATE)
    return bias


#: balancing rule -> the bias added to the scores for the choice (None: no bias)
BALANCING: dict[str, Callable[..., np.ndarray | None]] = {
    "none (or the aux loss)": lambda *a: None, "loss-free (DeepSeek-V3)": _loss_free}
CONTROLS: dict[str, Any] = {"router": tuple(ROUTERS), "balancing": tuple(BALANCING),
                            "tokens": (64, 256, 1024, 4096),
                            "n_experts": (4, 8, 16, 64), "top_k": (1, 2, 4),
                            "capacity_factor": (0.5, 2.5, 0.25), "skew": (0.0, 4.0, 0.5)}


def _dropped(probs: np.ndarray, top_k: int, cf: float, bias: np.ndarray | None = None
             ) -> tuple[int, int, np.ndarray]:
    n, e = probs.shape
    cap = expert_capacity(top_k * n, e, cf)
    r = route(probs, top_k, cap, order=None if bias is None else choose(probs, top_k, bias))
    return cap, int((~r["kept"]).sum()), r["expert_index"]


def experts(router: str = "softmax top-k", balancing: str = "none (or the aux loss)",
            tokens: int = 1024, n_experts: int = 8, top_k: int = 2,
            capacity_factor: float = 1.25, skew: float = 1.0, seed: int = 0) -> View:
    """Load per expert (assignments, before capacity), capacity C, dropped assignments.

    ``numbers``: ``load`` (E counts), ``capacity``, ``dropped``, ``dropped_fraction`` (of
    the k·N assignments), ``aux_loss`` (Switch's, α = 0.01), ``curve`` (capacity factor
    -> dropped fraction, 0.5 to 2.5).
    """
    if top_k > n_experts:
        raise ValueError(f"top_k = {top_k} is more than the {n_experts} experts")
    probs = ROUTERS[router](tokens, n_experts, skew, seed)
    bias = BALANCING[balancing](router, tokens, n_experts, top_k, skew, seed)
    cap, dropped, index = _dropped(probs, top_k, capacity_factor, bias)
    load = np.bincount(index.reshape(-1), minlength=n_experts)
    first = np.bincount(index[:, 0], minlength=n_experts) / tokens
    aux = load_balancing_loss(first.tolist(), probs.mean(axis=0).tolist())
    cfs = [0.5 + 0.25 * i for i in range(9)]
    curve = {cf: _dropped(probs, top_k, cf, bias)[1] / (top_k * tokens) for cf in cfs}
    numbers = {"load": load.tolist(), "capacity": cap, "dropped": dropped,
               "bias": None if bias is None else bias.tolist(),
               "dropped_fraction": dropped / (top_k * tokens), "aux_loss": aux, "curve": curve}
    lines = [f"{tokens} tokens, E = {n_experts}, top-{top_k}, capacity factor "
             f"{capacity_factor:g}: C = ⌈k·N/E × cf⌉ = {cap} assignments per expert",
             f"load per expert: {load.tolist()} (even: {top_k * tokens / n_experts:g})",
             f"dropped: {dropped} of {top_k * tokens} assignments "
             f"({numbers['dropped_fraction']:.1%}); Switch aux loss {aux:.4f} "
             "(0.0100 when perfectly even)"]
    if bias is not None:
        lines.append(f"loss-free bias after {BIAS_STEPS} steps (u = {BIAS_RATE:g}): "
                     + ", ".join(f"{b:+.3f}" for b in bias))
    return View(numbers, lines, lambda: _figure(load, cap, curve, capacity_factor))


def _figure(load: np.ndarray, cap: int, curve: dict[float, float], cf: float) -> Figure:
    fig = Figure(figsize=(9, 3.2))
    ax, bx = fig.subplots(1, 2)
    kept = np.minimum(load, cap)
    ax.bar(range(len(load)), kept, color="#4c72b0", label="kept")
    ax.bar(range(len(load)), load - kept, bottom=kept, color="#c44e52", label="dropped")
    ax.axhline(cap, color="k", ls="--", label=f"capacity C = {cap}")
    ax.set_xlabel("expert")
    ax.set_ylabel("assignments")
    ax.legend(fontsize=8)
    xs = list(curve)
    bx.plot(xs, [curve[x] for x in xs], "o-")
    bx.axvline(cf, color="grey", ls=":")
    bx.set_xlabel("capacity factor")
    bx.set_ylabel("fraction dropped")
    fig.tight_layout()
    return fig
