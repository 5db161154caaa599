"""Figures for tensor and sequence parallelism: slicing, f and g, bytes and activations.

EN tensor parallelism · RU тензорный параллелизм · ZH 张量并行

Megatron-LM (Shoeybi et al. 2019, arXiv 1909.08053, Fig. 3): the MLP's first
weight W1 (h x d_ff) is cut by **columns**, the second W2 (d_ff x h) by
**rows**, so GELU stays local and one all-reduce (g) sums the row-parallel
outputs; f (identity forward, all-reduce backward) sits before the block.
:func:`ownership` is who holds which entry (rank r: columns / rows
r·d_ff/t … (r+1)·d_ff/t, the slices :mod:`minipar.parallel.tensor_parallel.shards`
cuts); :func:`slicing` draws it, :func:`fg_diagram` places f and g.

:func:`traffic_bars` sets counted bytes next to a formula (input: rows of
``{"what", "measured", "formula"}``); :func:`activation_lines` draws the
activation memory per block measured by
:func:`minipar.parallel.tensor_parallel.measure.activation_bytes_per_block` against
minipar's formula and Korthikanti et al.'s (2022, arXiv 2205.05198, Table 2):
sbh(34 + 5as/h), sbh(10 + 24/t + 5as/(ht)), sbh(34/t + 5as/(ht)).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

import matplotlib.pyplot as plt
import numpy as np
from matplotlib.colors import ListedColormap
from matplotlib.figure import Figure
from matplotlib.patches import FancyBboxPatch

RANK_COLORS = ("#4c72b0", "#dd8452", "#55a868", "#c44e52", "#8172b3", "#937860")
MODE_COLORS = {"none": "#555555", "tp": "#4c72b0", "tp+sp": "#55a868"}


def ownership(rows: int, cols: int, t: int, by: str) -> np.ndarray:
    """(rows, cols) array of the rank that holds each entry: ``by`` "columns" or "rows"."""
    if by not in ("columns", "rows"):
        raise ValueError(f"by must be 'columns' or 'rows', got {by!r}")
    n = cols if by == "columns" else rows
    if t < 1 or n % t:
        raise ValueError(f"{n} {by} do not split evenly over t = {t} ranks")
    owner = np.repeat(np.arange(t), n // t)
    return np.tile(owner, (rows, 1)) if by == "columns" else np.tile(owner[:, None], (1, cols))


def _cmap(t: int) -> ListedColormap:
    return ListedColormap([RANK_COLORS[i % len(RANK_COLORS)] for i in range(t)])


def slicing(t: int = 2, h: int = 4, d_ff: int = 8) -> Figure:
    """W1 (h x d_ff) by columns and W2 (d_ff x h) by rows, coloured by the rank that holds them."""
    fig, (a1, a2) = plt.subplots(1, 2, figsize=(9, 3.6),
                                 gridspec_kw={"width_ratios": [d_ff, h]})
    for ax, (r, c, by, name) in zip((a1, a2), ((h, d_ff, "columns", "W1"),
                                               (d_ff, h, "rows", "W2"))):
        own = ownership(r, c, t, by)
        ax.imshow(own, cmap=_cmap(t), vmin=-0.5, vmax=t - 0.5)
        ax.set_xticks(np.arange(-0.5, c, 1), minor=True)
        ax.set_yticks(np.arange(-0.5, r, 1), minor=True)
        ax.grid(which="minor", color="white", linewidth=1)
        ax.tick_params(which="both", length=0, labelbottom=False, labelleft=False)
        kind = "column-parallel" if by == "columns" else "row-parallel"
        ax.set_title(f"{name} ({r} x {c}): {kind}")
        for q in range(t):
            ys, xs = np.nonzero(own == q)
            ax.text(xs.mean(), ys.mean(), f"rank {q}", ha="center", va="center",
                    color="white", fontsize=9, fontweight="bold")
    a1.set_xlabel("x W1_r: whole features, GELU local")
    a2.set_xlabel("GELU(a_r) W2_r: partial sums → g")
    fig.suptitle(f"Megatron MLP on t = {t} ranks: W1 by columns, W2 by rows")
    fig.tight_layout()
    return fig


def _box(ax: Any, x: float, y: float, text: str, color: str, w: float = 1.5) -> None:
    ax.add_patch(FancyBboxPatch((x - w / 2, y - 0.3), w, 0.6, boxstyle="round,pad=0.05",
                                facecolor=color, edgecolor="black", alpha=0.9))
    ax.text(x, y, text, ha="center", va="center", fontsize=9)


def _arrow(ax: Any, x0: float, y0: float, x1: float, y1: float) -> None:
    ax.annotate("", xy=(x1, y1), xytext=(x0, y0), arrowprops={"arrowstyle": "->", "lw": 1})


def fg_diagram(t: int = 2) -> Figure:
    """Where f and g sit in the Megatron MLP (and attention): one lane per rank."""
    fig, ax = plt.subplots(figsize=(10, 1.2 + 1.1 * t))
    ys = [(t - 1) / 2 - i for i in range(t)]
    _box(ax, 0, 0, "x\n(every rank)", "#eeeeee", 1.2)
    _box(ax, 1.6, 0, "f", "#f2d675", 0.6)
    _box(ax, 7.4, 0, "g", "#f2d675", 0.6)
    _box(ax, 9.0, 0, "y = Σ + b2", "#eeeeee", 1.3)
    _arrow(ax, 0.6, 0, 1.3, 0)
    for i, y in enumerate(ys):
        col = RANK_COLORS[i % len(RANK_COLORS)]
        _arrow(ax, 1.9, 0, 2.4, y)
        _box(ax, 3.2, y, f"x W1_{i} + b1_{i}", col)
        _box(ax, 4.9, y, "GELU", col, 1.0)
        _box(ax, 6.3, y, f"· W2_{i}", col, 1.1)
        _arrow(ax, 3.95, y, 4.4, y)
        _arrow(ax, 5.4, y, 5.75, y)
        _arrow(ax, 6.85, y, 7.1, 0)
    _arrow(ax, 7.7, 0, 8.35, 0)
    low = min(ys) - 0.75
    ax.text(1.6, low, "f: forward identity\nbackward all-reduce", ha="center", va="top",
            fontsize=8)
    ax.text(7.4, low, "g: forward all-reduce\nbackward identity", ha="center", va="top",
            fontsize=8)
    ax.set_xlim(-0.8, 9.8)
    ax.set_ylim(low - 0.7, max(ys) + 0.6)
    ax.axis("off")
    ax.set_title(f"one all-reduce forward (g), one backward (f), per MLP; t = {t}")
    fig.tight_layout()
    return fig


def traffic_bars(rows: Iterable[Mapping[str, Any]], title: str = "bytes sent per rank") -> Figure:
    """Counted bytes (bars) next to the formula (black ticks), one bar per row's ``what``."""
    rows = list(rows)
    fig, ax = plt.subplots(figsize=(max(5.0, 1.3 * len(rows)), 3.4))
    x = np.arange(len(rows))
    ax.bar(x, [r["measured"] for r in rows], color=RANK_COLORS[0], label="counted")
    ax.scatter(x, [r["formula"] for r in rows], marker="_", s=900, color="black", zorder=3,
               label="formula")
    ax.set_xticks(x, [r["what"] for r in rows], fontsize=8)
    ax.set_ylabel("bytes")
    ax.set_title(title)
    ax.legend(fontsize=8, loc="lower right")
    fig.tight_layout()
    return fig


def activation_lines(results: Iterable[Mapping[str, Any]]) -> Figure:
    """Activation bytes per block vs t: measured (ledger ●, tracemalloc ×), minipar's formula
    (solid) and the paper's with dropout (dotted), one colour per mode (none, tp, tp+sp)."""
    results = list(results)
    fig, ax = plt.subplots(figsize=(7, 4.6))
    for mode in ("none", "tp", "tp+sp"):
        rs = sorted((r for r in results if r["mode"] == mode), key=lambda r: r["t"])
        if not rs:
            continue
        ts, col = [r["t"] for r in rs], MODE_COLORS[mode]
        if mode == "none":  # the serial block: one value, drawn across every t
            span = sorted({r["t"] for r in results})
            ax.hlines(rs[0]["formula"], span[0], span[-1], color=col, label="none: minipar")
            ax.hlines(rs[0]["paper"], span[0], span[-1], color=col, linestyles=":",
                      label="none: paper")
        else:
            ax.plot(ts, [r["formula"] for r in rs], color=col, label=f"{mode}: minipar")
            ax.plot(ts, [r["paper"] for r in rs], color=col, linestyle=":",
                    label=f"{mode}: paper")
        ax.scatter(ts, [r["ledger"] for r in rs], color=col, marker="o", zorder=3)
        ax.scatter(ts, [r["tracemalloc"] for r in rs], color=col, marker="x", s=60, zorder=3)
    ax.set_xscale("log", base=2)
    ax.set_xticks(sorted({r["t"] for r in results}), [str(t) for t in sorted(
        {r["t"] for r in results})])
    ax.set_xlabel("t (tensor-parallel ranks)")
    ax.set_ylabel("activation bytes per block, per rank")
    ax.set_ylim(bottom=0)
    ax.set_title("activations one block keeps: ● ledger, × tracemalloc, lines formulas")
    ax.legend(fontsize=7, ncol=3, loc="upper center", bbox_to_anchor=(0.5, -0.16))
    fig.tight_layout()
    return fig
