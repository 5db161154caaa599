"""The process grid drawn: which ranks share which axis (dp x pp x cp x tp).

EN process grid · RU сетка процессов · ZH 进程网格

Megatron-LM's order (Narayanan et al. 2021, arXiv 2104.04473, §3), as
:class:`minipar.comm.topology.Layout` computes it::

    rank = ((d·pp + p)·cp + c)·tp + t

* :func:`groups` -- every group of one axis: the ranks that differ only in
  that axis's coordinate (the groups partition the world);
* :func:`positions` -- where each rank sits in the drawing: a row per
  (dp replica, cp slice), a block of tp columns per pipeline stage;
* :func:`draw_grid` / :func:`grid_figure` -- each rank a box with its
  coordinates; tp groups joined by thick lines (adjacent ranks), pipeline
  neighbours by arrows (stage p -> p + 1), cp groups by dotted lines, dp
  groups by dashed lines down a column.  ``me`` highlights one rank's
  groups, e.g. rank 5 of dp 2 x pp 2 x tp 2: tp [4, 5], pp [5, 7], dp [1, 5];
* :func:`traffic_by_axis` -- one step's bytes per rank and axis, counted by
  ``minipar run hybrid``, next to the exact formula;
* :func:`memory_by_layout` -- model states and activations per rank for
  several layouts of the same ranks (the planner's
  :func:`~minipar.plan.layouts.layout_memory`), a run's measurement as a marker.

Plain data in, a Figure out (never shown), so it works headless.
"""

from __future__ import annotations

from collections.abc import Sequence
from itertools import pairwise
from typing import Any

import matplotlib.pyplot as plt
from matplotlib.figure import Figure
from matplotlib.lines import Line2D
from matplotlib.patches import FancyBboxPatch

from minipar.comm.topology import AXES, Layout

#: how each axis's groups are drawn: colour, line style, width
STYLE = {"tp": ("tab:blue", "-", 4.0), "cp": ("tab:green", ":", 2.5),
         "pp": ("tab:orange", "-", 1.8), "dp": ("tab:purple", "--", 1.5)}
STAGE_GAP, ROW_GAP = 0.7, 0.35


def groups(layout: Layout, axis: str) -> list[list[int]]:
    """Every group of ``axis`` (by coordinate inside, by first rank across)."""
    seen: dict[int, list[int]] = {}
    for r in range(layout.world):
        g = layout.ranks(r, axis)
        seen.setdefault(g[0], g)
    return [seen[k] for k in sorted(seen)]


def positions(layout: Layout) -> dict[int, tuple[float, float]]:
    """(x, y) of each rank: x = its stage's block of tp columns, y = its (dp, cp) row (top 0)."""
    out = {}
    for r in range(layout.world):
        co = layout.coords(r)
        x = co["pp"] * (layout.tp + STAGE_GAP) + co["tp"]
        y = co["dp"] * (layout.cp + ROW_GAP) + co["cp"]
        out[r] = (x, -y)
    return out


def _link(ax: Any, a: tuple[float, float], b: tuple[float, float], axis: str,
          alpha: float) -> None:
    colour, style, width = STYLE[axis]
    if axis == "pp":  # an arrow, bent so it passes over the tp boxes between the stages
        ax.annotate("", xy=b, xytext=a, arrowprops={
            "arrowstyle": "-|>", "color": colour, "lw": width, "alpha": alpha,
            "connectionstyle": "arc3,rad=-0.35", "shrinkA": 14, "shrinkB": 14})
        return
    ax.plot([a[0], b[0]], [a[1], b[1]], style, color=colour, lw=width, alpha=alpha,
            solid_capstyle="round", zorder=1)


def draw_grid(layout: Layout, ax: Any = None, me: int | None = None) -> Figure:
    """One grid on ``ax`` (a new figure if None); ``me``: a rank whose groups stand out."""
    if ax is None:
        _, ax = plt.subplots(figsize=(1.3 * (layout.pp * (layout.tp + 1)) + 1,
                                        1.1 * layout.dp * layout.cp + 1.2))
    pos = positions(layout)
    mine = {a: set(layout.ranks(me, a)) for a in AXES} if me is not None else {}
    for axis in ("dp", "cp", "pp", "tp"):  # tp last: on top
        for g in groups(layout, axis):
            faint = me is not None and me not in g
            for a, b in pairwise(g):
                _link(ax, pos[a], pos[b], axis, 0.25 if faint else 0.9)
    for r, (x, y) in pos.items():
        co = layout.coords(r)
        edge = "black" if r == me else "0.4"
        face = "gold" if r == me else ("0.93" if me is None or not any(
            r in s for s in mine.values()) else "lightyellow")
        ax.add_patch(FancyBboxPatch((x - 0.32, y - 0.3), 0.64, 0.6,
                                    boxstyle="round,pad=0.02", fc=face, ec=edge,
                                    lw=2.0 if r == me else 1.0, zorder=2))
        ax.text(x, y + 0.08, str(r), ha="center", va="center", fontsize=11,
                fontweight="bold", zorder=3)
        ax.text(x, y - 0.16, f"{co['dp']}{co['pp']}{co['cp']}{co['tp']}", ha="center",
                va="center", fontsize=6.5, color="0.3", zorder=3)
    xs, ys = [p[0] for p in pos.values()], [p[1] for p in pos.values()]
    ax.set_xlim(min(xs) - 0.6, max(xs) + 0.6)
    ax.set_ylim(min(ys) - 0.6, max(ys) + 0.75)
    ax.set_aspect("equal")
    ax.axis("off")
    title = f"dp {layout.dp} x pp {layout.pp} x cp {layout.cp} x tp {layout.tp}"
    if me is not None:
        title += "\nrank " + str(me) + ": " + ", ".join(
            f"{a} {layout.ranks(me, a)}" for a in AXES if layout.size(a) > 1)
    ax.set_title(title, fontsize=9)
    return ax.figure


def _extent(layout: Layout) -> tuple[float, float]:
    """Width and height of one grid's drawing, in data units (its axes' limits)."""
    return (layout.pp * (layout.tp + STAGE_GAP) - STAGE_GAP + 1.2,
            layout.dp * (layout.cp + ROW_GAP) - ROW_GAP + 1.35)


def grid_figure(layouts: Sequence[Layout], me: int | None = None) -> Figure:
    """Several grids of the same ranks side by side, at one scale, with one legend."""
    ext = [_extent(lay) for lay in layouts]
    unit = 0.62  # inches per data unit
    width = max(6.0, unit * sum(w for w, _ in ext) + 0.4 * len(layouts))
    height = unit * max(h for _, h in ext) + 1.6
    fig, axes = plt.subplots(1, len(layouts), figsize=(width, height),
                             gridspec_kw={"width_ratios": [w for w, _ in ext]}, squeeze=False)
    for ax, lay in zip(axes[0], layouts, strict=True):
        draw_grid(lay, ax, me)
    handles = [Line2D([], [], color=STYLE[a][0], ls=STYLE[a][1], lw=STYLE[a][2],
                      label={"tp": "tp group (adjacent ranks)", "cp": "cp group",
                             "pp": "pp: stage p -> p+1", "dp": "dp group (a column)"}[a])
               for a in ("tp", "cp", "pp", "dp")]
    fig.legend(handles=handles, loc="lower center", ncol=4, fontsize=8, frameon=False)
    fig.suptitle("each box: the rank, then its coordinates d p c t", fontsize=9)
    fig.tight_layout(rect=(0, 0.1, 1, 1))
    return fig


def traffic_by_axis(counted: Sequence[dict[str, float]], formula: Sequence[dict[str, float]],
                    title: str = "") -> Figure:
    """Bytes each rank sent on each grid axis in one step: bars counted, black ticks the
    exact formula (``minipar run hybrid``'s ``bytes_by_axis_per_rank`` and
    ``bytes_formula_by_axis_per_rank``)."""
    axes_used = [a for a in counted[0] if any(c.get(a) for c in counted)]
    fig, ax = plt.subplots(figsize=(1.1 * len(counted) + 2.5, 3.2))
    width = 0.8 / max(1, len(axes_used))
    colour = {"tp": STYLE["tp"][0], "pp_p2p": STYLE["pp"][0], "cp": STYLE["cp"][0],
              "dp": STYLE["dp"][0]}
    for k, a in enumerate(axes_used):
        xs = [r - 0.4 + width * (k + 0.5) for r in range(len(counted))]
        ax.bar(xs, [c.get(a, 0) / 1e3 for c in counted], width, label=a,
               color=colour.get(a, f"C{k}"))
        ax.scatter(xs, [(f.get(a) or 0) / 1e3 for f in formula], marker="_", s=220,
                   color="black", zorder=3, label="formula" if k == 0 else None)
    ax.set_xticks(range(len(counted)), [f"rank {r}" for r in range(len(counted))], fontsize=8)
    ax.set_ylabel("kB sent per step")
    ax.set_title(title or "bytes sent per rank and axis, one step: counted (bars), formula (—)",
                 fontsize=9)
    ax.set_ylim(top=1.3 * ax.get_ylim()[1])  # room for the legend above the bars
    ax.legend(fontsize=8, ncol=len(axes_used) + 1, loc="upper center")
    fig.tight_layout()
    return fig


def memory_by_layout(rows: Sequence[dict[str, Any]], unit: float = 1e3,
                     unit_name: str = "kB") -> Figure:
    """Memory per rank of several layouts of the same ranks: model states and activations
    stacked (``label``, ``states``, ``activations``; optional ``measured``: a marker)."""
    fig, ax = plt.subplots(figsize=(0.9 * len(rows) + 2.5, 3.4))
    xs = range(len(rows))
    states = [r["states"] / unit for r in rows]
    acts = [r["activations"] / unit for r in rows]
    ax.bar(xs, states, color="tab:blue", label="model states (params, grads, AdamW m, v)")
    ax.bar(xs, acts, bottom=states, color="tab:orange", label="activations (stage 0, in flight)")
    measured = [(x, r["measured"] / unit) for x, r in zip(xs, rows, strict=True)
                if r.get("measured") is not None]
    if measured:
        ax.scatter(*zip(*measured, strict=True), marker="D", color="black", zorder=3,
                   label="measured by a run (states + activation peak)")
    ax.set_xticks(list(xs), [r["label"] for r in rows], fontsize=8, rotation=30, ha="right")
    ax.set_ylabel(f"{unit_name} per rank (the fullest)")
    ax.legend(fontsize=8)
    fig.tight_layout()
    return fig
