"""Figures for the ring all-reduce: the chunk schedule, bytes per rank, bandwidth.

EN ring all-reduce · RU кольцевой all-reduce · ZH 环形全归约

``ring_steps(n)`` is the textbook schedule (Patarasuk & Yuan 2009) as data:
the buffer is cut into ``n`` chunks (``numpy.array_split`` order); in the
reduce-scatter phase, at step ``k`` rank ``r`` sends chunk ``(r - 1 - k) % n``
to rank ``(r + 1) % n``, which adds it to its own; after ``n - 1`` steps rank
``r`` holds the full sum of chunk ``r`` (its own chunk, as ``reduce_scatter``
returns it).  In the all-gather phase, at step ``k`` rank ``r`` sends chunk
``(r - k) % n`` onward and the receiver overwrites its copy.  This is the
schedule :mod:`minipar.collectives.ring` documents and runs;
``tests/test_viz_ring.py`` checks that it sends only to the right neighbour,
that every rank ends with all ``n`` contributions, and that the bytes each
rank sends equal :func:`minipar.collectives.ring_allreduce_bytes_sent`.
``ring_state(n)`` replays that schedule and
counts, for every rank and chunk, how many ranks' contributions it holds:
the figure shows the counts climbing to ``n`` everywhere.

**Two conventions, one algorithm.**  ``shift`` relabels the chunks: with
``shift=s`` every chunk index above is ``+ s``, and rank ``r`` ends the
reduce-scatter holding the full sum of chunk ``(r + s) % n``.  ``shift=0``
is minipar's (a stand-alone ``reduce_scatter`` must hand rank r *its* chunk r,
as ``MPI_Reduce_scatter`` and ZeRO's shard r do); ``shift=1`` is the
exercise's and Gibiansky's (rank r starts by sending its own chunk r, so it
finishes with chunk r + 1).  Any shift gives the same all-reduce with the same
bytes: each chunk is completed on exactly one rank and then circulated.
:func:`plot_after_reduce_scatter` draws both states side by side.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import matplotlib.pyplot as plt
import numpy as np
from matplotlib.figure import Figure
from matplotlib.ticker import MaxNLocator


@dataclass(frozen=True)
class RingStep:
    """One message of the ring schedule: ``sender`` sends ``chunk`` to ``receiver``."""

    phase: str  # "reduce-scatter" or "all-gather"
    step: int  # 0 .. n-2 within the phase
    sender: int
    receiver: int
    chunk: int


def ring_steps(n: int, shift: int = 0) -> list[list[RingStep]]:
    """The ring all-reduce schedule for ``n`` ranks: ``2(n-1)`` steps of ``n`` messages.

    After the ``n - 1`` reduce-scatter steps rank r holds the full sum of chunk
    ``(r + shift) % n``: ``shift=0`` is :mod:`minipar.collectives.ring`'s
    convention, ``shift=1`` the ``ring_allreduce`` exercise's.
    """
    if not isinstance(n, int) or isinstance(n, bool) or n < 1:
        raise ValueError(f"a ring needs at least one rank, got n={n!r}")
    if not isinstance(shift, int) or isinstance(shift, bool):
        raise ValueError(f"shift must be an integer chunk offset, got {shift!r}")  # noqa: TRY004
    steps: list[list[RingStep]] = []
    for k in range(n - 1):
        steps.append([RingStep("reduce-scatter", k, r, (r + 1) % n, (r - 1 - k + shift) % n)
                      for r in range(n)])
    for k in range(n - 1):
        steps.append([RingStep("all-gather", k, r, (r + 1) % n, (r - k + shift) % n)
                      for r in range(n)])
    return steps


def ring_state(n: int, shift: int = 0) -> list[np.ndarray]:
    """Contribution counts ``[rank, chunk]`` before the first step and after each step.

    ``ring_state(n, shift)[n - 1]`` is the state after the reduce-scatter: the
    entry ``[r, (r + shift) % n]`` of each row is ``n`` (complete), the others less.
    """
    have = [[{r} for _ in range(n)] for r in range(n)]  # have[rank][chunk] = contributors
    states = [_counts(have)]
    for step in ring_steps(n, shift):
        incoming = [(m.receiver, m.chunk, set(have[m.sender][m.chunk]), m.phase) for m in step]
        for receiver, chunk, contrib, phase in incoming:  # all sends of a step happen at once
            if phase == "reduce-scatter":
                have[receiver][chunk] |= contrib
            else:
                have[receiver][chunk] = contrib
        states.append(_counts(have))
    return states


def _counts(have: list[list[set[int]]]) -> np.ndarray:
    return np.array([[len(s) for s in row] for row in have])


def plot_ring_steps(n: int = 4, shift: int = 0) -> Figure:
    """One panel per step: rows are ranks, columns chunks, colour = contributions summed.

    Cells that just received a message are outlined; the title of each panel
    names the phase.  The last panel is all ``n``: every rank holds the full
    sum of every chunk.  ``shift`` as in :func:`ring_steps`.
    """
    states, steps = ring_state(n, shift), ring_steps(n, shift)
    panels = len(states)
    fig, axes = plt.subplots(1, panels, figsize=(1.6 * panels + 0.6, 2.2 + 0.15 * n), squeeze=False)
    for i, ax in enumerate(axes[0]):
        ax.imshow(states[i], vmin=1, vmax=n, cmap="Blues")
        for r in range(n):
            for c in range(n):
                dark = states[i][r, c] > (n + 1) / 2
                ax.text(c, r, str(states[i][r, c]), ha="center", va="center", fontsize=8,
                        color="white" if dark else "black")
        if i > 0:
            for m in steps[i - 1]:
                ax.add_patch(plt.Rectangle((m.chunk - 0.5, m.receiver - 0.5), 1, 1, fill=False,
                                           edgecolor="crimson", linewidth=2))
            title = f"{'RS' if steps[i - 1][0].phase == 'reduce-scatter' else 'AG'} step {steps[i - 1][0].step + 1}"
        else:
            title = "start"
        ax.set_title(title, fontsize=9)
        _grid_ticks(ax, n)
    fig.suptitle(f"Ring all-reduce on {n} ranks: contributions summed per (rank, chunk); "
                 "red = just received (RS = reduce-scatter, AG = all-gather)", fontsize=9)
    fig.tight_layout()
    return fig


def _grid_ticks(ax: Any, n: int) -> None:
    """Integer ticks on a [rank, chunk] image: "c0".."c{n-1}" across, "r0".."r{n-1}" down."""
    ax.set_xticks(range(n), [f"c{c}" for c in range(n)], fontsize=7)
    ax.set_yticks(range(n), [f"r{r}" for r in range(n)], fontsize=7)


def plot_after_reduce_scatter(states: Mapping[str, np.ndarray]) -> Figure:
    """Side by side, for each convention: contributions per (rank, chunk) after the reduce-scatter.

    ``states`` maps a label to an ``[rank, chunk]`` count matrix (measured on
    real ranks, or ``ring_state(n, shift)[n - 1]``); the cells holding all
    ``n`` contributions are outlined, one per row and one per column.
    """
    if not states:
        raise ValueError("plot_after_reduce_scatter needs at least one [rank, chunk] matrix")
    mats = {k: np.asarray(v) for k, v in states.items()}
    bad = [k for k, m in mats.items() if m.ndim != 2 or m.shape[0] != m.shape[1]]
    if bad:
        raise ValueError(f"{bad}: each state must be a square [rank, chunk] matrix")
    fig, axes = plt.subplots(1, len(mats), figsize=(3.4 * len(mats), 3.3), squeeze=False)
    for ax, (label, m) in zip(axes[0], mats.items()):
        n = m.shape[0]
        ax.imshow(m, vmin=1, vmax=n, cmap="Blues")
        for r, c in zip(*np.nonzero(m == n)):
            ax.add_patch(plt.Rectangle((c - 0.5, r - 0.5), 1, 1, fill=False, edgecolor="crimson",
                                       linewidth=2))
        for r in range(n):
            for c in range(n):
                ax.text(c, r, str(m[r, c]), ha="center", va="center", fontsize=8,
                        color="white" if m[r, c] > (n + 1) / 2 else "black")
        _grid_ticks(ax, n)
        ax.set_xlabel("chunk")
        ax.set_ylabel("rank")
        ax.set_title(label, fontsize=9)
    fig.suptitle("After the reduce-scatter: contributions per (rank, chunk); red = complete sum",
                 fontsize=9)
    fig.tight_layout()
    return fig


def plot_bytes_per_rank(measured: Mapping[str, Sequence[float]], formula: Mapping[str, float] | None = None,
                        *, ylabel: str = "bytes sent per rank") -> Figure:
    """Grouped bars of measured bytes per rank for each algorithm, formulas as dashed lines."""
    fig, ax = plt.subplots(figsize=(7, 3.2))
    names = list(measured)
    n = max(len(v) for v in measured.values())
    width = 0.8 / max(1, len(names))
    for j, name in enumerate(names):
        vals = list(measured[name])
        ax.bar(np.arange(len(vals)) + j * width, vals, width, label=f"{name} (measured)")
    for j, (name, value) in enumerate((formula or {}).items()):
        ax.axhline(value, linestyle="--", color=f"C{j + len(names)}", label=f"{name} (formula)")
    ax.set_xticks(np.arange(n) + width * (len(names) - 1) / 2, [f"rank {r}" for r in range(n)])
    ax.set_ylabel(ylabel)
    ax.legend(fontsize=8)
    fig.tight_layout()
    return fig


def plot_busbw(rows: Sequence[Mapping[str, float | str]], *, x: str = "size", y: str = "busbw",
               by: str = "algorithm") -> Figure:
    """Bus bandwidth against message size, one line per algorithm (log-log)."""
    fig, ax = plt.subplots(figsize=(7, 3.6))
    for name in dict.fromkeys(str(r[by]) for r in rows):
        pts = sorted((float(r[x]), float(r[y])) for r in rows if str(r[by]) == name)
        ax.plot([p[0] for p in pts], [p[1] for p in pts], marker="o", label=name)
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xlabel("message size (bytes)")
    ax.set_ylabel("bus bandwidth (GB/s)")
    ax.legend(fontsize=8)
    ax.grid(True, which="both", alpha=0.3)
    fig.tight_layout()
    return fig


def plot_traffic_vs_ranks(ns: Sequence[int], ring_per_rank: Sequence[float],
                          ps_root: Sequence[float]) -> Figure:
    """Bytes on the busiest link, in units of S, as N grows: ring vs parameter server.

    ``ring_per_rank`` and ``ps_root`` are measured bytes divided by S; the
    formulas 2(N-1)/N (ring, tends to 2) and N-1 (the server's in-link under
    the naive gather-to-root all-reduce) are drawn as dashed lines.
    """
    fig, ax = plt.subplots(figsize=(6.5, 3.4))
    grid = np.linspace(min(ns), max(ns), 100)
    ax.plot(ns, ring_per_rank, "o", color="C0", label="ring: sent per rank (measured)")
    ax.plot(grid, 2 * (grid - 1) / grid, "--", color="C0", label="2(N-1)/N")
    ax.plot(ns, ps_root, "s", color="C3", label="naive / parameter server: root received (measured)")
    ax.plot(grid, grid - 1, "--", color="C3", label="N-1")
    ax.set_xlabel("ranks N")
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))  # a rank count is a whole number
    ax.set_ylabel("bytes / S")
    ax.legend(fontsize=8)
    ax.grid(True, alpha=0.3)
    fig.tight_layout()
    return fig
