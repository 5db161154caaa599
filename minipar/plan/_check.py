"""Input checks shared by every formula in :mod:`minipar.plan`.

A formula fed a nonsense size (zero ranks, a negative parameter count, a
ZeRO stage 5) raises a ``ValueError`` that names the argument and says what
it must be, instead of returning a number that looks plausible.
"""

from __future__ import annotations

import math
from numbers import Real


def _real(name: str, value: object) -> float:
    # the project rule is "bad input -> ValueError", wrong types included
    if isinstance(value, bool) or not isinstance(value, Real):
        raise ValueError(f"{name} must be a number, got {value!r}")  # noqa: TRY004
    v = float(value)
    if not math.isfinite(v):
        raise ValueError(f"{name} must be finite, got {value!r}")
    return v


def positive(name: str, value: object) -> float:
    """``value`` as a float; ValueError unless it is a finite number > 0."""
    v = _real(name, value)
    if v <= 0:
        raise ValueError(f"{name} must be > 0, got {value!r}")
    return v


def non_negative(name: str, value: object) -> float:
    """``value`` as a float; ValueError unless it is a finite number >= 0."""
    v = _real(name, value)
    if v < 0:
        raise ValueError(f"{name} must be >= 0, got {value!r}")
    return v


def count(name: str, value: object, minimum: int = 1) -> int:
    """``value`` as an int; ValueError unless it is a whole number >= ``minimum``."""
    v = _real(name, value)
    if v != int(v):
        raise ValueError(f"{name} must be a whole number, got {value!r}")
    if v < minimum:
        raise ValueError(f"{name} must be >= {minimum}, got {value!r}")
    return int(v)


def zero_stage(value: object) -> int:
    """A ZeRO stage: 0 (plain data parallelism), 1, 2 or 3."""
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= 3:
        raise ValueError(f"ZeRO stage must be 0, 1, 2 or 3, got {value!r}")
    return value
