"""A pipeline schedule: its Gantt chart, its bubble against the formula, activations in flight.

EN schedule explorer · RU расписание конвейера · ZH 流水线调度

:func:`schedule` builds every stage's instruction list with the package's own schedules
(:func:`minipar.parallel.pipeline.schedule.schedules`, the lists the MPI executor runs),
replays them with the costs T_F, T_B, T_W of one stage's forward, input-gradient and
weight-gradient backward (:mod:`minipar.parallel.pipeline.simulate`), and sets the
timeline's bubble beside the papers' formula (:func:`minipar.plan.pipeline.bubble_formula`,
:func:`~minipar.plan.pipeline.zero_bubble_formula` for the zero-bubble kinds) and the
micro-batches each stage holds (:func:`~minipar.parallel.pipeline.schedule.in_flight`).
Every kind of :data:`~minipar.parallel.pipeline.schedule.KINDS` is a choice: a schedule
that lands there (DualPipe) appears here with it; :data:`CHUNKS` says the v a kind needs.
"""

from __future__ import annotations

from fractions import Fraction
from typing import Any


from matplotlib.figure import Figure

from minipar.parallel.pipeline.measure import bubble_fraction, in_flight
from minipar.parallel.pipeline.schedule import KINDS, placement, schedules
from minipar.parallel.pipeline.simulate import replay, split_cost
from minipar.plan.pipeline import (
    DUALPIPE_KINDS,
    ZERO_BUBBLE_KINDS,
    bubble_formula,
    dualpipe_formula,
    zero_bubble_formula,
)
from minipar.viz.explore.view import View
from minipar.viz.pipeline import SCHEDULE_NAMES, plot_gantt

#: kinds whose chunks per rank are fixed (None: the v control; absent: 1)
CHUNKS: dict[str, int | None] = {"interleaved": None, "zb-v": 2, "dualpipe": 2, "dualpipev": 2}
CONTROLS: dict[str, Any] = {"kind": KINDS, "p": range(2, 9), "m": range(1, 25),
                            "v": (1, 2, 3, 4), "t_f": (0.5, 3.0, 0.5), "t_b": (0.5, 3.0, 0.5),
                            "t_w": (0.5, 3.0, 0.5)}


def formula(kind: str, p: int, m: int, v: int, t_f: float, t_b: float, t_w: float) -> float:
    """The papers' bubble fraction (idle share of the step) of ``kind``."""
    f, b, w = (Fraction(x).limit_denominator(8) for x in (t_f, t_b, t_w))
    if kind in ZERO_BUBBLE_KINDS:
        return float(zero_bubble_formula(kind, p, m, f, b, w)["fraction"])
    if kind in DUALPIPE_KINDS:  # the DualPipe table's B is a whole backward
        return float(dualpipe_formula(kind, p, m, f, b + w, w)["fraction"])
    return float(bubble_formula(kind, p, m, v)["fraction"])


def schedule(kind: str = "1f1b", p: int = 4, m: int = 8, v: int = 1, t_f: float = 1.0,
             t_b: float = 1.0, t_w: float = 1.0) -> View:
    """The Gantt chart of ``kind`` on p stages and m micro-batches.

    ``numbers``: ``bubble`` (the replayed timeline's idle share, exact for these costs),
    ``formula`` (the papers'), ``in_flight`` (micro-batches — chunks when v > 1 — held
    from F to B on each stage), ``span`` (the step's length in cost units), ``v``.
    """
    v = CHUNKS.get(kind, 1) or v
    if kind == "interleaved" and v < 2:
        raise ValueError("interleaved needs v ≥ 2 chunks per rank")
    lists = schedules(kind, p, m, v)
    exact = [Fraction(x).limit_denominator(8) for x in (t_f, t_b, t_w)]
    tl = replay(lists, split_cost(*exact, v=v), placement=placement(kind))
    bub = float(bubble_fraction(tl))
    form = formula(kind, p, m, v, t_f, t_b, t_w)
    held = [in_flight(s) for s in lists]
    span = float(max(r.end for r in tl) - min(r.start for r in tl))
    numbers = {"kind": kind, "p": p, "m": m, "v": v, "bubble": bub, "formula": form,
               "in_flight": held, "span": span}
    name = SCHEDULE_NAMES.get(kind, kind)
    unit = "chunks (L/(p·v) layers each)" if v > 1 else "micro-batches"
    lines = [f"{name}, p = {p}, m = {m}" + (f", v = {v}" if v > 1 else "")
             + f"; T_F {t_f:g}, T_B {t_b:g}, T_W {t_w:g}",
             f"bubble: replayed {bub:.3f}, formula {form:.3f}"
             + ("" if abs(bub - form) < 1e-9 else " (they part: see the lesson's conditions, "
                "e.g. m below p or 2p − 1 for zero bubble, or unequal costs)"),
             f"held from F to B per stage: {held} {unit}"]
    def draw() -> Figure:
        fig = plot_gantt(tl, title=f"{name}, p = {p}, m = {m}")
        fig.set_size_inches(9, 0.5 * p + 1.6)
        return fig
    return View(numbers, lines, draw)
