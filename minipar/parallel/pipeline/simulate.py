"""The timeline a dedicated machine would have: pipeline schedules replayed with given costs.

EN pipeline simulation · RU моделирование конвейера · ZH 流水线模拟

When 4 ranks share 2 cores, the wall-clock trace of a pipeline says more
about the operating system than about the schedule.  The simulator rebuilds
the timeline from the schedules (:mod:`.schedule`) and a cost per
instruction, by ASAP list scheduling: every stage runs its list in order,
each instruction starting as soon as the stage is free and its inputs exist.

Rules (the executor's): a **receive** blocks until the matching message has
been sent; a **send** is ``buffered`` by default (MPI ``Isend``: it never waits
for the receiver; the message arrives ``comm_cost`` after the send starts,
and the sender is busy for that long), or ``rendezvous`` (MPI ``Ssend``, and
what a plain ``MPI_Send`` may do for large messages: it completes only when
the receiver has posted the matching receive).  A correct MPI program must
not depend on buffering, so :mod:`.check` tests both.  A send from a rank to
itself (interleaving on one stage) is a local hand-off and is always buffered.

A timeline is a list of :class:`Record` ``(stage, what, micro_batch, chunk,
start, end)`` — the record shape of every minipar timeline (DDP's, the MPI
executor's); ``what`` is ``forward``, ``backward``, ``send_act``,
``recv_act``, ``send_grad``, ``recv_grad`` or ``optimizer`` (micro_batch and
chunk None).  A receive's record spans the wait for its message.  DualPipe's overlapped
pair (:class:`~.stage_loop.ForwardBackward`) costs its own F&B and leaves two records,
its forward's and its backward's, one after the other inside it.

What the timeline shows — its bubble and its text chart — is
:mod:`.measure`'s (:func:`~.measure.bubble_fraction`, :func:`~.measure.chart`);
the checker (:mod:`.check`) replays with :func:`replay` to find deadlocks, so
this module imports neither.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from fractions import Fraction
from numbers import Real
from typing import NamedTuple

from minipar import checks
from minipar.parallel.pipeline.stage_loop import (
    Backward,
    BackwardInput,
    BackwardWeight,
    Forward,
    ForwardBackward,
    Instruction,
    OptimizerStep,
    RecvAct,
    RecvGrad,
    SendAct,
    SendGrad,
    rank_of,
    virtual_stage,
)

Cost = Callable[[Instruction, int], Real]
SENDS = (SendAct, SendGrad)
RECVS = (RecvAct, RecvGrad)
#: where a schedule puts its chunks (:func:`~.stage_loop.virtual_stage`)
PLACEMENTS = ("loop", "v", "dual")
WHAT = {Forward: "forward", Backward: "backward", BackwardInput: "backward_input",
        BackwardWeight: "backward_weight", SendAct: "send_act", RecvAct: "recv_act",
        SendGrad: "send_grad", RecvGrad: "recv_grad", OptimizerStep: "optimizer"}
#: the ``what`` of compute records (the work a stage does; everything else is waiting or
#: talking)
COMPUTE_WHAT = ("forward", "backward", "backward_input", "backward_weight")


class Record(NamedTuple):
    """One instruction on one stage: seconds (or any unit) from the step's start."""
    stage: int
    what: str
    micro_batch: int | None
    chunk: int | None
    start: Real
    end: Real


Timeline = list[Record]


class Deadlock(Exception):
    """The schedules stop with work left: ``waiting`` maps a stuck stage to (instruction, stage
    it waits for); ``cycle`` is a closed chain of stages each waiting for the next, if any."""

    def __init__(self, waiting: dict[int, tuple[Instruction, int | None]], cycle: list[int]):
        self.waiting, self.cycle = waiting, cycle
        parts = [f"stage {s} waits at {ins} for " + (f"stage {t}" if t is not None else
                 "a message no stage will send") for s, (ins, t) in sorted(waiting.items())]
        ring = " -> ".join(map(str, cycle + cycle[:1])) if cycle else "none"
        super().__init__(f"deadlock: {'; '.join(parts)} (cycle of waiting stages: {ring})")


def _whole(x: Fraction) -> Real:
    return int(x) if x.denominator == 1 else x  # ints keep the arithmetic fast and exact


def uniform_cost(forward: Real = 1, backward: Real = 2, optimizer: Real = 0, v: int = 1) -> Cost:
    """Every stage alike: a chunk-forward costs forward/v, a chunk-backward backward/v
    (v model chunks share the stage's layers), the optimizer step ``optimizer``.  A split
    backward costs half of ``backward`` for B and half for W (use :func:`split_cost`
    to set them apart)."""
    return split_cost(forward, Fraction(backward) / 2, Fraction(backward) / 2, optimizer, v)


def split_cost(forward: Real = 1, backward_input: Real = 1, backward_weight: Real = 1,
               optimizer: Real = 0, v: int = 1, overlapped: Real | None = None) -> Cost:
    """Every stage alike, the backward split (Qi et al. 2023): a chunk's F costs
    T_F/v, its B T_B/v, its W T_W/v, a whole ``Backward`` (T_B + T_W)/v; the step
    ``optimizer``.  ``split_cost(1, 1, 1)`` is the paper's Table 2 setting.
    ``overlapped``: DualPipe's F&B, an overlapped pair (:class:`ForwardBackward`) of a
    forward and a whole backward (per chunk /v; default F + B + W, one core's)."""
    f, b, w = (_whole(Fraction(x) / v) for x in (forward, backward_input, backward_weight))
    bw = _whole(Fraction(b) + Fraction(w))
    fb = _whole(Fraction(f) + bw if overlapped is None else Fraction(overlapped) / v)
    table = {Forward: f, BackwardInput: b, BackwardWeight: w, Backward: bw,
             ForwardBackward: fb}

    def cost(ins: Instruction, stage: int) -> Real:
        return table.get(type(ins), optimizer)
    return cost


def message_key(ins: Instruction, stage: int, p: int,
                placement: str = "loop") -> tuple[str, int, int, int]:
    """(kind, micro-batch, from virtual stage, to virtual stage) of a send or a receive;
    a send and a receive match when their keys are equal."""
    vs = virtual_stage(stage, ins.chunk, p, placement)
    if isinstance(ins, SendAct):
        return ("act", ins.mb, vs, vs + 1)
    if isinstance(ins, RecvAct):
        return ("act", ins.mb, vs - 1, vs)
    if isinstance(ins, SendGrad):
        return ("grad", ins.mb, vs, vs - 1)
    return ("grad", ins.mb, vs + 1, vs)


def _peer(key: tuple[str, int, int, int], p: int, sending: bool, placement: str) -> int:
    return rank_of(key[3] if sending else key[2], p, placement)


def replay(schedules: Sequence[Sequence[Instruction]], cost: Cost,
           comm_cost: Cost | None = None, sends: str = "buffered",
           placement: str = "loop") -> Timeline:
    """Replay every stage's list ASAP; return the timeline sorted by (start, stage).

    ``cost(ins, stage)`` times Forward, Backward and OptimizerStep; ``comm_cost(ins,
    stage)`` a send's transfer (default 0: instantaneous).  Raises :class:`Deadlock`
    when no stage can move and some have instructions left.  The lists are replayed as
    given: :func:`~.check.check_schedules` first tells whether they are a correct
    schedule at all (each forward and backward once, every message matched).
    ``placement``: ``"v"`` for ZB-V's chunks (:func:`~.stage_loop.virtual_stage`).
    """
    checks.one_of("sends", sends, ("buffered", "rendezvous"))
    checks.one_of("placement", placement, PLACEMENTS)
    p = len(schedules)
    pc, clock = [0] * p, [0] * p
    sent: dict[tuple, Real] = {}  # message key -> arrival time
    out: Timeline = []

    def rec(s: int, ins: Instruction, start: Real, end: Real) -> None:
        mb = getattr(ins, "mb", None)
        out.append(Record(s, WHAT[type(ins)], mb, getattr(ins, "chunk", None), start, end))
        clock[s], pc[s] = end, pc[s] + 1

    def current(s: int) -> Instruction | None:
        return schedules[s][pc[s]] if pc[s] < len(schedules[s]) else None

    moved = True
    while moved:
        moved = False
        for s in range(p):
            while (ins := current(s)) is not None:
                t = clock[s]
                if isinstance(ins, RECVS):
                    key = message_key(ins, s, p, placement)
                    if key not in sent:
                        break
                    rec(s, ins, t, max(t, sent.pop(key)))
                elif isinstance(ins, SENDS):
                    key = message_key(ins, s, p, placement)
                    dt = comm_cost(ins, s) if comm_cost else 0
                    peer = _peer(key, p, True, placement)
                    if sends == "rendezvous" and peer != s:
                        other = current(peer)
                        if other is None or not isinstance(other, RECVS) or \
                                message_key(other, peer, p, placement) != key:
                            break
                        t = max(t, clock[peer])
                    sent[key] = t + dt
                    rec(s, ins, t, t + dt)
                elif isinstance(ins, ForwardBackward):
                    for part, a, b in _pair(ins, cost(ins, s), cost(ins.forward, s),
                                            cost(ins.backward, s), t):
                        rec(s, part, a, b)
                    pc[s] -= 1
                else:
                    rec(s, ins, t, t + cost(ins, s))
                moved = True
    stuck = {s: current(s) for s in range(p) if current(s) is not None}
    if stuck:
        waiting = {}
        for s, ins in stuck.items():
            if isinstance(ins, RECVS + SENDS):
                key = message_key(ins, s, p, placement)
                peer = _peer(key, p, isinstance(ins, SENDS), placement)
                waiting[s] = (ins, peer if peer in stuck else None)
            else:
                waiting[s] = (ins, None)
        raise Deadlock(waiting, _cycle({s: t for s, (_, t) in waiting.items()}))
    return sorted(out, key=lambda r: (r.start, r.stage))


def _pair(ins: ForwardBackward, fb: Real, f: Real, b: Real, t: Real) -> list[tuple]:
    """An overlapped pair's two records, one after the other within its cost ``fb``: the
    forward's share f/(f + b) of it, then the backward's (F&B = F + B: as they ran)."""
    a = t + (_exact(fb * Fraction(f) / (f + b)) if f + b else 0)
    return [(ins.forward, t, a), (ins.backward, a, t + fb)]


def _exact(x: Real) -> Real:
    return _whole(x) if isinstance(x, Fraction) else x


def _cycle(waits_for: dict[int, int | None]) -> list[int]:
    """A cycle in the wait-for graph (each stage waits for at most one other), or []."""
    for start in waits_for:
        seen: list[int] = []
        s: int | None = start
        while s is not None and s not in seen:
            seen.append(s)
            s = waits_for.get(s)
        if s is not None:
            return seen[seen.index(s):]
    return []
