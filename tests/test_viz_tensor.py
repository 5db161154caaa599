"""The figures of notebooks 05 and 07 draw the numbers minipar computes."""

from __future__ import annotations

import numpy as np
import pytest

from minipar.plan.activations import ring_attention_bytes_per_rank
from minipar.viz import context as vc
from minipar.viz import tensor as vt


@pytest.mark.parametrize("t", [1, 2, 4])
def test_ownership_is_the_megatron_split(t):
    cols = vt.ownership(3, 8, t, "columns")
    rows = vt.ownership(8, 3, t, "rows")
    assert np.array_equal(rows, cols.T)  # W2's rows are W1's columns, rank for rank
    for r in range(t):
        assert np.array_equal(np.flatnonzero(cols[0] == r), np.arange(r * 8 // t, (r + 1) * 8 // t))
    with pytest.raises(ValueError, match="do not split evenly"):
        vt.ownership(3, 8, 3, "columns")


def test_tp_figures_draw_what_they_are_given():
    fig = vt.slicing(2, 4, 8)
    assert np.array_equal(fig.axes[0].images[0].get_array(), vt.ownership(4, 8, 2, "columns"))
    assert np.array_equal(fig.axes[1].images[0].get_array(), vt.ownership(8, 4, 2, "rows"))
    texts = [t.get_text() for t in vt.fg_diagram(3).axes[0].texts]
    assert "f" in texts and "g" in texts and "· W2_2" in texts
    fig = vt.traffic_bars([{"what": "g", "measured": 5, "formula": 6}])
    assert [p.get_height() for p in fig.axes[0].patches] == [5]
    rows = [{"mode": m, "t": t, "ledger": 10 * t, "tracemalloc": 11 * t, "formula": 10 * t,
             "paper": 9 * t} for m, ts in (("none", [1]), ("tp", [1, 2]), ("tp+sp", [1, 2]))
            for t in ts]
    assert len(vt.activation_lines(rows).axes[0].collections) >= 6


def test_cp_traffic_formulas():
    b, h, s = 2, 16, 64
    for P in (2, 4, 8):
        ring = vc.bytes_per_rank("ring", s, b, h, P, 8)
        assert ring == ring_attention_bytes_per_rank(s, b, h, P, 8) == 2 * (P - 1) * b * s * h / P * 8
        assert vc.bytes_per_rank("ulysses", s, b, h, P, 8) == pytest.approx(
            4 * b * s * h * (P - 1) / P**2 * 8)
        assert ring / vc.bytes_per_rank("ulysses", s, b, h, P, 8) == pytest.approx(P / 2)
    with pytest.raises(ValueError, match="unknown kind"):
        vc.bytes_per_rank("tree", s, b, h, 2)
    fig = vc.cp_traffic(b, h, [16, 32, 64], [2, 4, 8], 4, 64, 8,
                        [{"kind": "ring", "s": 64, "P": 4, "bytes": 1.0}])
    assert len(fig.axes[0].collections) == 1 and len(fig.axes[1].collections) == 1


def test_merge_walk_is_the_full_softmax():
    scores, values = [0.5, 2.0, -1.0, 1.5, 0.0], [1.0, -2.0, 3.0, 0.5, 4.0]
    walk = vc.merge_walk(scores, values, 2)
    p = np.exp(scores) / np.exp(scores).sum()
    last = walk["steps"][-1]
    assert [st["keys"] for st in walk["steps"]] == [(0, 2), (2, 4), (4, 5)]
    assert last["o"] == pytest.approx(p @ values, abs=1e-14) == walk["full"]["o"]
    assert last["lse"] == pytest.approx(np.log(np.exp(scores).sum()), abs=1e-14)
    for st in walk["steps"]:
        assert st["w_old"] + st["w_blk"] == pytest.approx(1.0, abs=1e-15)
    assert abs(walk["average"] - walk["full"]["o"]) > 0.1
    assert len(vc.merge_figure(walk).axes) == 2
    with pytest.raises(ValueError, match="as many scores as values"):
        vc.merge_walk([1.0], [1.0, 2.0], 1)
