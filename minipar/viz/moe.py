"""Figures for mixture of experts and expert parallelism: sparsity, load, drops, traffic.

EN mixture of experts / expert parallelism · RU смесь экспертов / параллелизм экспертов ·
ZH 混合专家 / 专家并行

Switch Transformer (Fedus, Zoph & Shazeer 2021, arXiv 2101.03961), GShard
(Lepikhin et al. 2020, arXiv 2006.16668).  An MoE layer is *sparse*: each
token runs k of the E expert MLPs, so per token

    active parameters = total − (E − k) · expert MLP            (minipar.plan.model)
    FLOPs per token   ≈ 2 · (router d·E + k · 2·d·d_ff)         (one multiply-add = 2 FLOPs)

while the total grows with E.  The functions:

* :func:`layer_costs` — measures one layer's forward, per token, for a dense
  MLP of the same *active* size, the MoE layer, and a dense MLP of the same
  *total* size (d_ff x E): FLOPs counted from the rows each expert really
  computed, seconds timed (best of ``repeats``);
* :func:`sparsity` — total vs active parameters per token as E grows;
* :func:`compute_per_token` — :func:`layer_costs`' rows as bars;
* :func:`moe_stats` — one row of ``minipar.parallel.expert_parallel.measure.routing_table``
  as ``GPT.moe_stats``-like dicts, for :func:`minipar.viz.model.expert_load`;
* :func:`drop_curve` — dropped share of assignments against the capacity factor,
  before and after training, with Switch's "< 1 %" at factor 1.25 marked;
* :func:`traffic` — all-to-all bytes per rank of a real expert-parallel run,
  counted, next to the exact formula.

All take plain data and return a Figure, never shown (headless).
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from typing import Any

import matplotlib.pyplot as plt
import numpy as np
from matplotlib.figure import Figure


# -- the numbers ------------------------------------------------------------------------------
def layer_costs(tokens: int = 1024, d_model: int = 64, n_experts: int = 8, top_k: int = 1,
                capacity_factor: float = 1.25, repeats: int = 3, seed: int = 0
                ) -> list[dict[str, Any]]:
    """One FFN layer's forward, per token: dense (same active size), MoE, dense (same total).

    Each row: ``name``, ``params`` (total), ``active`` (parameters one token
    uses), ``flops`` (per token, counted: 2 per multiply-add over the rows
    actually computed, router included), ``seconds`` (per token, best of
    ``repeats``).  float64, random tokens, experts initialised N(0, 0.02²).
    """
    from minipar.nn.mlp import mlp_forward
    from minipar.nn.moe import moe_forward

    rng = np.random.default_rng(seed)
    d, f, E = d_model, 4 * d_model, n_experts
    h = rng.standard_normal((1, tokens, d))

    def mlp(width: int) -> dict[str, np.ndarray]:
        return {"w_in": rng.normal(0, 0.02, (d, width)), "b_in": np.zeros(width),
                "w_out": rng.normal(0, 0.02, (width, d)), "b_out": np.zeros(d)}

    moe = {"router": rng.normal(0, 0.02, (d, E))}
    for e in range(E):
        moe.update({f"experts.{e}.{k}": v for k, v in mlp(f).items()})
    expert = 2 * d * f + f + d  # one expert MLP's parameters

    def best(fn: Any) -> float:
        times = []
        for _ in range(repeats):
            t0 = time.perf_counter()
            fn()
            times.append(time.perf_counter() - t0)
        return min(times) / tokens

    small, wide = mlp(f), mlp(f * E)
    _, saved = moe_forward(moe, h, E, top_k, capacity_factor, 0.0)
    rows_run = int(np.sum(saved["tokens_per_expert"]))  # rows the experts computed
    return [
        {"name": f"dense MLP, d_ff = {f} (same active)", "params": expert, "active": expert,
         "flops": 4 * d * f, "seconds": best(lambda: mlp_forward(small, h))},
        {"name": f"MoE, E = {E}, top-{top_k}", "params": E * expert + d * E,
         "active": top_k * expert + d * E,
         "flops": 2 * d * E + 4 * d * f * rows_run / tokens,
         "seconds": best(lambda: moe_forward(moe, h, E, top_k, capacity_factor, 0.0))},
        {"name": f"dense MLP, d_ff = {f * E} (same total)", "params": 2 * d * f * E + f * E + d,
         "active": 2 * d * f * E + f * E + d, "flops": 4 * d * f * E,
         "seconds": best(lambda: mlp_forward(wide, h))},
    ]


# -- figures ----------------------------------------------------------------------------------
def sparsity(rows: Sequence[Mapping[str, Any]]) -> Figure:
    """Total vs active parameters per token, one group of bars per row (log scale).

    ``rows``: ``label``, ``total``, ``active`` (e.g. from
    ``minipar.plan.model.gpt_param_count`` / ``gpt_active_param_count``)."""
    if not rows:
        raise ValueError("no rows to draw")
    fig, ax = plt.subplots(figsize=(max(5.0, 1.1 * len(rows) + 1.5), 3.4))
    x = np.arange(len(rows))
    total = np.array([r["total"] for r in rows], dtype=float)
    active = np.array([r["active"] for r in rows], dtype=float)
    ax.bar(x - 0.2, total, width=0.4, color="C0", label="total parameters")
    ax.bar(x + 0.2, active, width=0.4, color="C1", label="active per token")
    for i, (t, a) in enumerate(zip(total, active)):
        ax.annotate(f"{a / t:.0%}", (i + 0.2, a), ha="center", va="bottom", fontsize=8)
    ax.set_yscale("log")
    ax.set_xticks(x, [r["label"] for r in rows], fontsize=8)
    ax.set_ylabel("parameters")
    ax.set_title("sparse: each token uses k of E experts (active / total above the bars)",
                 fontsize=9)
    ax.legend(fontsize=8, frameon=False)
    fig.tight_layout()
    return fig


def compute_per_token(rows: Sequence[Mapping[str, Any]]) -> Figure:
    """:func:`layer_costs`' rows: parameters, FLOPs and measured time per token, side by side."""
    if not rows:
        raise ValueError("no rows to draw")
    fig, axes = plt.subplots(1, 3, figsize=(11, 3.3))
    names = [r["name"] for r in rows]
    y = np.arange(len(rows))
    for ax, (key, title, scale, fmt) in zip(axes, (
            ("params", "parameters (total)", 1.0, " {:,.0f}"),
            ("flops", "FLOPs per token (counted)", 1.0, " {:,.0f}"),
            ("seconds", "time per token (µs, measured)", 1e6, " {:.1f}"))):
        vals = np.array([r[key] for r in rows], dtype=float) * scale
        ax.barh(y, vals, color=[f"C{i}" for i in range(len(rows))])
        for i, v in enumerate(vals):
            ax.annotate(fmt.format(v), (v, i), va="center", ha="left", fontsize=8)
        ax.set_title(title, fontsize=9)
        ax.set_yticks(y, names if ax is axes[0] else [""] * len(rows), fontsize=8)
        ax.invert_yaxis()
        ax.margins(x=0.3)
    fig.tight_layout()
    return fig


def moe_stats(row: Mapping[str, Any]) -> list[dict[str, Any]]:
    """One ``routing_table`` row (one capacity factor) as per-block ``GPT.moe_stats``-like dicts.

    Keys per block: ``block`` (index among the MoE blocks), ``routed``,
    ``tokens_per_expert``, ``capacity``, ``dropped`` (assignments of the block
    not kept: ``assignments`` − Σ kept)."""
    out = []
    for b, (routed, kept) in enumerate(zip(row["routed"], row["tokens_per_expert"])):
        out.append({"block": b, "routed": list(routed), "tokens_per_expert": list(kept),
                    "capacity": row["capacity"], "dropped": int(row["assignments"] - sum(kept))})
    return out


def drop_curve(curves: Mapping[str, Sequence[Mapping[str, Any]]],
               mark: float = 1.25, target: float = 0.01) -> Figure:
    """Dropped share of assignments against the capacity factor, one line per state.

    ``curves``: label -> routing table (rows with ``capacity_factor`` and
    ``drop_rate``), e.g. before training and after training with α = 0 and
    α = 0.01.  The dotted line is Switch's "typically < 1 %" at ``mark``."""
    if not curves:
        raise ValueError("no curves to draw")
    fig, ax = plt.subplots(figsize=(5.6, 3.4))
    for i, (label, table) in enumerate(curves.items()):
        cf = [r["capacity_factor"] for r in table]
        rate = [100 * r["drop_rate"] for r in table]
        ax.plot(cf, rate, "o-", color=f"C{i}", label=label)
    ax.axvline(mark, color="gray", lw=0.8)
    ax.axhline(100 * target, color="k", ls=":", lw=1,
               label=f"Switch: < {target:.0%} at factor {mark:g}")
    ax.set_xlabel("capacity factor  (C = ⌈k · tokens / E × factor⌉)")
    ax.set_ylabel("assignments dropped (%)")
    ax.set_ylim(bottom=0)
    ax.legend(fontsize=8, frameon=False)
    fig.tight_layout()
    return fig


def traffic(per_rank: Sequence[Mapping[str, Any]], axis: str = "ep",
            formula_key: str = "ep_bytes_formula") -> Figure:
    """Bytes each rank sent on ``axis`` per step (counted) next to the exact formula.

    ``per_rank``: one dict per rank with ``bytes_by_axis`` (axis -> bytes per
    step) and ``formula_key`` (the formula's bytes for that rank)."""
    if not per_rank:
        raise ValueError("no ranks to draw")
    fig, ax = plt.subplots(figsize=(max(4.5, 1.0 * len(per_rank) + 2), 3.2))
    x = np.arange(len(per_rank))
    counted = np.array([r["bytes_by_axis"].get(axis, 0) for r in per_rank], dtype=float)
    formula = np.array([r[formula_key] for r in per_rank], dtype=float)
    ax.bar(x, counted / 1e3, width=0.6, color="C0", label=f"counted ({axis} axis)")
    ax.scatter(x, formula / 1e3, marker="_", s=900, color="k", zorder=3, label="formula")
    ax.set_xticks(x, [f"rank {i}" for i in x])
    ax.set_ylabel("kB sent per step")
    ax.set_ylim(0, 1.3 * max(counted.max(), formula.max(), 1.0) / 1e3)
    ax.set_title("all-to-all traffic per rank: dispatch + combine, forward + backward",
                 fontsize=9)
    ax.legend(fontsize=8, frameon=False, loc="upper center", ncol=2)
    fig.tight_layout()
    return fig
