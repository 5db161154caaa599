"""The ring schedule drawn in notebooks is the one minipar.collectives runs."""

from __future__ import annotations

import numpy as np
import pytest

from minipar import collectives
from minipar.viz import ring


@pytest.mark.parametrize("n", [1, 2, 3, 4, 8])
def test_every_rank_ends_with_every_contribution(n: int) -> None:
    states = ring.ring_state(n)
    assert len(states) == 2 * (n - 1) + 1
    assert (states[-1] == n).all()
    # after the reduce-scatter phase rank r holds the full sum of its own chunk r,
    # which is what collectives.reduce_scatter returns
    assert all(states[n - 1][r, r] == n for r in range(n))


@pytest.mark.parametrize("n", [2, 3, 4, 7])
@pytest.mark.parametrize("elems", [0, 1, 5, 1001])
def test_schedule_bytes_equal_the_collectives_formula(n: int, elems: int) -> None:
    counts = [len(c) for c in np.array_split(np.arange(elems), n)]
    sent = [0] * n
    for step in ring.ring_steps(n):
        for m in step:
            assert m.receiver == (m.sender + 1) % n  # only the right neighbour
            sent[m.sender] += 8 * counts[m.chunk]
    assert sent == [collectives.ring_allreduce_bytes_sent(elems, 8, n, r) for r in range(n)]


def test_figures_draw_the_schedule_and_the_numbers_given() -> None:
    n = 3
    fig = ring.plot_ring_steps(n)
    assert len(fig.axes) == 2 * (n - 1) + 1  # start + (N-1) reduce-scatter + (N-1) all-gather
    for ax, state in zip(fig.axes, ring.ring_state(n)):
        assert np.array_equal(ax.images[0].get_array(), state)
    # every panel after the first outlines the N cells that just received a chunk
    assert [len(ax.patches) for ax in fig.axes] == [0] + [n] * (2 * (n - 1))

    fig = ring.plot_bytes_per_rank({"ring": [1.0, 2.0], "naive": [3.0, 0.5]}, {"2(N-1)/N S": 1.0})
    ax = fig.axes[0]
    assert [b.get_height() for b in ax.patches] == [1.0, 2.0, 3.0, 0.5]
    assert [list(line.get_ydata()) for line in ax.lines] == [[1.0, 1.0]]

    fig = ring.plot_busbw([{"algorithm": "ring", "size": 64, "busbw": 0.3},
                           {"algorithm": "ring", "size": 8, "busbw": 0.1},
                           {"algorithm": "mpi", "size": 8, "busbw": 0.2}])
    lines = fig.axes[0].lines
    assert [line.get_label() for line in lines] == ["ring", "mpi"]
    assert list(lines[0].get_xdata()) == [8.0, 64.0] and list(lines[0].get_ydata()) == [0.1, 0.3]
    with pytest.raises(ValueError):
        ring.ring_steps(0)


def test_traffic_figure_draws_measurements_and_formulas() -> None:
    fig = ring.plot_traffic_vs_ranks([2, 3, 4], [1.0, 4 / 3, 1.5], [1.0, 2.0, 3.0])
    lines = fig.axes[0].lines
    assert len(lines) == 4
    assert list(lines[0].get_ydata()) == [1.0, 4 / 3, 1.5] and list(lines[2].get_ydata()) == [1.0, 2.0, 3.0]
    grid, formula = lines[1].get_xdata(), lines[1].get_ydata()
    assert np.allclose(formula, 2 * (grid - 1) / grid) and np.allclose(lines[3].get_ydata(), grid - 1)


@pytest.mark.parametrize("n", [1, 2, 3, 4, 7])
@pytest.mark.parametrize("shift", [0, 1, -1, 5])
def test_shift_only_relabels_the_chunks(n: int, shift: int) -> None:
    """shift=0 is minipar.collectives.ring's convention, shift=1 the exercise's (chunk (r+1) % N)."""
    states = ring.ring_state(n, shift)
    after_rs = states[n - 1]
    for r in range(n):  # exactly one complete chunk per rank after the reduce-scatter: (r + shift) % n
        assert [c for c in range(n) if after_rs[r, c] == n] == [(r + shift) % n]
    assert (states[-1] == n).all()
    # the same schedule with chunk c renamed c + shift
    base, shifted = ring.ring_steps(n), ring.ring_steps(n, shift)
    assert [[(m.sender, m.receiver, (m.chunk + shift) % n) for m in st] for st in base] == \
           [[(m.sender, m.receiver, m.chunk) for m in st] for st in shifted]


@pytest.mark.parametrize("n", [2, 3, 4])
def test_shift_one_is_the_exercise_schedule(n: int) -> None:
    """The skeleton's formulas: reduce-scatter step s sends chunk (r - s) % N, all-gather (r + 1 - s) % N."""
    steps = ring.ring_steps(n, shift=1)
    for st in steps[: n - 1]:
        assert [m.chunk for m in st] == [(r - st[0].step) % n for r in range(n)]
    for st in steps[n - 1:]:
        assert [m.chunk for m in st] == [(r + 1 - st[0].step) % n for r in range(n)]


@pytest.mark.parametrize("n", [2, 3, 4, 7])
@pytest.mark.parametrize("elems", [7, 12, 1001])
def test_both_conventions_send_the_same_bytes_in_all(n: int, elems: int) -> None:
    counts = [len(c) for c in np.array_split(np.arange(elems), n)]

    def sent(shift: int) -> list[int]:
        out = [0] * n
        for step in ring.ring_steps(n, shift):
            for m in step:
                out[m.sender] += 8 * counts[m.chunk]
        return out

    assert sum(sent(0)) == sum(sent(1)) == 8 * elems * 2 * (n - 1)
    if elems % n == 0:  # equal chunks: equal per rank too, 2(N-1)/N x S
        assert sent(0) == sent(1) == [8 * elems * 2 * (n - 1) // n] * n


def test_bad_shift_and_bad_states_are_value_errors() -> None:
    with pytest.raises(ValueError, match="shift"):
        ring.ring_steps(3, shift=0.5)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="at least one"):
        ring.plot_after_reduce_scatter({})
    with pytest.raises(ValueError, match="square"):
        ring.plot_after_reduce_scatter({"x": np.ones((2, 3), int)})


def test_after_reduce_scatter_figure_outlines_the_complete_chunks() -> None:
    n = 4
    states = {f"shift {s}": ring.ring_state(n, s)[n - 1] for s in (0, 1)}
    fig = ring.plot_after_reduce_scatter(states)
    assert len(fig.axes) == 2
    for ax, (s, m) in zip(fig.axes, zip((0, 1), states.values())):
        assert np.array_equal(ax.images[0].get_array(), m)
        corners = sorted((round(p.get_y() + 0.5), round(p.get_x() + 0.5)) for p in ax.patches)
        assert corners == [(r, (r + s) % n) for r in range(n)]
        assert [t.get_text() for t in ax.get_yticklabels()] == [f"r{r}" for r in range(n)]


def test_rank_axes_have_integer_ticks() -> None:
    fig = ring.plot_traffic_vs_ranks([2, 3, 4, 5, 6], [1.0, 4 / 3, 1.5, 1.6, 5 / 3], [1, 2, 3, 4, 5])
    ticks = fig.axes[0].get_xticks()
    assert len(ticks) >= 2 and all(float(t).is_integer() for t in ticks)
    fig = ring.plot_ring_steps(3)
    assert [t.get_text() for t in fig.axes[0].get_yticklabels()] == ["r0", "r1", "r2"]
