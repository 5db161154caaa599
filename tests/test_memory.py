"""The memory ledger equals the arrays' real sizes and agrees with tracemalloc."""

from __future__ import annotations

import numpy as np
import pytest

from minipar.memory import Ledger, activation_pieces, measure, nbytes, training_ledger
from minipar.nn import GPT, GPTConfig
from minipar.precision import ModelStates, get

CFG = {"vocab_size": 64, "block_size": 32, "n_layer": 2, "n_head": 4, "d_model": 64}


def test_measure_sees_numpy_arrays() -> None:
    with measure() as r:
        a = np.ones(1_000_000)
        del a
        b = np.ones(250_000)
    assert 8_000_000 <= r.peak_bytes < 8_000_000 + 10_000
    assert 2_000_000 <= r.current_bytes < 2_000_000 + 10_000
    del b


def test_views_count_once_and_exclusion() -> None:
    a = np.zeros(100)
    tree = {"x": a[:10], "y": [a[10:].reshape(9, 10), (a, 3)], "z": np.zeros(5, np.float32)}
    assert nbytes(tree) == 800 + 20
    assert nbytes(tree, exclude={"p": a}) == 20
    led = Ledger(rank=3)
    assert led.add("params", "a", a) == 800
    assert led.add("activations", "tree", tree) == 20  # a already recorded
    assert led.bytes_by_category() == {"params": 800, "grads": 0, "optimizer states": 0,
                                       "activations": 20} and led.total() == 820
    with pytest.raises(ValueError, match="unknown category"):
        led.add("weights", "a", a)


@pytest.mark.parametrize("precision", ["float64", "mixed"])
def test_ledger_matches_arrays_and_tracemalloc(precision: str) -> None:
    model = GPT(GPTConfig(**CFG, n_experts=2, dtype=get(precision).model_dtype))
    init = GPT(GPTConfig(**CFG, n_experts=2)).init(0)
    x = np.random.default_rng(0).integers(0, 64, (4, 32))
    with measure() as states_region:
        states = ModelStates(precision, init, "adamw")
    model.forward(states.param_views(), x)  # warm caches (causal mask)
    with measure() as fwd:
        logits, cache = model.forward(states.param_views(), x)
    led = training_ledger(states, cache)
    by = led.bytes_by_category()
    psi = model.n_params()
    per = 16 if precision == "mixed" else 32
    assert by["params"] + by["grads"] + by["optimizer states"] == per * psi
    assert by["params"] == states.params.nbytes and by["grads"] == states.grads.nbytes
    # tracemalloc saw the model states being allocated: the ledger plus small Python objects
    model_states = per * psi
    assert model_states <= states_region.current_bytes < model_states + 20_000
    # what forward left allocated = the activations it saved + the logits (+ small objects)
    held = by["activations"] + logits.nbytes
    assert held <= fwd.current_bytes < held + 20_000, (held, fwd.current_bytes)
    assert fwd.peak_bytes >= fwd.current_bytes
    assert [n for n, _ in activation_pieces(cache)] == ["embed", "block 0", "block 1", "head"]
