"""Pipeline figures: the Gantt chart, bubble against m, activations in flight (minipar.viz.pipeline).

The figures are drawn from simulated timelines (exact costs) and from a
"measured" one (float seconds); the tests read back what was drawn: bars,
the title's bubble, the curves' values against the papers' formulas.
"""

from __future__ import annotations

import random
from fractions import Fraction

import matplotlib

matplotlib.use("Agg")

import matplotlib.pyplot as plt
import pytest

from minipar.parallel.pipeline.measure import bubble_fraction
from minipar.parallel.pipeline.measure import in_flight
from minipar.parallel.pipeline.schedule import schedules
from minipar.parallel.pipeline.simulate import replay, uniform_cost
from minipar.plan.pipeline import bubble_fraction as formula
from minipar.viz import pipeline as vp


def timeline(kind: str, p: int, m: int, v: int = 1):
    return replay(schedules(kind, p, m, v), uniform_cost(1, 2, v=v))


def measured(kind: str, p: int, m: int, seed: int = 0):
    """A 'measured' timeline: float seconds, each instruction a little off its nominal cost."""
    rng = random.Random(seed)

    def cost(ins, stage):
        nominal = {"Forward": 0.010, "Backward": 0.020}.get(type(ins).__name__, 0.001)
        return nominal * (1 + 0.1 * rng.random())
    return replay(schedules(kind, p, m), cost, comm_cost=lambda ins, s: 2e-4)


@pytest.fixture(autouse=True)
def _close():
    yield
    plt.close("all")


def test_gantt_draws_every_forward_and_backward_and_the_idle_rows():
    p, m = 4, 8
    fig = vp.plot_gantt(timeline("gpipe", p, m), title="GPipe")
    ax = fig.axes[0]
    assert len(ax.patches) == p + 2 * p * m  # one idle row per stage, then the bars
    idle = ax.patches[:p]
    assert all(bar.get_hatch() == "////" for bar in idle)
    assert {bar.get_width() for bar in idle} == {33}  # the flush: (m + p − 1)·3 units
    compute = ax.patches[p:]
    assert sorted(bar.get_width() for bar in compute) == [1] * (p * m) + [2] * (p * m)
    # forward and backward of one micro-batch share a hue pair, micro-batches differ
    colours = {bar.get_facecolor() for bar in compute}
    assert len(colours) == 2 * m
    assert ax.get_title() == f"GPipe: bubble {3 / 11:.1%} of the step (idle shaded)"
    assert [t.get_text() for t in ax.get_yticklabels()] == [f"stage {s}" for s in range(p)]
    labels = {t.get_text() for t in ax.texts}
    assert {f"F{i}" for i in range(m)} | {f"B{i}" for i in range(m)} == labels


def test_gantt_of_interleaved_marks_the_odd_chunks_and_shows_its_bubble():
    fig = vp.plot_gantt(timeline("interleaved", 4, 8, 2))
    ax = fig.axes[0]
    hatched = [b for b in ax.patches[4:] if b.get_hatch() == ".."]
    assert len(hatched) == 4 * 8 * 2  # chunk 1: one forward and one backward per micro-batch
    assert f"{float(Fraction(3, 19)):.1%}" in ax.get_title()  # (p − 1)/(v·m + p − 1)
    assert "dotted, f/b: odd chunk (dualpipe: going up)" in [
        t.get_text() for t in ax.get_legend().get_texts()]


@pytest.mark.parametrize("p", [1, 2, 8])
def test_the_key_lies_below_the_time_axis_label_whatever_the_height(p):
    for fig in (vp.plot_gantt(timeline("gpipe", p, 4)),
                vp.plot_schedules({"a": timeline("gpipe", p, 4), "b": timeline("1f1b", p, 4)})):
        fig.canvas.draw()
        ax = fig.axes[-1]
        legend, label = ax.get_legend(), ax.xaxis.label
        assert legend is not None and len(fig.legends) == 0
        assert legend.get_window_extent().y1 < label.get_window_extent().y0
        assert legend.get_window_extent().y0 >= 0  # inside the figure


def test_gantt_of_a_measured_timeline_in_milliseconds():
    tl = measured("1f1b", 3, 6)
    fig = vp.plot_gantt(tl, title="1F1B measured", time_unit="ms", scale=1e3)
    ax = fig.axes[0]
    assert ax.get_xlabel() == "time in the step (ms)"
    assert f"{float(bubble_fraction(tl)):.1%}" in ax.get_title()
    t0 = min(r.start for r in tl)
    flush = max(r.end for r in tl if r.what in ("forward", "backward"))
    assert ax.get_xlim() == pytest.approx((0, (flush - t0) * 1e3))


@pytest.mark.parametrize("kind, v", [("gpipe", 1), ("1f1b", 1), ("interleaved", 2)])
def test_in_flight_over_time_peaks_at_the_schedules_count(kind, v):
    p, m = 4, 8
    curves = vp.in_flight_over_time(timeline(kind, p, m, v))
    assert sorted(curves) == list(range(p))
    for s, steps in curves.items():
        counts = [k for _, k in steps]
        assert max(counts) == in_flight(schedules(kind, p, m, v)[s]), (kind, s)
        assert steps[0][0] == 0 and counts[-1] == 0  # from the step's start; all freed at the end
        assert all(k >= 0 for k in counts)
        times = [t for t, _ in steps]
        assert times == sorted(times) and len(set(times)) == len(times)
    if kind == "1f1b":
        assert [max(k for _, k in curves[s]) for s in range(p)] == [4, 3, 2, 1]


def test_in_flight_figure_labels_each_stage_with_its_peak():
    fig = vp.plot_in_flight(timeline("gpipe", 3, 5))
    ax = fig.axes[0]
    assert [line.get_label() for line in ax.get_lines()] == [
        "stage 0 (peak 5)", "stage 1 (peak 5)", "stage 2 (peak 5)"]


def test_bubble_against_m_curves_are_the_formula_and_points_the_simulator():
    p, ms = 4, range(1, 17)
    fig = vp.plot_bubble_vs_m(p, ms, v=2, measured={"1f1b": [(8, 0.29)]})
    ax = fig.axes[0]
    lines = {line.get_label(): line for line in ax.get_lines()}
    assert set(lines) == {"GPipe: formula", "1F1B: formula", "interleaved 1F1B, v = 2: formula"}
    assert list(lines["GPipe: formula"].get_ydata()) == [formula(p, m) for m in ms]
    inter = lines["interleaved 1F1B, v = 2: formula"]
    assert list(inter.get_xdata()) == [4, 8, 12, 16]  # m a multiple of p
    assert list(inter.get_ydata()) == [formula(p, m, 2) for m in (4, 8, 12, 16)]
    points = {c.get_label(): c.get_offsets() for c in ax.collections}
    for name, v, xs in (("GPipe", 1, ms), ("1F1B", 1, ms),
                        ("interleaved 1F1B, v = 2", 2, (4, 8, 12, 16))):
        got = points[f"{name}: simulated"]
        assert list(got[:, 0]) == list(xs)
        # the simulator's exact bubble is the formula (to the float's last bit or so)
        assert list(got[:, 1]) == pytest.approx([formula(p, m, v) for m in xs], rel=1e-12)
    assert "measured" in points


def test_several_schedules_on_one_time_axis():
    p, m = 4, 4
    tls = {name: timeline(kind, p, m, v) for name, kind, v in
           (("GPipe", "gpipe", 1), ("1F1B", "1f1b", 1), ("interleaved", "interleaved", 2))}
    fig = vp.plot_schedules(tls)
    assert len(fig.axes) == 3
    assert [ax.get_title().split(":")[0] for ax in fig.axes] == list(tls)
    assert fig.axes[0].get_xlim()[1] == max(max(r.end for r in tl if r.what != "optimizer")
                                            for tl in tls.values())


def test_bad_input_is_one_clear_error():
    with pytest.raises(ValueError, match="no forward or backward"):
        vp.plot_gantt([])
    with pytest.raises(ValueError, match="m >= 1"):
        vp.plot_bubble_vs_m(4, [0, 1])
    with pytest.raises(ValueError, match="no timelines"):
        vp.plot_schedules({})
