"""Messages between pipeline stages: activations forward, their gradients back.

EN pipeline point-to-point messages · RU обмен сообщениями между стадиями конвейера ·
ZH 流水线阶段间点对点通信

GPipe (Huang et al. 2018, arXiv 1811.06965), 1F1B and interleaved 1F1B
(Narayanan et al. 2021, arXiv 2104.04473).  Virtual stage ``vs`` of a
pipeline with p ranks and v chunks per rank lives on rank ``vs % p`` as its
chunk ``vs // p`` (:func:`~.stage_loop.virtual_stage`), so a stage's
``SendAct`` goes to virtual stage vs + 1 and its ``SendGrad`` to vs − 1.  The stage
loop (:class:`~.stage_loop.StageLoop`) is given a :class:`StageLink` and calls
``send(ins, vs, data)`` and ``recv(ins, vs, (rows, seq))`` for those instructions.

- **Send: non-blocking.**  ``Isend`` on the grid's ``pp_p2p`` communicator
  (Megatron's ``batch_isend_irecv``); the buffer is kept until
  ``OptimizerStep`` waits for every send of the step
  (:meth:`StageLink.wait`).  A rank never blocks on its own
  sends, so every schedule that passes :func:`~.check.check_schedules` runs without
  deadlock: only the receives wait, and the checker has proved that each
  receive's matching send comes earlier in its sender's list.
- **Receive: blocking.**  ``Recv`` of one micro-batch's (rows, s, h) tensor.
- **Pre-posted receives** (DualPipe's overlapped pair): :meth:`StageLink.prepost` posts
  an ``Irecv`` before the pair's computation; :meth:`StageLink.recv` then waits for it;
  :meth:`StageLink.progress` (``Test`` on every message in flight) is called between
  units, as DDP's buckets are progressed, so a message that arrives during a chunk's
  computation is completed there.  ``in_flight``: every message's (start, end) on this
  rank's clock, a send from its ``Isend`` to its completion, a receive from its post (or
  its blocking call) to its arrival — what :func:`minipar.overlap.hidden_fraction` reads.
- **The tag** ``pipeline_tag(kind, i, receiver's chunk)``
  (:mod:`minipar.comm.tags`) names the message: with interleaving two
  chunks of one rank receive from the same neighbour, and only the tag tells
  micro-batch i of chunk 0 from micro-batch i of chunk 1.
- **A rank's message to itself** (interleaving on one rank: its chunk c
  feeds its chunk c + 1) is handed over in memory, never sent.
- **What travels** is the link's *wire*, an object given to it: ``to_wire(buf)``
  before the send, ``wire_shape(shape)`` / ``from_wire(buf, shape)`` at the
  receiver.  The plain pipeline's is :class:`Whole` (the whole activation); the
  hybrid engine gives PTD-P's scatter/gather (§4.1: each of the t tensor-parallel
  ranks sends 1/t and the receivers all-gather) or, under sequence parallelism,
  the sequence shard alone (:mod:`minipar.parallel.hybrid.wire`).

**Bytes per rank per step** (p > 1, no interleaving, whole activations):
a middle stage sends m activations and m gradients of b_i·s·h elements,
an end stage m of one kind (:func:`minipar.plan.pipeline.pipeline_p2p_bytes_per_rank`).
The counters file them under ``pp_send_act`` and ``pp_send_grad``.
"""

from __future__ import annotations

import time
from typing import Any

from minipar.backend import xp
from minipar.comm.tags import pipeline_tag
from minipar.parallel.pipeline.stage_loop import RecvAct, SendAct, rank_of

__all__ = ["OP_ACT", "OP_GRAD", "StageLink", "Whole"]

OP_ACT, OP_GRAD = "pp_send_act", "pp_send_grad"


class Whole:
    """The pipeline's wire: the whole tensor travels, as it is."""

    def to_wire(self, buf: Any) -> Any:
        """What this rank sends for the tensor ``buf`` (here: all of it)."""
        return buf

    def wire_shape(self, shape: tuple[int, ...]) -> tuple[int, ...]:
        """The shape of what arrives for a tensor of ``shape``."""
        return shape

    def from_wire(self, buf: Any, shape: tuple[int, ...]) -> Any:
        """The tensor of ``shape`` rebuilt from what arrived."""
        return buf


class StageLink:
    """Stage ``stage``'s messages to its neighbours: ``StageLink(comm, stage, p, v, dtype,
    width, wire)``, ``comm`` the grid's ``pp_p2p`` communicator, p ranks of v chunks each,
    activations of ``dtype`` and ``width`` (d_model) features, ``wire`` what travels
    (:class:`Whole` or a composed strategy's).

    It holds the messages of the step under way: the self-sends of interleaving on one
    rank (``(kind, mb, to vs)`` -> buffer) and the sends in flight (requests, with their
    buffers); :meth:`begin` starts a step, :meth:`wait` ends its sends."""

    def __init__(self, comm: Any, stage: int, p: int, v: int, dtype: Any, width: int,
                 wire: Any, placement: str = "loop") -> None:
        self.comm, self.stage, self.p, self.v = comm, stage, p, v
        self.placement = placement  # "v", "dual": ZB-V's, DualPipe's (stage_loop)
        self.dtype, self.width, self.wire = dtype, width, wire
        self.begin()

    def begin(self) -> None:
        """A new step: no self-sends waiting, no sends in flight."""
        self._local: dict[tuple[str, int, int], Any] = {}
        self._sends: list[tuple[Any, Any]] = []
        self._posted: dict[tuple[str, int, int], tuple[Any, Any, tuple, list]] = {}
        #: this step's messages: [start, end, request] (perf_counter seconds; end None
        #: until the request is seen complete)
        self.in_flight: list[list[Any]] = []

    def _flight(self, req: Any) -> list[Any]:
        entry = [time.perf_counter(), None, req]
        self.in_flight.append(entry)
        return entry

    def progress(self) -> None:
        """Test every message in flight (MPI progresses inside calls): the ones done get
        their end time."""
        for entry in self.in_flight:
            if entry[1] is None and entry[2] is not None and entry[2].Test():
                entry[1] = time.perf_counter()

    def prepost(self, ins: Any, vs: int, rows_seq: tuple[int, int]) -> None:
        """Post the receive of ``ins`` (``RecvAct`` or ``RecvGrad`` into my virtual stage
        ``vs``) now, non-blocking; :meth:`recv` of the same message waits for it."""
        kind, frm = ("act", vs - 1) if isinstance(ins, RecvAct) else ("grad", vs + 1)
        rank, _ = self._peer(frm)
        if rank == self.stage:
            return
        shape = (*rows_seq, self.width)
        buf = xp.empty(self.wire.wire_shape(shape), dtype=self.dtype)
        req = self.comm.Irecv(buf, rank, pipeline_tag(kind, ins.mb, ins.chunk))
        self._posted[(kind, ins.mb, vs)] = (req, buf, shape, self._flight(req))

    def unreceived(self) -> list[tuple[str, int, int]]:
        """The self-sends nobody received, sorted (empty after a correct step)."""
        return sorted(self._local)

    def _peer(self, vs: int) -> tuple[int, int]:
        """(rank in the pp communicator, its chunk) of virtual stage ``vs``; in ZB-V's V
        chunk 0 of rank r is vs r and chunk 1 is vs 2p − 1 − r (DualPipe's ``"dual"`` too)."""
        if self.placement in ("v", "dual"):
            return rank_of(vs, self.p, "v"), int(vs >= self.p)
        return vs % self.p, vs // self.p

    def send(self, ins: Any, vs: int, data: Any) -> None:
        """``SendAct`` (to vs + 1) or ``SendGrad`` (to vs − 1) from my virtual stage ``vs``:
        non-blocking; ``data`` None: the Forward or Backward that makes it has not run."""
        act = isinstance(ins, SendAct)
        kind, to = ("act", vs + 1) if act else ("grad", vs - 1)
        if not 0 <= to < self.p * self.v:
            raise ValueError(f"stage {self.stage}: no virtual stage {to} to send to")
        if data is None:
            raise ValueError(f"stage {self.stage}: {ins} before the "
                             f"{'Forward' if act else 'Backward'} that makes it")
        rank, their_chunk = self._peer(to)
        buf = xp.ascontiguousarray(data.astype(self.dtype, copy=False))
        if rank == self.stage:  # interleaving on one rank: a local hand-off
            self._local[(kind, ins.mb, to)] = buf
            return
        buf = self.wire.to_wire(buf)
        with self.comm.operation(OP_ACT if act else OP_GRAD):
            req = self.comm.Isend(buf, rank, pipeline_tag(kind, ins.mb, their_chunk))
        self._sends.append((req, buf))  # the buffer lives until the send completes
        self._flight(req)

    def recv(self, ins: Any, vs: int, rows_seq: tuple[int, int]) -> Any:
        """``RecvAct`` (from vs − 1) or ``RecvGrad`` (from vs + 1) into my virtual stage
        ``vs``, one micro-batch of (rows, seq) positions: blocking; the tensor."""
        kind, frm = ("act", vs - 1) if isinstance(ins, RecvAct) else ("grad", vs + 1)
        if not 0 <= frm < self.p * self.v:
            raise ValueError(f"stage {self.stage}: no virtual stage {frm} to receive from")
        rank, _ = self._peer(frm)
        if rank == self.stage:
            buf = self._local.pop((kind, ins.mb, vs), None)
            if buf is None:
                raise ValueError(f"stage {self.stage}: {ins} before this rank sent it to "
                                 f"itself")
            return buf
        if (kind, ins.mb, vs) in self._posted:  # pre-posted: wait for it
            req, buf, shape, entry = self._posted.pop((kind, ins.mb, vs))
            req.Wait()
            entry[1] = time.perf_counter() if entry[1] is None else entry[1]
            return self.wire.from_wire(buf, shape)
        shape = (*rows_seq, self.width)
        buf = xp.empty(self.wire.wire_shape(shape), dtype=self.dtype)
        entry = self._flight(None)
        self.comm.Recv(buf, rank, pipeline_tag(kind, ins.mb, ins.chunk))
        entry[1] = time.perf_counter()
        return self.wire.from_wire(buf, shape)

    def wait(self) -> None:
        """Wait for every send of the step (their buffers may go after this)."""
        self.progress()
        self.comm.waitall([req for req, _ in self._sends])
        self._sends = []
        now = time.perf_counter()
        for entry in self.in_flight:
            entry[1] = now if entry[1] is None else entry[1]
