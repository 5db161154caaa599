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
