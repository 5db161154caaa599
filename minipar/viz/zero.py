"""Figures for ZeRO: model-state memory and traffic per stage, measured against the paper.

EN Zero Redundancy Optimizer · RU оптимизатор с нулевой избыточностью · ZH 零冗余优化器

Input: ``results = {N: minipar.bench.zero.measure_stages(N)}``, i.e. for each
world size N and ZeRO stage the per-rank measurements (ledger bytes by
category, tracemalloc bytes, bytes sent per step).  Each bar is what the
busiest rank (rank 0: the uneven shards give it the extra element) measured;
each black tick is the formula of Rajbhandari et al. 2019 (arXiv 1910.02054,
``minipar.plan.zero``): model states (2+2+K)Ψ, 4Ψ + KΨ/N, 2Ψ + (2+K)Ψ/N,
(2+2+K)Ψ/N with K = 12, and traffic 2Ψ(N-1)/N (stages 0-2), 3Ψ(N-1)/N
(stage 3) 16-bit elements.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import matplotlib.pyplot as plt
from matplotlib.figure import Figure

from minipar.plan.zero import STAGE_NAMES, zero_comm_bytes_per_rank, zero_model_state_bytes

CATEGORIES = ("params", "grads", "optimizer states")
COLORS = {"params": "#4c72b0", "grads": "#dd8452", "optimizer states": "#55a868"}
Results = Mapping[int, Mapping[int, Mapping[str, Any]]]


def rows(results: Results, K: int = 12) -> list[dict[str, Any]]:
    """One row per (N, stage): the busiest rank's measured bytes next to the formulas.

    Keys: ``N``, ``stage``, ``psi``, ``by_category`` (ledger), ``ledger``,
    ``tracemalloc``, ``formula`` (model states, bytes), ``step_peak`` (tracemalloc
    peak during a step: activations and transients), ``sent`` and
    ``sent_formula`` (bytes per rank per step)."""
    out = []
    for n in sorted(results):
        for stage in sorted(results[n]):
            r = results[n][stage]
            psi, ranks = r["psi"], r["ranks"]
            top = max(ranks, key=lambda x: sum(x["ledger"].values()))
            out.append({"N": n, "stage": stage, "psi": psi, "by_category": top["ledger"],
                        "ledger": sum(top["ledger"].values()),
                        "tracemalloc": max(x["tracemalloc_bytes"] for x in ranks),
                        "formula": zero_model_state_bytes(psi, n, stage, K),
                        "step_peak": max(x["step_peak_bytes"] for x in ranks),
                        "sent": max(x["bytes_sent_per_step"] for x in ranks),
                        "sent_formula": zero_comm_bytes_per_rank(psi, n, stage, 2)})
    return out


def _grouped(ax: Any, table: list[dict[str, Any]], stacked: bool) -> None:
    ns = sorted({r["N"] for r in table})
    stages = sorted({r["stage"] for r in table})
    width = 0.8 / len(stages)
    for r in table:
        x = ns.index(r["N"]) + (stages.index(r["stage"]) - (len(stages) - 1) / 2) * width
        if stacked:
            bottom = 0.0
            for c in CATEGORIES:
                v = r["by_category"][c] / 1e3
                ax.bar(x, v, width * 0.9, bottom=bottom, color=COLORS[c],
                       label=c if (r is table[0]) else None)
                bottom += v
            ax.hlines(r["formula"] / 1e3, x - width * 0.45, x + width * 0.45, colors="black",
                      label="paper's formula" if r is table[0] else None)
        else:
            ax.bar(x, r["sent"] / 1e3, width * 0.9, color=f"C{r['stage']}",
                   label=f"stage {r['stage']} {STAGE_NAMES[r['stage']]}"
                   if r["N"] == ns[-1] else None)
            ax.hlines(r["sent_formula"] / 1e3, x - width * 0.45, x + width * 0.45,
                      colors="black", label="paper's formula" if r is table[-1] else None)
        ax.text(x, 0, str(r["stage"]), ha="center", va="bottom", fontsize=7, color="white")
    ax.set_xticks(range(len(ns)), [f"N = {n}" for n in ns])


def memory_bars(results: Results, K: int = 12) -> Figure:
    """Model-state kB per rank, stacked by category, for each N and stage (0-3 left
    to right, numbered at the foot of each bar); black ticks: the paper's formula."""
    table = rows(results, K)
    fig, ax = plt.subplots(figsize=(8, 4))
    _grouped(ax, table, stacked=True)
    ax.set_ylim(0, ax.get_ylim()[1] * 1.15)  # room for the legend
    ax.set_ylabel("model states per rank (kB, measured)")
    ax.set_title(f"ZeRO stages 0-3, mixed precision, Ψ = {table[0]['psi']:,}: "
                 "bytes held by the busiest rank")
    ax.legend(fontsize=8, loc="upper center", ncol=4)
    fig.tight_layout()
    return fig


def traffic_bars(results: Results) -> Figure:
    """kB each rank sends per training step, per stage and N; black ticks: 2Ψ(N-1)/N
    (stages 0-2) and 3Ψ(N-1)/N (stage 3) 16-bit elements."""
    table = rows(results)
    fig, ax = plt.subplots(figsize=(8, 4))
    _grouped(ax, table, stacked=False)
    ax.set_ylim(0, ax.get_ylim()[1] * 1.15)
    ax.set_ylabel("bytes sent per rank per step (kB, counted)")
    ax.set_title(f"ZeRO traffic, Ψ = {table[0]['psi']:,} 16-bit parameters")
    ax.legend(fontsize=8, loc="upper left", ncol=3)
    fig.tight_layout()
    return fig
