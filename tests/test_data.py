"""Synthetic data: deterministic by (seed, step), any slice of the global batch, the task's rule."""

from __future__ import annotations

import numpy as np
import pytest

from minipar.data import synthetic


def test_modular_sum_rule_and_shift() -> None:
    x, y = synthetic.modular_sum(0, 3, 8, 12, 10)
    assert x.shape == y.shape == (8, 12) and x.dtype == np.int64
    np.testing.assert_array_equal(y[:, :-1], x[:, 1:])
    np.testing.assert_array_equal(x[:, 2:], (x[:, 1:-1] + x[:, :-2]) % 10)
    np.testing.assert_array_equal(y[:, -1], (x[:, -1] + x[:, -2]) % 10)
    assert x.min() >= 0 and x.max() < 10


@pytest.mark.parametrize("task", ["modular_sum", "spirals"])
def test_same_seed_and_step_same_bits_and_slices_tile_the_batch(task: str) -> None:
    fetch = (lambda s, **kw: synthetic.modular_sum(5, s, 12, 6, 7, **kw)) if task == "modular_sum" \
        else (lambda s, **kw: synthetic.spirals(5, s, 12, **kw))
    a, b, c = fetch(2), fetch(2), fetch(3)
    for u, v in zip(a, b):
        np.testing.assert_array_equal(u, v)
    assert not np.array_equal(a[0], c[0])
    parts = [fetch(2, lo=lo, hi=hi) for lo, hi in ((0, 5), (5, 5), (5, 12))]
    for i in range(2):
        np.testing.assert_array_equal(np.concatenate([p[i] for p in parts]), a[i])


def test_spirals_classes_and_dtype() -> None:
    x, y = synthetic.spirals(0, 0, 300, n_classes=4, dtype="float32")
    assert x.shape == (300, 2) and x.dtype == np.float32 and set(np.unique(y)) == {0, 1, 2, 3}
    assert np.abs(x).max() < 1.5


def test_best_loss() -> None:
    assert synthetic.modular_sum_best_loss(16, 10) == pytest.approx(np.log(10) / 16)


def test_bad_requests() -> None:
    with pytest.raises(ValueError, match="inside the global batch"):
        synthetic.modular_sum(0, 0, 4, 5, 10, lo=2, hi=6)
    with pytest.raises(ValueError, match="seq_len"):
        synthetic.modular_sum(0, 0, 4, 1, 10)
    with pytest.raises(ValueError, match="step"):
        synthetic.spirals(0, -1, 4)
    with pytest.raises(ValueError, match="n_classes"):
        synthetic.spirals(0, 0, 4, n_classes=1)
