"""Messages between pipeline stages: activations forward, their gradients back.

EN pipeline point-to-point messages · RU обмен сообщениями между стадиями конвейера ·
ZH 流水线阶段间点对点通信

GPipe (Huang et al. 2018, arXiv 1811.06965), 1F1B and interleaved 1F1B
(Narayanan et al. 2021, arXiv 2104.04473).  Virtual stage ``vs`` of a
pipeline with p ranks and v chunks per rank lives on rank ``vs % p`` as its
chunk ``vs // p`` (:func:`~.schedule.virtual_stage`), so a stage's
``SendAct`` goes to virtual stage vs + 1 and its ``SendGrad`` to vs − 1.

- **Send: non-blocking.**  ``Isend`` on the grid's ``pp_p2p`` communicator
  (Megatron's ``batch_isend_irecv``); the buffer is kept until
  ``OptimizerStep`` waits for every send of the step
  (:meth:`StageMessages._wait_sends`).  A rank never blocks on its own
  sends, so every schedule that passes :func:`~.check.check_schedules` runs without
  deadlock: only the receives wait, and the checker has proved that each
  receive's matching send comes earlier in its sender's list.
- **Receive: blocking.**  ``Recv`` of one micro-batch's (rows, s, h) tensor.
- **The tag** ``pipeline_tag(kind, i, receiver's chunk)``
  (:mod:`minipar.comm.tags`) names the message: with interleaving two
  chunks of one rank receive from the same neighbour, and only the tag tells
  micro-batch i of chunk 0 from micro-batch i of chunk 1.
- **A rank's message to itself** (interleaving on one rank: its chunk c
  feeds its chunk c + 1) is handed over in memory, never sent.
- **What travels** is a hook: :meth:`~StageMessages.to_wire` before the send,
  :meth:`~StageMessages.wire_shape` / :meth:`~StageMessages.from_wire` at the
  receiver.  The plain pipeline sends the whole activation; a composed
  strategy replaces them (:class:`minipar.parallel.hybrid.HybridParallel`:
  PTD-P's scatter/gather, §4.1 — each of the t tensor-parallel ranks sends
  1/t and the receivers all-gather, or, under sequence parallelism, the
  sequence shard alone).

**Bytes per rank per step** (p > 1, no interleaving, whole activations):
a middle stage sends m activations and m gradients of b_i·s·h elements,
an end stage m of one kind (:func:`minipar.plan.pipeline.pipeline_p2p_bytes_per_rank`).
The counters file them under ``pp_send_act`` and ``pp_send_grad``.
"""

from __future__ import annotations

from typing import Any

from minipar.backend import xp
from minipar.comm.tags import pipeline_tag

__all__ = ["OP_ACT", "OP_GRAD", "StageMessages"]

OP_ACT, OP_GRAD = "pp_send_act", "pp_send_grad"


class StageMessages:
    """The send and receive half of :class:`~.engine.PipelineParallel` (a mixin, its base).

    It reads the executor's state: ``p``, ``v``, ``stage``, ``p2p`` (the grid's
    ``pp_p2p`` communicator), ``act_dtype``, ``spec`` (``d_model``), the method
    ``_vs(chunk)`` (the chunk's virtual stage, checked), and for the step under way
    ``_x``, ``_cuts``, ``_box`` (tensors by (what, micro-batch, chunk)), ``_local``
    (self-sends) and ``_sends`` (requests in flight, with their buffers); it writes
    ``_box``, ``_local`` and ``_sends``.
    """

    # -- what travels: the hooks a composed strategy replaces ----------------------------
    def to_wire(self, buf: Any) -> Any:
        """What this rank sends for the tensor ``buf`` (here: all of it)."""
        return buf

    def wire_shape(self, shape: tuple[int, ...]) -> tuple[int, ...]:
        """The shape of what arrives for a tensor of ``shape``."""
        return shape

    def from_wire(self, buf: Any, shape: tuple[int, ...]) -> Any:
        """The tensor of ``shape`` rebuilt from what arrived."""
        return buf

    # -- the messages ---------------------------------------------------------------------
    def _peer(self, vs: int) -> tuple[int, int]:
        """(rank in the pp communicator, its chunk) of virtual stage ``vs``."""
        return vs % self.p, vs // self.p

    def _send(self, mb: int, chunk: int, kind: str, step: int) -> None:
        """``SendAct`` (kind "act", step +1) or ``SendGrad`` ("grad", −1): non-blocking."""
        vs = self._vs(chunk)
        to = vs + step
        if not 0 <= to < self.p * self.v:
            raise ValueError(f"stage {self.stage}: no virtual stage {to} to send to")
        key = ("out" if kind == "act" else "din", mb, chunk)
        data = self._box.pop(key, None)
        if data is None:
            raise ValueError(f"stage {self.stage}: Send{kind.title()}({mb}, {chunk}) before "
                             f"the {'Forward' if kind == 'act' else 'Backward'} that makes it")
        rank, their_chunk = self._peer(to)
        buf = xp.ascontiguousarray(data.astype(self.act_dtype, copy=False))
        if rank == self.stage:  # interleaving on one rank: a local hand-off
            self._local[(kind, mb, to)] = buf
            return
        buf = self.to_wire(buf)
        with self.p2p.operation(OP_ACT if kind == "act" else OP_GRAD):
            req = self.p2p.Isend(buf, rank, pipeline_tag(kind, mb, their_chunk))
        self._sends.append((req, buf))  # the buffer lives until the send completes

    def _recv(self, mb: int, chunk: int, kind: str, step: int) -> None:
        """``RecvAct`` (kind "act", from vs − 1) or ``RecvGrad`` ("grad", vs + 1): blocking."""
        vs = self._vs(chunk)
        frm = vs + step
        if not 0 <= frm < self.p * self.v:
            raise ValueError(f"stage {self.stage}: no virtual stage {frm} to receive from")
        rank, _ = self._peer(frm)
        if rank == self.stage:
            buf = self._local.pop((kind, mb, vs), None)
            if buf is None:
                raise ValueError(f"stage {self.stage}: Recv{kind.title()}({mb}, {chunk}) "
                                 f"before this rank sent it to itself")
        else:
            lo, hi = self._cuts[mb]
            shape = (hi - lo, self._x.shape[1], self.spec.d_model)
            buf = xp.empty(self.wire_shape(shape), dtype=self.act_dtype)
            self.p2p.Recv(buf, rank, pipeline_tag(kind, mb, chunk))
            buf = self.from_wire(buf, shape)
        self._box[("in" if kind == "act" else "dout", mb, chunk)] = buf

    def _wait_sends(self) -> None:
        """Wait for every send of the step (their buffers may go after this)."""
        self.p2p.waitall([req for req, _ in self._sends])
        self._sends = []
