"""The serial model's figures draw the data they are given (minipar.viz.model): bar heights,
widths and curves are checked against the ledger, the measured activations and the MoE statistics."""

from __future__ import annotations

import matplotlib

matplotlib.use("Agg")

import numpy as np
import pytest
from matplotlib.figure import Figure

from minipar.memory import activation_pieces, nbytes, training_ledger
from minipar.nn import GPT, GPTConfig
from minipar.precision import ModelStates
from minipar.viz import model as vm


def test_figures_and_table() -> None:
    m = GPT(GPTConfig(n_experts=3, moe_every=2))
    p = m.init(0)
    text = vm.parameter_table(m.param_shapes())
    assert "blocks.1.moe.router" in text and f"{m.n_params():,}" in text
    assert "more" in vm.parameter_table(m.param_shapes(), max_rows=3)
    x = np.zeros((2, 8), np.int64)
    _, cache = m.forward(p, x)
    led = training_ledger(ModelStates("float64", p), cache)
    rows = [(n, nbytes(s, exclude=p)) for n, s in activation_pieces(cache)]
    by_cat = led.bytes_by_category()
    mib = 2.0**20

    fig = vm.memory_by_category({"float64": by_cat})  # stacked: the bars add up to the ledger
    assert isinstance(fig, Figure)
    heights = [bar.get_height() for bar in fig.axes[0].patches]
    assert sum(heights) == pytest.approx(sum(by_cat.values()) / mib) and sum(by_cat.values()) > 0

    fig = vm.activations_per_piece(rows)  # one bar per piece, its measured bytes
    widths = [bar.get_width() for bar in fig.axes[0].patches]
    assert widths == pytest.approx([b / mib for _, b in rows]) and len(rows) >= 3

    fig = vm.training_curves({"a": [2.0, 1.0, 0.5]}, best=0.1)
    assert list(fig.axes[0].lines[0].get_ydata()) == [2.0, 1.0, 0.5]

    stats = m.moe_stats(cache)
    fig = vm.expert_load(stats)  # one panel per MoE block: first choices, then kept tokens
    assert len(fig.axes) == len(stats) >= 1
    for ax, st in zip(fig.axes, stats):
        bars = [bar.get_height() for bar in ax.patches]
        n_exp = len(st["routed"])
        assert bars == list(st["routed"]) + list(st["tokens_per_expert"]) and n_exp == 3
    with pytest.raises(ValueError, match="no MoE"):
        vm.expert_load([])
