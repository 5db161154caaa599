"""The serial model's figures draw from real data (minipar.viz.model)."""

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
    for fig in (vm.memory_by_category({"float64": led.bytes_by_category()}),
                vm.activations_per_piece(rows),
                vm.training_curves({"a": [2.0, 1.0, 0.5]}, best=0.1),
                vm.expert_load(m.moe_stats(cache))):
        assert isinstance(fig, Figure) and fig.axes
    with pytest.raises(ValueError, match="no MoE"):
        vm.expert_load([])
