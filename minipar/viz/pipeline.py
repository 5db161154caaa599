"""Figures for pipeline parallelism: the Gantt chart, the bubble against m, activations in flight.

EN pipeline bubble · RU пузырь конвейера · ZH 流水线气泡

Every function takes a timeline: a list of
:class:`~minipar.parallel.pipeline.simulate.Record` ``(stage, what,
micro_batch, chunk, start, end)``, simulated
(:func:`minipar.parallel.pipeline.simulate.replay`) or measured by the MPI
executor — the same records, so the same figures.

* :func:`plot_gantt` — stage × time: each forward and backward a bar coloured
  by micro-batch (forward light, backward dark, a split backward's W faded —
  zero bubble, Qi et al. 2023 — odd chunks hatched), the idle
  time of every stage shaded, the bubble fraction in the title (GPipe, Huang
  et al. 2018, arXiv 1811.06965, Fig. 2; PTD-P, Narayanan et al. 2021, arXiv
  2104.04473, Fig. 3–4);
* :func:`plot_bubble_vs_m` — bubble fraction against the number of
  micro-batches m for each schedule: the papers' formula as a curve,
  ``(p − 1)/(v·m + p − 1)`` (v = 1 for GPipe and 1F1B), and the simulator's
  exact value as points (plus measured points, if given);
* :func:`plot_in_flight` — micro-batches whose activations each stage holds
  over time (:func:`in_flight_over_time`): GPipe climbs to m, 1F1B stays at
  p − s on stage s.

A stage is idle when it runs no forward or backward: waiting for a message is
idle, and so is the time after its last backward until the flush (the end of
the last backward of any stage), exactly what
:func:`~minipar.parallel.pipeline.measure.bubble_fraction` counts.
Figures are returned, never shown (headless, Agg).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import matplotlib.pyplot as plt
from matplotlib.figure import Figure
from matplotlib.patches import Patch

from minipar.parallel.pipeline.measure import bubble_fraction
from minipar.parallel.pipeline.simulate import Record

COMPUTE = ("forward", "backward", "backward_input", "backward_weight")
SCHEDULE_NAMES = {"naive": "naive", "gpipe": "GPipe", "1f1b": "1F1B", "interleaved": "interleaved 1F1B",
                  "zb-h1": "ZB-H1", "zb-h2": "ZB-H2", "zb-v": "ZB-V"}
#: the letter a bar is labelled with: F forward, B backward (or its B), W its W
LETTER = {"forward": "F", "backward": "B", "backward_input": "B", "backward_weight": "W"}


def _check(timeline: Sequence[Record]) -> list[Record]:
    recs = [Record(*r) for r in timeline]
    if not any(r.what in COMPUTE for r in recs):
        raise ValueError("the timeline has no forward or backward record: nothing to draw")
    return recs


def _span(recs: Sequence[Record]) -> tuple[float, float]:
    """(start of the step, the flush: end of the last forward or backward)."""
    t0 = min(r.start for r in recs)
    return t0, max(r.end for r in recs if r.what in COMPUTE)


def _colour(mb: int, what: str) -> Any:
    """Micro-batch mb's colour: forward the light, backward (or B) the dark member of a
    tab20 pair; W (the weight gradient of a split backward) the dark one faded."""
    r, g, b, _ = plt.cm.tab20(2 * (mb % 10) + (what == "forward"))
    if what == "backward_weight":  # the dark colour mixed with white, opaque
        return (0.45 * r + 0.55, 0.45 * g + 0.55, 0.45 * b + 0.55, 1.0)
    return (r, g, b, 1.0)


def _split(recs: Sequence[Record]) -> bool:
    return any(r.what == "backward_weight" for r in recs)


def _odd(recs: Sequence[Record]) -> bool:
    return any(r.chunk and r.chunk % 2 for r in recs if r.what in COMPUTE)


def _legend(ax: Any, odd: bool, split: bool = False) -> None:
    """The key under the axes, below the time axis's label whatever the chart's height."""
    handles = [Patch(color=_colour(0, "forward"), label="forward (colour: micro-batch)"),
               Patch(color=_colour(0, "backward"),
                     label="B: input gradient" if split else "backward")]
    if split:
        handles.append(Patch(color=_colour(0, "backward_weight"), label="W: weight gradient"))
    handles += [
               Patch(facecolor="0.88", hatch="////", edgecolor="0.75", label="idle (bubble)")]
    if odd:
        handles.append(Patch(facecolor=_colour(0, "forward"), hatch="..", edgecolor="white",
                             label="dotted, f/b: odd chunk (dualpipe: going up)"))
    ax.legend(handles=handles, fontsize=7, ncol=len(handles), loc="upper center",
              bbox_to_anchor=(0.5, 0), borderaxespad=5.5)


def plot_gantt(timeline: Sequence[Record], title: str = "", time_unit: str = "time units",
               scale: float = 1.0, labels: bool = True, ax: Any = None,
               span: float | None = None) -> Figure:
    """The pipeline's Gantt chart: one row per stage (stage 0 on top), time to the right.

    ``scale`` multiplies times (e.g. 1e3 with ``time_unit="ms"`` for a measured
    timeline in seconds); ``labels`` writes ``F3``/``B3`` in bars wide enough (1/60 of
    ``span``, the time the axis shows; default this timeline's).
    The title says the schedule given in ``title`` and the bubble fraction
    (P·T − C)/(P·T) of this timeline.
    """
    recs = _check(timeline)
    t0, flush = _span(recs)
    stages = sorted({r.stage for r in recs})
    own = ax is None
    if own:
        fig, ax = plt.subplots(figsize=(10, 0.9 + 0.55 * len(stages)))
    else:
        fig = ax.figure
    row = {s: len(stages) - 1 - i for i, s in enumerate(stages)}
    for s in stages:  # idle everywhere first; compute is drawn over it
        ax.barh(row[s], (flush - t0) * scale, left=0, height=0.8, color="0.88",
                hatch="////", edgecolor="0.75", linewidth=0)
    width = (flush - t0) * scale
    for r in recs:
        if r.what not in COMPUTE:
            continue
        left, w = (r.start - t0) * scale, (r.end - r.start) * scale
        odd = bool(r.chunk) and r.chunk % 2 == 1
        ax.barh(row[r.stage], w, left=left, height=0.8,
                color=_colour(r.micro_batch, r.what), edgecolor="white", linewidth=0.6,
                hatch=".." if odd else None)
        if labels and w > (span if span is not None else width) / 60:
            letter = LETTER[r.what]
            ax.text(left + w / 2, row[r.stage], f"{letter if not odd else letter.lower()}"
                    f"{r.micro_batch}", ha="center", va="center", fontsize=7)
    ax.set_yticks([row[s] for s in stages], [f"stage {s}" for s in stages])
    ax.set_xlim(0, width)
    ax.set_xlabel(f"time in the step ({time_unit})")
    frac = float(bubble_fraction(recs))
    head = f"{title}: " if title else ""
    ax.set_title(f"{head}bubble {frac:.1%} of the step (idle shaded)", fontsize=10)
    _legend(ax, _odd(recs), _split(recs))
    if own:
        fig.tight_layout()
    return fig


def simulated_bubble(kind: str, p: int, m: int, v: int = 1) -> float:
    """The bubble fraction of ``kind`` on the simulator with equal costs (forward 1,
    backward 2 per stage), exact (a Fraction turned into a float)."""
    from minipar.parallel.pipeline.schedule import placement, schedules
    from minipar.parallel.pipeline.simulate import replay, uniform_cost

    return float(bubble_fraction(replay(schedules(kind, p, m, v), uniform_cost(1, 2, v=v),
                                        placement=placement(kind))))


def plot_bubble_vs_m(p: int, ms: Iterable[int] = range(1, 33),
                     kinds: Sequence[str] = ("gpipe", "1f1b", "interleaved"), v: int = 2,
                     measured: Mapping[str, Sequence[tuple[int, float]]] | None = None) -> Figure:
    """Bubble fraction against m on p stages: the formula (curve), the simulator (points,
    equal costs) and ``measured`` points ``{kind: [(m, fraction), ...]}`` if given.

    Interleaved uses ``v`` chunks per rank and only the m that are multiples of p.
    """
    from minipar.plan.pipeline import bubble_formula

    ms = sorted(set(ms))
    if not ms or ms[0] < 1 or p < 1:
        raise ValueError(f"need p >= 1 and micro-batch counts m >= 1, got p={p}, m={ms}")
    fig, ax = plt.subplots(figsize=(7, 3.6))
    styles = {"naive": ("C3", "-", "D"), "gpipe": ("C0", "-", "o"), "1f1b": ("C1", "--", "x"),
              "interleaved": ("C2", "-", "s"), "zb-h1": ("C4", "-", "^"),
              "zb-h2": ("C5", ":", "v"), "zb-v": ("C6", "-.", "P")}
    for kind in kinds:
        vk = v if kind == "interleaved" else 2 if kind == "zb-v" else 1
        xs = [m for m in ms if kind != "interleaved" or m % p == 0]
        if not xs:
            continue
        colour, line, marker = styles.get(kind, ("C4", "-", "^"))
        name = SCHEDULE_NAMES.get(kind, kind) + (f", v = {vk}" if kind == "interleaved" else "")
        theory = [float(bubble_formula(kind, p, m, vk)["fraction"]) for m in xs]
        ax.plot(xs, theory, color=colour, linestyle=line, linewidth=1.3,
                label=f"{name}: formula")
        ax.scatter(xs, [simulated_bubble(kind, p, m, vk) for m in xs], color=colour,
                   marker=marker, s=18, zorder=3, label=f"{name}: simulated")
        for mb, frac in (measured or {}).get(kind, ()):
            ax.scatter([mb], [frac], color=colour, marker="*", s=90, edgecolor="black",
                       zorder=4, label=None)
    if measured:
        ax.scatter([], [], color="white", marker="*", s=90, edgecolor="black", label="measured")
    ax.set_xlabel("micro-batches m")
    ax.set_ylabel("bubble fraction of the step")
    ax.set_ylim(0, 1)
    ax.set_title(f"p = {p} stages: bubble (p − 1)/(v·m + p − 1) against m", fontsize=10)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7, ncol=2)
    fig.tight_layout()
    return fig


def in_flight_over_time(timeline: Sequence[Record]) -> dict[int, list[tuple[float, int]]]:
    """stage -> [(time, micro-batches held from then on)]: +1 when a forward starts (its
    activations are being kept), −1 when its backward ends (they are freed).  With v
    chunks a micro-batch counts once per chunk (chunk-activations, each 1/v of the
    stage's layers).  The peak of each stage equals
    :func:`~minipar.parallel.pipeline.measure.in_flight` of its schedule."""
    recs = _check(timeline)
    t0 = min(r.start for r in recs)
    events: dict[int, list[tuple[float, int]]] = {}
    for r in recs:
        if r.what == "forward":
            events.setdefault(r.stage, []).append((r.start - t0, +1))
        elif r.what in ("backward", "backward_input"):  # B frees them; W keeps less
            events.setdefault(r.stage, []).append((r.end - t0, -1))
    out = {}
    for s, evs in sorted(events.items()):
        held, steps = 0, [(0.0, 0)]
        for t, d in sorted(evs, key=lambda e: (e[0], e[1])):  # frees before takes at a tie
            held += d
            if steps[-1][0] == t:
                steps[-1] = (t, held)
            else:
                steps.append((t, held))
        out[s] = steps
    return out


def plot_in_flight(timeline: Sequence[Record], title: str = "", time_unit: str = "time units",
                   scale: float = 1.0, ax: Any = None) -> Figure:
    """Activations held per stage over time (one step line per stage, its peak labelled)."""
    curves = in_flight_over_time(timeline)
    own = ax is None
    if own:
        fig, ax = plt.subplots(figsize=(9, 3.2))
    else:
        fig = ax.figure
    for s, steps in curves.items():
        xs = [t * scale for t, _ in steps]
        ys = [k for _, k in steps]
        peak = max(ys)
        ax.step(xs, ys, where="post", color=f"C{s % 10}", label=f"stage {s} (peak {peak})")
    ax.set_xlabel(f"time in the step ({time_unit})")
    ax.set_ylabel("micro-batches in flight")
    ax.set_title(title or "activations held per stage (forward started, backward not ended)",
                 fontsize=10)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.0, 1.0))
    if own:
        fig.tight_layout()
    return fig


def plot_schedules(timelines: Mapping[str, Sequence[Record]], time_unit: str = "time units",
                   scale: float = 1.0) -> Figure:
    """Several Gantt charts one above the other on one time axis, each titled by its key
    (e.g. GPipe, 1F1B and interleaved on the same p and m)."""
    if not timelines:
        raise ValueError("no timelines to draw")
    n_stages = [len({r.stage for r in _check(tl)}) for tl in timelines.values()]
    fig, axes = plt.subplots(len(timelines), 1, sharex=True, squeeze=False,
                             figsize=(10, 0.8 + sum(0.5 * k + 0.6 for k in n_stages)),
                             gridspec_kw={"height_ratios": n_stages})
    span = max(b - a for a, b in (_span(_check(tl)) for tl in timelines.values())) * scale
    for ax, (name, tl) in zip(axes[:, 0], timelines.items()):
        plot_gantt(tl, title=name, time_unit=time_unit, scale=scale, ax=ax, span=span)
        ax.get_legend().remove()
        ax.set_xlabel("")
    axes[0, 0].set_xlim(0, span)
    axes[-1, 0].set_xlabel(f"time in the step ({time_unit})")
    _legend(axes[-1, 0], any(_odd(_check(tl)) for tl in timelines.values()),
            any(_split(_check(tl)) for tl in timelines.values()))
    fig.tight_layout()
    return fig


__all__ = ["in_flight_over_time", "plot_bubble_vs_m", "plot_gantt", "plot_in_flight",
           "plot_schedules", "simulated_bubble"]
