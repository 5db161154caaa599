"""Figures for the serial model: parameters, memory by category, training curves, MoE load.

EN serial model · RU последовательная модель · ZH 串行模型

Every function takes data the package computed (``GPT.param_shapes()``,
``memory.Ledger``, loss lists from ``minipar.train``, ``GPT.moe_stats``)
and returns a matplotlib ``Figure`` (or, for the parameter table, text).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

import matplotlib.pyplot as plt
import numpy as np
from matplotlib.figure import Figure

from minipar.memory import CATEGORIES


def parameter_table(shapes: Mapping[str, tuple[int, ...]], max_rows: int | None = None) -> str:
    """A plain-text table: name, shape, element count, share of Ψ; total at the end."""
    total = sum(math.prod(s) for s in shapes.values())
    width = max(len(n) for n in shapes)
    lines = [f"{'name':<{width}}  {'shape':>14}  {'count':>10}  {'share':>6}"]
    items = list(shapes.items())
    shown = items if max_rows is None or len(items) <= max_rows else items[:max_rows]
    for name, s in shown:
        n = math.prod(s)
        lines.append(f"{name:<{width}}  {tuple(s)!s:>14}  {n:>10,}  {n / total:6.1%}")
    if len(shown) < len(items):
        lines.append(f"… {len(items) - len(shown)} more")
    lines.append(f"{'total Ψ':<{width}}  {'':>14}  {total:>10,}  {1:6.0%}")
    return "\n".join(lines)


def memory_by_category(ledgers: Mapping[str, Mapping[str, int]], unit: float = 2**20,
                       title: str = "Bytes held by one rank") -> Figure:
    """Stacked bars, one per setting (e.g. precision), of bytes per category (MiB)."""
    fig, ax = plt.subplots(figsize=(6.5, 3.6))
    names = list(ledgers)
    bottom = np.zeros(len(names))
    for cat in CATEGORIES:
        vals = np.array([ledgers[n].get(cat, 0) / unit for n in names])
        ax.bar(names, vals, bottom=bottom, label=cat)
        bottom += vals
    for i, b in enumerate(bottom):
        ax.text(i, b, f"{b:.2f}", ha="center", va="bottom", fontsize=8)
    ax.set_ylabel("MiB" if unit == 2**20 else f"x {unit:g} bytes")
    ax.set_title(title)
    ax.legend(fontsize=8)
    fig.tight_layout()
    return fig


def activations_per_piece(rows: Sequence[tuple[str, int]], unit: float = 2**20) -> Figure:
    """Horizontal bars: bytes of activations saved by each piece (embed, block i, head)."""
    fig, ax = plt.subplots(figsize=(6.0, 0.4 * len(rows) + 1.2))
    names = [r[0] for r in rows]
    vals = [r[1] / unit for r in rows]
    ax.barh(names, vals, color="tab:red")
    ax.invert_yaxis()
    ax.set_xlabel("MiB saved for the backward")
    ax.set_title("Activations by piece (measured)")
    fig.tight_layout()
    return fig


def training_curves(curves: Mapping[str, Sequence[float]], best: float | None = None,
                    title: str = "Training loss") -> Figure:
    """Loss against step for one or more runs; ``best`` draws the lowest achievable loss."""
    fig, ax = plt.subplots(figsize=(6.5, 3.6))
    for name, losses in curves.items():
        ax.plot(np.arange(1, len(losses) + 1), losses, label=name, lw=1.2)
    if best is not None:
        ax.axhline(best, color="k", ls=":", lw=1, label=f"best possible {best:.3f}")
    ax.set_xlabel("step")
    ax.set_ylabel("loss (nats)")
    ax.set_yscale("log")
    ax.set_title(title)
    ax.legend(fontsize=8)
    fig.tight_layout()
    return fig


def train_and_validation(losses: Sequence[float], validation: Mapping[int, float],
                         start: int = 0, floor: float | None = None,
                         floor_label: str = "best possible") -> Figure:
    """A run's training loss per step (from ``start``, a resumed run's first step) and its
    validation loss at the steps it was measured (``{step: loss}``, after that step);
    ``floor``: a reference line (the unigram entropy of a text, the task's best loss)."""
    fig, ax = plt.subplots(figsize=(6.5, 3.6))
    steps = np.arange(start + 1, start + len(losses) + 1)
    ax.plot(steps, losses, lw=1.0, label="training (one batch per step)")
    if validation:
        ks = sorted(validation)
        ax.plot(ks, [validation[k] for k in ks], "o-", ms=4, lw=1.4, label="validation")
    if floor is not None:
        ax.axhline(floor, color="k", ls=":", lw=1, label=f"{floor_label} {floor:.3f}")
    ax.set_xlabel("step")
    ax.set_ylabel("loss (nats per token)")
    ax.set_title("Training and validation loss")
    ax.legend(fontsize=8)
    fig.tight_layout()
    return fig


def expert_load(stats: Sequence[Mapping[str, Any]]
                | Mapping[str, Sequence[Mapping[str, Any]]]) -> Figure:
    """Per MoE block: tokens whose first choice is each expert, assignments kept, capacity.

    ``stats`` is ``GPT.moe_stats(cache)`` (one row of panels), or a mapping
    ``label -> moe_stats`` to compare states of the same model, e.g.
    ``{"at initialisation": s0, "after training": s1}``: one row per label, one
    column per block, a shared token axis so the bars compare by height.
    """
    runs = dict(stats) if isinstance(stats, Mapping) else {"": stats}
    if not runs or any(not v for v in runs.values()):
        raise ValueError("no MoE blocks in these statistics (n_experts = 0?)")
    blocks = {len(v) for v in runs.values()}
    if len(blocks) != 1:
        raise ValueError(f"every state must have the same MoE blocks; got {sorted(blocks)} blocks")
    cols = blocks.pop()
    shape = (1, len(runs)) if cols == 1 else (len(runs), cols)  # one block: states side by side
    fig, axes = plt.subplots(*shape, figsize=(3.6 * shape[1] + 0.4, 3.0 * shape[0] + 0.6),
                             squeeze=False, sharey=True)
    panels = [(label, s) for label, run in runs.items() for s in run]  # state-major, as the axes
    for ax, (label, s) in zip(axes.flat, panels):
        e = np.arange(len(s["routed"]))
        ax.bar(e - 0.2, np.asarray(s["routed"]), width=0.4, color="C0", label="first choice")
        ax.bar(e + 0.2, np.asarray(s["tokens_per_expert"]), width=0.4, color="C1",
               label="kept (all choices)")
        ax.axhline(s["capacity"], color="k", ls="--", lw=1, label=f"capacity {s['capacity']}")
        ax.set_xticks(e)
        ax.set_xlabel("expert")
        head = f"{label}: " if label else ""
        ax.set_title(f"{head}block {s['block']}, {s['dropped']} dropped", fontsize=9)
    for row in axes:
        row[0].set_ylabel("tokens")
    fig.legend(*axes[0][0].get_legend_handles_labels(), loc="upper center", ncol=3, fontsize=8,
               frameon=False)
    fig.tight_layout(rect=(0, 0, 1, 1 - 0.35 / (3.0 * shape[0] + 0.6)))
    return fig
