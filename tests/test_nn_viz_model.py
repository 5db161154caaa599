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


def test_expert_load_compares_states_row_by_row() -> None:
    """Before / after: one row per state, one column per MoE block, the bars are that state's counts."""
    m = GPT(GPTConfig(n_experts=3, moe_every=1, n_layer=2))
    x = np.arange(16).reshape(2, 8) % m.cfg.vocab_size
    states = {}
    for label, seed in (("seed 0", 0), ("seed 1", 1)):
        _, cache = m.forward(m.init(seed), x)
        states[label] = m.moe_stats(cache)
    fig = vm.expert_load(states)
    assert len(fig.axes) == 2 * 2  # 2 states x 2 MoE blocks
    for ax, st in zip(fig.axes, [s for v in states.values() for s in v]):
        assert [b.get_height() for b in ax.patches] == list(st["routed"]) + list(st["tokens_per_expert"])
    assert fig.axes[0].get_title().startswith("seed 0: block") and fig.axes[2].get_title().startswith("seed 1:")
    assert fig.axes[0].get_shared_y_axes().joined(fig.axes[0], fig.axes[3])  # heights compare across rows
    with pytest.raises(ValueError, match="same MoE blocks"):
        vm.expert_load({"a": states["seed 0"], "b": states["seed 1"][:1]})
    with pytest.raises(ValueError, match="no MoE"):
        vm.expert_load({"a": []})
