"""Figures for data parallelism and the parameter server.

EN data parallelism · RU параллелизм по данным · ZH 数据并行

* :func:`plot_timeline` — one step of DDP per rank, measured: the backward
  pieces (head, blocks L-1 … 0, embedding) on one lane, the bucket
  all-reduces on the lane below.  With overlap, a bucket's bar starts as soon
  as the piece that produced its last gradient ends (Li et al. 2020, arXiv
  2006.15704, Fig. 3).
* :func:`plot_timelines` — several such steps on one time axis, one panel
  each: the measured step next to the same step rebuilt with a link of its
  own (:mod:`minipar.parallel.data_parallel.measure`, α-β cost per bucket).
* :func:`plot_link_bytes` — bytes per step through the busiest link: the
  parameter server's (W x S each way) against a worker's (S) and a ring
  rank's (2(W-1)/W x S), measured, with the formulas as markers.
* :func:`plot_convergence` — loss per step of several runs (serial, sync,
  async with staleness s).

All take plain data (the ``minipar run ... --json`` summaries' fields) and
return a Figure, never shown, so they work headless.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import matplotlib.pyplot as plt
import numpy as np
from matplotlib.figure import Figure


def _draw_timeline(ax: Any, timelines: Sequence[Mapping[str, Any]], colours: dict[str, Any],
                   seen: set[str]) -> None:
    """Two lanes per rank on ``ax``: compute pieces above, bucket all-reduces below (ms)."""
    n = len(timelines)
    n_buckets = max((len(tl["comm"]) for tl in timelines), default=0)
    yticks, ylabels = [], []
    for r, tl in enumerate(timelines):
        y = 2 * (n - 1 - r)
        for piece, t0, t1 in tl["compute"]:
            ax.barh(y + 0.5, (t1 - t0) * 1e3, left=t0 * 1e3, height=0.8, color=colours[piece],
                    edgecolor="white", label=None if piece in seen else piece)
            seen.add(piece)
        for b, t0, t1 in tl["comm"]:
            h = 0.8 / max(1, n_buckets)
            ax.barh(y - 0.5 + 0.4 - h * (b + 0.5), max((t1 - t0) * 1e3, 0.01), left=t0 * 1e3,
                    height=h, color=plt.cm.Greys(0.35 + 0.5 * b / max(1, n_buckets)),
                    label=None if "all-reduce" in seen else "bucket all-reduce")
            seen.add("all-reduce")
        yticks += [y + 0.5, y - 0.5]
        ylabels += [f"rank {tl.get('rank', r)} compute", f"rank {tl.get('rank', r)} buckets"]
    ax.set_yticks(yticks, ylabels, fontsize=8)


def _colours(timelines: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    pieces = list(dict.fromkeys(p for tl in timelines for p, _, _ in tl["compute"]))
    return {p: plt.cm.tab10(i % 10) for i, p in enumerate(pieces)}


def plot_timeline(timelines: Sequence[Mapping[str, Any]], title: str = "") -> Figure:
    """Per rank: compute intervals (``timeline["compute"]`` = [(piece, t0, t1)]) and bucket
    all-reduces (``timeline["comm"]`` = [(bucket, t0, t1)]), seconds, drawn in ms."""
    if not timelines:
        raise ValueError("no timelines to draw")
    n = len(timelines)
    fig, ax = plt.subplots(figsize=(9, 0.9 + 1.1 * n))
    _draw_timeline(ax, timelines, _colours(timelines), set())
    ax.set_xlabel("time in the step (ms)")
    ax.legend(fontsize=7, ncol=4, loc="upper center", bbox_to_anchor=(0.5, -0.25 if n > 1 else -0.4))
    ax.set_title(title or "DDP step: backward pieces and bucket all-reduces (measured)", fontsize=10)
    fig.tight_layout()
    return fig


def plot_timelines(panels: Mapping[str, Sequence[Mapping[str, Any]]]) -> Figure:
    """Several steps one above the other on one time axis, each panel titled by its key:
    e.g. a measured step next to the same step rebuilt with a separate link
    (:func:`minipar.parallel.data_parallel.measure.separate_link`).  A timeline may carry ``step_s``
    (the step's length, seconds): it is drawn as a dashed line."""
    if not panels or any(not tls for tls in panels.values()):
        raise ValueError("every panel needs at least one timeline")
    every = [tl for tls in panels.values() for tl in tls]
    colours, seen = _colours(every), set()
    heights = [0.6 + 1.0 * len(tls) for tls in panels.values()]
    fig, axes = plt.subplots(len(panels), 1, sharex=True, squeeze=False,
                             figsize=(9, 1.0 + sum(heights)),
                             gridspec_kw={"height_ratios": heights})
    for ax, (name, tls) in zip(axes[:, 0], panels.items()):
        _draw_timeline(ax, tls, colours, seen)
        for tl in tls:
            if "step_s" in tl:
                ax.axvline(tl["step_s"] * 1e3, color="black", linestyle="--", linewidth=0.8)
        ax.set_title(name, fontsize=9, loc="left")
    axes[-1, 0].set_xlabel("time in the step (ms)")
    handles, labels = axes[0, 0].get_legend_handles_labels()
    for ax in axes[1:, 0]:
        h, lab = ax.get_legend_handles_labels()
        handles, labels = handles + h, labels + lab
    fig.legend(handles, labels, fontsize=7, ncol=5, loc="lower center")
    fig.tight_layout(rect=(0, 0.09, 1, 1))
    return fig


def plot_link_bytes(workers: Sequence[int], server: Sequence[float], worker: Sequence[float],
                    ring: Sequence[float], S: float) -> Figure:
    """Bytes per step (each way) through the parameter server's link, one worker's and one ring
    rank, for each worker count W (measured bars), with W x S, S and 2(W-1)/W x S marked."""
    if not (len(workers) == len(server) == len(worker) == len(ring)):
        raise ValueError("workers, server, worker and ring must have the same length")
    fig, ax = plt.subplots(figsize=(7.5, 3.4))
    x = np.arange(len(workers))
    w = 0.27
    for j, (vals, name) in enumerate(((server, "parameter server"), (worker, "one PS worker"),
                                      (ring, "one ring rank (DP)"))):
        ax.bar(x + (j - 1) * w, np.asarray(vals) / S, w, label=f"{name} (measured)", color=f"C{j}")
    W = np.asarray(workers, dtype=float)
    ax.scatter(x - w, W, marker="_", s=400, color="black", label="formulas: W·S, S, 2(W−1)/W·S")
    ax.scatter(x, np.ones_like(W), marker="_", s=400, color="black")
    ax.scatter(x + w, 2 * (W - 1) / W, marker="_", s=400, color="black")
    ax.set_xticks(x, [f"W = {k}" for k in workers])
    ax.set_ylabel("bytes per step, each way (× S)")
    ax.set_title("The server's link carries W·S; a ring rank's stays below 2S", fontsize=10)
    ax.legend(fontsize=8)
    fig.tight_layout()
    return fig


def plot_convergence(curves: Mapping[str, Sequence[float]], floor: float | None = None) -> Figure:
    """Loss against step, one line per run; ``floor`` (e.g. the best possible loss) dashed."""
    if not curves:
        raise ValueError("no curves to draw")
    fig, ax = plt.subplots(figsize=(7, 3.4))
    for i, (name, losses) in enumerate(curves.items()):
        ax.plot(range(len(losses)), losses, label=name, color=f"C{i}",
                linestyle="--" if "serial" in name else "-", linewidth=1.4)
    if floor is not None:
        ax.axhline(floor, color="grey", linestyle=":", label="best possible")
    ax.set_xlabel("step")
    ax.set_ylabel("training loss")
    ax.legend(fontsize=8)
    ax.grid(alpha=0.3)
    fig.tight_layout()
    return fig
