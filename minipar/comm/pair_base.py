"""What every forward/backward pair shares: the ``Pair`` base and its argument checks.

EN conjugate pair (base) · RU сопряжённая пара (основа) · ZH 共轭算子对（基类）

See :mod:`minipar.comm.pairs` for the pairs themselves and the idea.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from minipar.collectives import _base as B

REPLICATED, PER_RANK = "replicated", "per-rank"


def _axis(shape: tuple[int, ...], axis: int, what: str) -> int:
    """``axis`` normalised to 0..ndim-1, or a ValueError naming the shape."""
    nd = len(shape)
    if isinstance(axis, bool) or not isinstance(axis, (int, np.integer)) or not -nd <= axis < nd:
        raise ValueError(f"{what}: axis {axis!r} is out of range for an array of shape "
                         f"{shape} (0..{nd - 1}, or negative from the end)")
    return int(axis) % nd


def _array(x: Any) -> np.ndarray:
    a = np.asarray(x)
    B.dtype_code(a.dtype)  # unsupported dtype: ValueError before any message
    return a


class Pair:
    """A collective and its adjoint: ``forward(comm, x, **kw)``, ``backward(comm, dy, **kw)``.

    ``domain`` / ``codomain``: whether the forward's input / output is
    replicated (one vector, counted once in the inner product) or per-rank
    (each rank's array its own component); the backward maps the other way.
    ``bytes_sent(full_shape, itemsize, world, rank, **kw)`` -> (forward,
    backward) bytes rank ``rank`` sends, exactly, for the whole array's shape.
    """

    name = letter = megatron = ""  # counters' operation name; f, g, ...; Megatron's function
    forward_collective = backward_collective = ""
    domain = codomain = PER_RANK

    def __repr__(self) -> str:
        return (f"<pair {self.letter} ({self.name}): forward {self.forward_collective}, "
                f"backward {self.backward_collective}>")
