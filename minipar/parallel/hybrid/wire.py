"""What travels between hybrid pipeline stages: PTD-P's scatter/gather, or the sequence shard —
что передаётся между стадиями — 阶段间传输的内容.

EN scatter/gather optimisation (pipeline p2p) · RU оптимизация scatter/gather между стадиями ·
ZH 流水线阶段间的 scatter/gather 优化

Narayanan et al. 2021 (PTD-P, arXiv 2104.04473), §4.1: with tensor parallelism the t
ranks of a tensor group hold the *same* activation at a stage boundary, so sending it
whole from each of them repeats it t times.  :class:`ScatterGather`: each sends its 1/t
of the flat activation, the receiving group all-gathers the pieces on ``tp`` (op
``pp_tp_gather``): b·s·h/t elements on the pipeline link, (t−1)/t·b·s·h on tp.
Under sequence parallelism (Korthikanti et al. 2022, arXiv 2205.05198) the blocks'
input is already a sequence shard, so that shard alone travels, nothing gathered
(:class:`SequenceShard`).  The plain pipeline's wire is
:class:`minipar.parallel.pipeline.p2p.Whole`; the link that uses a wire is
:class:`minipar.parallel.pipeline.p2p.StageLink`.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from minipar.backend import xp
from minipar.collectives import all_gather

__all__ = ["OP_GATHER", "ScatterGather", "SequenceShard"]

OP_GATHER = "pp_tp_gather"


class ScatterGather:
    """PTD-P §4.1 on tp rank ``r`` of ``t`` (``tp``: the tensor group's communicator)."""

    def __init__(self, tp: Any, t: int, r: int) -> None:
        self.tp, self.t, self.r = tp, t, r

    def to_wire(self, buf: Any) -> Any:
        """The tp ranks hold the same activation; each sends its 1/t of it."""
        k = buf.size // self.t
        return xp.ascontiguousarray(buf.reshape(-1)[self.r * k:(self.r + 1) * k])

    def wire_shape(self, shape: tuple[int, ...]) -> tuple[int, ...]:
        """1/t of the flat tensor arrives."""
        return (int(np.prod(shape)) // self.t,)

    def from_wire(self, buf: Any, shape: tuple[int, ...]) -> Any:
        """...and the receiving tp ranks all-gather the pieces (op ``pp_tp_gather``)."""
        with self.tp.operation(OP_GATHER):
            return all_gather(self.tp, buf).reshape(shape)


class SequenceShard:
    """Sequence parallelism over ``t`` ranks: the blocks' input is my sequence shard, sent
    as it is (nothing to gather)."""

    def __init__(self, t: int) -> None:
        self.t = t

    def to_wire(self, buf: Any) -> Any:
        return buf

    def wire_shape(self, shape: tuple[int, ...]) -> tuple[int, ...]:
        """(rows, s/t, h): my positions of the sequence."""
        return (shape[0], shape[1] // self.t, *shape[2:])

    def from_wire(self, buf: Any, shape: tuple[int, ...]) -> Any:
        return buf
