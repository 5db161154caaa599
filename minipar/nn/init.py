"""Partition-independent initialisation — инициализация, не зависящая от разбиения — 与切分无关的初始化.

Every full parameter is drawn from a generator seeded by ``(seed, name)``:

    rng = numpy.random.default_rng(SeedSequence([seed, crc32(name)]))

so its values depend on nothing else — not on the other parameters, their
order, or how the model is later split across 1, 2, 4 or 8 ranks.  A rank
that holds a slice initialises the full tensor and slices it (or, to save
memory, draws the same full tensor and keeps its part).  Values are drawn
in float64 on the host and then rounded to the requested dtype, so a
float32 or 16-bit model starts from the float64 model's weights, rounded.
"""

from __future__ import annotations

import zlib
from typing import Any

import numpy as np  # host-side RNG only: the same numbers under any backend

from minipar import checks
from minipar.backend import to_device


def name_rng(seed: int, name: str) -> np.random.Generator:
    """The generator of parameter ``name`` under ``seed`` (stable across runs and machines)."""
    checks.integer("seed", seed, 0)
    return np.random.default_rng(np.random.SeedSequence([int(seed), zlib.crc32(name.encode())]))


def normal(seed: int, name: str, shape: tuple[int, ...], std: float, dtype: Any) -> Any:
    """N(0, std²) values for parameter ``name``, on the active backend, in ``dtype``."""
    a = name_rng(seed, name).standard_normal(shape) * float(std)
    return to_device(a.astype(dtype))


def constant(shape: tuple[int, ...], value: float, dtype: Any) -> Any:
    """A parameter filled with ``value`` (LayerNorm gamma = 1, biases and beta = 0)."""
    return to_device(np.full(shape, float(value), dtype=dtype))
