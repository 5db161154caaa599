"""Is a pipeline schedule correct?  Dependencies, matching messages, no deadlock.

EN pipeline schedule check · RU проверка расписания конвейера · ZH 流水线调度检查

Given every stage's list of instructions (:mod:`.schedule`, or a learner's
own), :func:`problems` lists what is wrong, each problem naming the stage and
the instruction, and :func:`check_schedules` raises them as one ``ValueError``.  A
schedule of p stages, m micro-batches and v chunks per stage is correct when

1. every stage forwards and backwards each (micro-batch, chunk) exactly once —
   the backward whole (``Backward``) or split into its B (``BackwardInput``) and
   its W (``BackwardWeight``), each once (Qi et al. 2023) — and ends with exactly
   one ``OptimizerStep`` (the flush);
2. on each stage: ``RecvAct`` before its ``Forward`` (except on the first
   virtual stage), ``SendAct`` after it (except on the last), ``Backward``
   after its own ``Forward`` and after its ``RecvGrad`` (except on the last
   virtual stage), ``SendGrad`` after it (except on the first) — each of these
   messages exactly once; split, the same rules hold for B, and W comes after
   its own B (it reads what B kept);
3. every send is matched by exactly one receive on the neighbour;
4. replayed with blocking receives (and, with ``sends="rendezvous"``, sends
   that wait for their receive, as ``MPI_Ssend``), no stage waits forever: a
   stuck replay (the simulator's own, :func:`~.simulate.replay`) is reported with
   the cycle of stages waiting for each other.

The number of stages is ``len(schedules)``; micro-batches and chunks are read
from the Forward instructions; ``placement="v"`` checks ZB-V's chunks
(:func:`~.stage_loop.virtual_stage`).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence

from minipar.parallel.pipeline.simulate import (
    RECVS,
    SENDS,
    Deadlock,
    message_key,
    replay,
    split_cost,
)
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
    ends,
    virtual_stage,
)

_TYPES = (Forward, Backward, BackwardInput, BackwardWeight, SendAct, RecvAct, SendGrad,
          RecvGrad, OptimizerStep, ForwardBackward)


def _parts(ins: Sequence[Instruction]) -> list[tuple[int, Instruction]]:
    """(position, instruction), DualPipe's overlapped pair as its forward and its backward,
    both at the pair's position."""
    return [(i, y) for i, x in enumerate(ins) for y in (
        (x.forward, x.backward) if isinstance(x, ForwardBackward) else (x,))]


def _pair_problems(s: int, ins: Sequence[Instruction]) -> list[str]:
    """An overlapped pair is a Forward and a whole Backward (DeepSeek's F&B), of two
    different micro-batches or chunks."""
    return [f"stage {s}: {x} (position {i}) must pair a Forward with a Backward of another "
            f"micro-batch or chunk" for i, x in enumerate(ins) if isinstance(x, ForwardBackward)
            and (type(x.forward) is not Forward or type(x.backward) is not Backward
                 or (x.forward.mb, x.forward.chunk) == (x.backward.mb, x.backward.chunk))]


def _stage_problems(s: int, ins: Sequence[Instruction], p: int, mbs: list[int],
                    v: int, placement: str = "loop") -> list[str]:
    """Rules 1 and 2 on stage s."""
    out: list[str] = _pair_problems(s, ins)
    if out:
        return out
    where: dict[tuple[type, int, int], list[int]] = {}
    for i, x in _parts(ins):
        if isinstance(x, OptimizerStep):
            continue
        if not 0 <= x.chunk < v or x.mb not in mbs:
            out.append(f"stage {s}: {x} (position {i}) names a micro-batch or chunk outside "
                       f"micro-batches 0..{len(mbs) - 1}, chunks 0..{v - 1} (as the other stages)")
            continue
        where.setdefault((type(x), x.mb, x.chunk), []).append(i)
    steps = [i for i, x in enumerate(ins) if isinstance(x, OptimizerStep)]
    if len(steps) != 1 or steps[0] != len(ins) - 1:
        out.append(f"stage {s}: needs exactly one OptimizerStep(), as its last instruction "
                   f"(found {len(steps)} at positions {steps} of 0..{len(ins) - 1})")
    for mb in mbs:
        for c in range(v):
            vs = virtual_stage(s, c, p, placement)
            first, last = ends(vs, p, v, placement)
            split = (BackwardInput, mb, c) in where or (BackwardWeight, mb, c) in where
            if split and (Backward, mb, c) in where:
                out.append(f"stage {s}: {Backward(mb, c)} and a split B/W of the same "
                           f"micro-batch: run its backward whole or as B then W, not both")
                continue
            bx = BackwardInput if split else Backward
            need = {Forward: True, bx: True, RecvAct: not first, SendAct: not last,
                    RecvGrad: not last, SendGrad: not first}
            if split:
                need[BackwardWeight] = True
            pos = {}
            for t, needed in need.items():
                found = where.get((t, mb, c), [])
                name = repr(t(mb, c))
                if needed and len(found) != 1:
                    out.append(f"stage {s}: {name} appears {len(found)} times, needs exactly once")
                elif not needed and found:
                    edge = "first" if t in (RecvAct, SendGrad) else "last"
                    out.append(f"stage {s}: {name} at position {found[0]} talks past the "
                               f"{edge} stage of the pipeline (it is virtual stage {vs})")
                if len(found) == 1:
                    pos[t] = found[0]
            for before, after in ((RecvAct, Forward), (Forward, SendAct), (Forward, bx),
                                  (RecvGrad, bx), (bx, SendGrad), (bx, BackwardWeight)):
                if before in pos and after in pos and pos[before] >= pos[after]:
                    out.append(f"stage {s}: {after(mb, c)} at position {pos[after]} comes "
                               f"before {before(mb, c)} at position {pos[before]}")
    return out


def problems(schedules: Sequence[Sequence[Instruction]], sends: str = "buffered",
             placement: str = "loop") -> list[str]:
    """Every way ``schedules`` (one list per stage) breaks the rules above; [] when correct."""
    p = len(schedules)
    if p < 1:
        return ["no stages: pass one list of instructions per stage"]
    for s, ins in enumerate(schedules):
        for i, x in enumerate(ins):
            if not isinstance(x, _TYPES):
                return [(f"stage {s}: {x!r} at position {i} is not a pipeline instruction "
                        f"({', '.join(t.__name__ for t in _TYPES)})")]
    fwds = [[x for _, x in _parts(ins) if isinstance(x, Forward)] for ins in schedules]
    if not any(fwds):
        return ["no stage has a Forward: nothing to run"]
    # m and v as most stages see them (ties: the lower stage), so one odd stage is named
    m = Counter(max((x.mb for x in f), default=-1) + 1 for f in fwds).most_common(1)[0][0]
    v = Counter(max((x.chunk for x in f), default=-1) + 1 for f in fwds).most_common(1)[0][0]
    if m < 1 or v < 1:
        return ["most stages have no Forward: nothing to run"]
    mbs = list(range(m))
    out = [m for s in range(p) for m in _stage_problems(s, schedules[s], p, mbs, v, placement)]
    if out:
        return out
    posted = Counter(message_key(x, s, p, placement) for s in range(p) for x in schedules[s]
                     if isinstance(x, SENDS))
    taken = Counter(message_key(x, s, p, placement) for s in range(p) for x in schedules[s]
                    if isinstance(x, RECVS))
    if posted != taken:  # unreachable after rule 2 with a consistent p, v; kept as the contract
        return [f"message {k} sent {posted[k]} times, received {taken[k]} times"
                for k in sorted(set(posted) | set(taken)) if posted[k] != taken[k]]
    try:
        replay(schedules, split_cost(1, 1, 1), sends=sends, placement=placement)
    except Deadlock as e:
        return [str(e)]
    return []


def check_schedules(schedules: Sequence[Sequence[Instruction]], sends: str = "buffered",
                    placement: str = "loop") -> None:
    """Raise ``ValueError`` listing :func:`problems` (every one names the stage and the
    instruction); return None when the schedules are correct."""
    found = problems(schedules, sends, placement)
    if found:
        more = f"\n  ... and {len(found) - 10} more" if len(found) > 10 else ""
        raise ValueError("the pipeline schedule is wrong:\n  " + "\n  ".join(found[:10]) + more)
