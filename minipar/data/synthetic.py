"""Synthetic data sets — синтетические наборы данных — 合成数据集.

Deterministic by ``(seed, step)`` (the contract of :mod:`minipar.data.batches`):
the global batch of step ``step`` is a pure function of the seed and the step,
so any rank can fetch any slice ``[lo, hi)`` of it — a data-parallel rank takes
its 1/N of the rows, a pipeline's first stage takes micro-batch m — and every
run, on any number of ranks, sees the same data as the serial run.

Two tasks on which learning is visible within a few hundred steps:

* ``modular_sum`` (GPT): sequences a₀, a₁ random in [0, V), then
  a_t = (a_{t−1} + a_{t−2}) mod V (a Fibonacci sequence mod V).  The model
  predicts the next token; all but the first target are determined by the
  two tokens before it, so the best possible mean loss is ln(V)/T (the
  first target, a₁, is a fair die): the model must learn to attend to the
  previous two positions and to add mod V.
* ``spirals`` (MLP): K interleaved 2-D spirals; the class of a point is its
  arm.  Not linearly separable, easy for a small MLP.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np  # host-side RNG only; batches are moved with to_device

from minipar.backend import to_device
from minipar.data.batches import batch_rng, batch_rows


def modular_sum(seed: int, step: int, batch_size: int, seq_len: int, vocab_size: int,
                lo: int = 0, hi: int | None = None) -> tuple[Any, Any]:
    """Rows [lo, hi) of the global batch: ``(tokens, targets)``, int64 (rows, seq_len),
    ``targets[:, t] = tokens[:, t + 1]`` continued one step past the end."""
    lo, hi = batch_rows(batch_size, lo, hi)
    if seq_len < 2 or vocab_size < 2:
        raise ValueError(f"need seq_len >= 2 and vocab_size >= 2, got {seq_len}, {vocab_size}")
    a = np.empty((batch_size, seq_len + 1), dtype=np.int64)
    a[:, :2] = batch_rng("modular_sum", seed, step).integers(0, vocab_size, (batch_size, 2))
    for t in range(2, seq_len + 1):  # a loop over time, generating data (not a hot path)
        a[:, t] = (a[:, t - 1] + a[:, t - 2]) % vocab_size
    return to_device(a[lo:hi, :-1].copy()), to_device(a[lo:hi, 1:].copy())


def modular_sum_best_loss(seq_len: int, vocab_size: int) -> float:
    """The lowest achievable mean cross-entropy: ln(V)/T (nats)."""
    return math.log(vocab_size) / seq_len


def spirals(seed: int, step: int, batch_size: int, n_classes: int = 3, noise: float = 0.1,
            lo: int = 0, hi: int | None = None, dtype: Any = "float64") -> tuple[Any, Any]:
    """Rows [lo, hi) of the global batch: points x (rows, 2) and arm labels y (rows,)."""
    lo, hi = batch_rows(batch_size, lo, hi)
    if n_classes < 2:
        raise ValueError(f"n_classes must be >= 2, got {n_classes}")
    r = batch_rng("spirals", seed, step)
    y = r.integers(0, n_classes, batch_size)
    t = r.uniform(0.05, 1.0, batch_size)
    angle = 2 * np.pi * y / n_classes + 4.0 * t + noise * r.standard_normal(batch_size)
    x = np.stack([t * np.cos(angle), t * np.sin(angle)], axis=1)
    return to_device(x[lo:hi].astype(dtype)), to_device(y[lo:hi].copy())
