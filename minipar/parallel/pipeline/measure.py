"""What a pipeline timeline shows: its bubble, its chart, and a measured run's timeline rebuilt.

EN pipeline bubble · RU пузырь конвейера · ZH 流水线气泡

**The bubble** (GPipe, Huang et al. 2018, arXiv 1811.06965; PTD-P, Narayanan
et al. 2021, arXiv 2104.04473), over the P stages of a timeline (a list of
:class:`~.simulate.Record`, simulated or measured), with makespan T = the end
of the last forward or backward (the pipeline flush; the optimizer step is
after it and not counted) and C = the summed durations of every forward and
backward (the work)::

    idle                 = P·T − C
    bubble_fraction      = idle / (P·T)      GPipe: (p − 1)/(m + p − 1)
    bubble_time_ratio    = idle / C          1F1B: (p − 1)/m;  interleaved: (1/v)(p − 1)/m

``bubble_time_ratio`` is the paper's "bubble time over ideal time": C/P is
the time of one stage's share of the work with no bubble (the ideal), and
idle/P the bubble per stage.  The two are the same number seen twice:
fraction = ratio/(1 + ratio).  With integer or ``Fraction`` costs both are
exact ``Fraction`` values.  :func:`chart` draws a timeline as text (the
drawings in the docstrings of :mod:`.schedule` and :mod:`.zero_bubble` are its output).

**The bubble, measured.**  The MPI executor (:mod:`.engine`) records every
instruction's start and end on every stage.  Two views of one run:

* **wall clock** — the records as they are.  When 4 ranks share 2 cores, a
  stage that waits for a core looks idle, and one that computes while its
  neighbour is descheduled looks busy: the trace mixes the schedule with the
  operating system;
* **rebuilt** — the timeline a machine with one core per stage would have:
  the simulator (:func:`~.simulate.replay`) replays the schedules with each
  instruction's *measured* cost (a forward's, a backward's, a send's own
  duration; receives cost nothing but their wait) and the schedules'
  dependencies.  Waiting for a message vanishes; uneven stages, slow sends and
  the schedule's own bubble remain.  A core taken away *during* an instruction
  still lengthens it: ``median=True`` smooths such one-off stalls (each
  instruction costs the median of its kind on its stage), and the executor's
  CPU-time records (``PipelineParallel.cpu_records``) leave them out.

Both are read by :func:`bubble_fraction` (idle share of P·T) and
:func:`bubble_time_ratio` (idle over ideal time), and set next to the papers'
formula for equal stages, written once in
:func:`minipar.plan.pipeline.bubble_formula`::

    ratio r = (1/v)(p − 1)/m   (gpipe, 1f1b: v = 1)      fraction = r/(1 + r)
    naive: r = p − 1, fraction (p − 1)/p

With equal integer costs the rebuilt bubble *is* the formula, exactly
(``Fraction``; tests/test_pipeline_parallel.py).  A run's timeline is written
as JSON for ``minipar bubble --from-run`` (:func:`write_timeline`; read back by
:func:`read_timeline`, or any list of records by :func:`load_run`); a third view,
:func:`rebuild_fastest`, replays each stage's fastest forward and backward.
"""

from __future__ import annotations

import json
import statistics
from collections.abc import Sequence
from fractions import Fraction
from numbers import Real
from pathlib import Path
from typing import Any

from minipar.parallel.pipeline.schedule import placement, schedules
from minipar.parallel.pipeline.stage_loop import (
    Backward,
    BackwardInput,
    BackwardWeight,
    Forward,
    ForwardBackward,
    Instruction,
)
from minipar.parallel.pipeline.simulate import COMPUTE_WHAT, WHAT, Record, replay
from minipar.plan.pipeline import bubble_formula, zero_bubble_formula

__all__ = ["FORMAT", "bubble_fraction", "bubble_time", "bubble_time_ratio", "chart",
           "in_flight", "iteration_time", "load_run", "measured_bubble", "read_timeline",
           "rebuild", "rebuild_compute", "rebuild_fastest", "stage_costs",
           "synced_bubble_fraction", "w_pending", "write_timeline"]

FORMAT = "minipar-pipeline-timeline"


# -- the bubble of a timeline, and its chart ------------------------------------------------
def _exact(a: Real, b: Real) -> Real:
    if isinstance(a, (int, Fraction)) and isinstance(b, (int, Fraction)):
        return Fraction(a) / b
    return a / b


def _work(timeline: Sequence[Record]) -> tuple[int, Real, Real]:
    """(stages P, iteration time S, work C) of a timeline's compute records: S is the
    longest per-stage span (a stage's first compute start to its last compute end)."""
    compute = [r for r in timeline if r.what in COMPUTE_WHAT]
    if not compute:
        raise ValueError("the timeline has no forward or backward record")
    stages = len({r.stage for r in timeline})
    first: dict[int, Real] = {}
    last: dict[int, Real] = {}
    for r in compute:
        first[r.stage] = min(first.get(r.stage, r.start), r.start)
        last[r.stage] = max(last.get(r.stage, r.end), r.end)
    span = max(last[s] - first[s] for s in first)
    return stages, span, sum(r.end - r.start for r in compute)


def iteration_time(timeline: Sequence[Record]) -> Real:
    """The longest per-stage span: first compute start to last compute end on one stage
    (Qi et al. 2023's measure; a stage steps its optimizer as soon as its own work is
    done, so a stage that starts late may also end late)."""
    return _work(timeline)[1]


def bubble_time(timeline: Sequence[Record]) -> Real:
    """Iteration time − one stage's work (C/P): the paper's bubble, in time units.
    1F1B (p − 1)(T_F + T_B + T_W); ZB-H1 (p − 1)(T_F + T_B − T_W); ZB-H2
    max(0, (p − 1)(T_F + T_B − 2T_W)); ZB-V 0 (Qi et al. 2023, Table 2)."""
    P, S, C = _work(timeline)
    return _exact(P * S - C, P)


def bubble_fraction(timeline: Sequence[Record]) -> Real:
    """Idle share of the pipeline's time: (P·S − C)/(P·S), S the iteration time
    (see the module docstring)."""
    P, S, C = _work(timeline)
    return _exact(P * S - C, P * S)


def bubble_time_ratio(timeline: Sequence[Record]) -> Real:
    """Bubble over ideal time: (P·S − C)/C, i.e. idle per stage over work per stage."""
    P, S, C = _work(timeline)
    return _exact(P * S - C, C)


def synced_bubble_fraction(timeline: Sequence[Record]) -> Real:
    """The bubble when every stage waits for all the others before its optimizer step (a
    global gradient norm or found-inf check): the step's makespan T (first compute start
    to last compute end, any stage) replaces the iteration time: (P·T − C)/(P·T).  The
    same as :func:`bubble_fraction` for GPipe, 1F1B and interleaved (stage 0 spans the
    whole step); larger for ZB-H2 and ZB-V, whose later stages end later."""
    compute = [r for r in timeline if r.what in COMPUTE_WHAT]
    if not compute:
        raise ValueError("the timeline has no forward or backward record")
    P = len({r.stage for r in timeline})
    T = max(r.end for r in compute) - min(r.start for r in compute)
    C = sum(r.end - r.start for r in compute)
    return _exact(P * T - C, P * T)


_LETTER = {"forward": "F", "backward": "B", "backward_input": "B", "backward_weight": "W"}


def chart(timeline: Sequence[Record], unit: Real = 1) -> str:
    """The timeline as text, one row per stage and two characters per ``unit`` of time:
    ``F3`` forward of micro-batch 3 (``f3`` on an odd chunk), ``B3``/``b3`` its backward
    (whole, or its B when split), ``W3``/``w3`` its W, ``. `` idle or communicating.
    Durations should be multiples of ``unit``; one shorter than a cell still takes one
    (drawn over its neighbour's)."""
    end = max(r.end for r in timeline)
    width = int(_exact(end, unit))
    stages = sorted({r.stage for r in timeline})
    rows = {s: [". "] * width for s in stages}
    for r in sorted(timeline, key=lambda r: r.start - r.end):  # the shortest drawn last, seen
        if r.what in COMPUTE_WHAT:
            letter = _LETTER[r.what]
            cell = (letter if not r.chunk % 2 else letter.lower()) + str(r.micro_batch % 10)
            lo = int(_exact(r.start, unit))
            for i in range(lo, min(width, max(int(_exact(r.end, unit)), lo + 1))):
                rows[r.stage][i] = cell
    return "\n".join(f"stage {s}  " + "".join(rows[s]).rstrip() for s in stages)


def in_flight(instructions: Sequence[Instruction], until: str = "B") -> int:
    """Peak number of (micro-batch, chunk) pairs whose Forward has run and whose backward
    (``Backward``, or its B: ``BackwardInput``) has not — their full activations held.
    1F1B and ZB-H1: p on stage 0 (m >= p); ZB-H2: 2p − 1 (m >= 2p − 1); GPipe: m.
    ``until="W"``: counted up to the W (``BackwardWeight``) instead — everything a stage
    keeps for a micro-batch: ZB-H1 p, ZB-H2 2p − 1 on every stage, as the paper's."""
    done = (Backward, BackwardInput) if until == "B" else (Backward, BackwardWeight)
    held: set[tuple[int, int]] = set()
    peak = 0
    for ins in [x for i in instructions for x in (
            (i.forward, i.backward) if isinstance(i, ForwardBackward) else (i,))]:
        if isinstance(ins, Forward):
            held.add((ins.mb, ins.chunk))
            peak = max(peak, len(held))
        elif isinstance(ins, done):
            held.discard((ins.mb, ins.chunk))
    return peak


def w_pending(instructions: Sequence[Instruction]) -> int:
    """Peak number of (micro-batch, chunk) pairs whose B has run and whose W has not: what
    the stage keeps *only for W* (the linears' inputs and output gradients), 0 when the
    backward is not split.  ZB-H1: min(s + 1, m) on stage s (s W's held back, counted
    right after the next B), so F to W stays within 1F1B's p; ZB-H2: 2s + 1 (m >= 2p − 1),
    so F to W stays within 2p − 1."""
    kept: set[tuple[int, int]] = set()
    peak = 0
    for ins in instructions:
        if isinstance(ins, BackwardInput):
            kept.add((ins.mb, ins.chunk))
            peak = max(peak, len(kept))
        elif isinstance(ins, BackwardWeight):
            kept.discard((ins.mb, ins.chunk))
    return peak


# -- a measured run's timeline, rebuilt ----------------------------------------------------


def _costs(records: Sequence[Record]) -> dict[tuple, Real]:
    out: dict[tuple, Real] = {}
    for r in records:
        key = (r.stage, r.what, r.micro_batch, r.chunk)
        if key in out:
            raise ValueError(f"two records of {key}: pass one step of one pipeline replica")
        out[key] = r.end - r.start
    return out


def _medians(cost: dict[tuple, Real]) -> dict[tuple, Real]:
    """Each cost replaced by the median over the micro-batches of its (stage, what, chunk)."""
    groups: dict[tuple, list[Real]] = {}
    for (stage, what, _mb, chunk), c in cost.items():
        groups.setdefault((stage, what, chunk), []).append(c)
    mid = {k: statistics.median_low(v) for k, v in groups.items()}  # a cost that ran: exact
    return {k: mid[(k[0], k[1], k[3])] for k in cost}


def _pairs(cost: Any) -> Any:
    """A cost function of recorded instructions, also for DualPipe's overlapped pair: its
    forward's cost plus its backward's (the executor records the two)."""
    def both(ins: Instruction, stage: int) -> Real:
        if isinstance(ins, ForwardBackward):
            return cost(ins.forward, stage) + cost(ins.backward, stage)
        return cost(ins, stage)
    return both


def rebuild(records: Sequence[Record], kind: str, p: int, m: int, v: int = 1,
            instructions: Sequence[Sequence[Instruction]] | None = None,
            median: bool = False) -> list[Record]:
    """The dedicated-machine timeline: every stage's list replayed ASAP with the measured
    cost of each compute instruction and each send (receives: their wait only).

    ``instructions``: the lists that ran, if not ``schedules(kind, p, m, v)``;
    ``median``: each instruction costs the median of its kind on its stage and chunk
    over the micro-batches (one-off stalls of a shared machine removed)."""
    scheds = [list(s) for s in instructions] if instructions is not None else \
        schedules(kind, p, m, v)
    cost = _costs(records)
    if median:
        cost = _medians(cost)

    def measured(ins: Instruction, stage: int) -> Real:
        key = (stage, WHAT[type(ins)], getattr(ins, "mb", None), getattr(ins, "chunk", None))
        if key not in cost:
            raise ValueError(f"no record of {ins} on stage {stage}: the records are not of "
                             f"this schedule ({kind}, p={p}, m={m}, v={v})")
        return cost[key]
    return replay(scheds, _pairs(measured), measured, placement=placement(kind))


def measured_bubble(records: Sequence[Record], kind: str, p: int, m: int, v: int = 1,
                    instructions: Sequence[Sequence[Instruction]] | None = None
                    ) -> dict[str, Any]:
    """Both views' bubble next to the formula: ``wall_clock``, ``rebuilt`` (fractions of
    P·S, S the iteration time), ``rebuilt_median`` (rebuilt from median costs),
    ``rebuilt_synced`` (rebuilt, every stage waiting for all before its step),
    ``rebuilt_compute`` (median compute costs, messages free: :func:`rebuild_compute`),
    ``wall_clock_ratio``, ``rebuilt_ratio`` (over ideal time), ``formula``,
    ``formula_ratio`` (equal stages); for the split schedules also ``costs`` (the
    median T_F, T_B, T_W of the records, per stage, averaged over the stages) and
    ``formula_measured``: Table 2 of Qi et al. 2023 with those costs (1f1b, zb-h1,
    zb-h2).  Exact ``Fraction`` values when the times are."""
    timeline = rebuild(records, kind, p, m, v, instructions)
    steady = rebuild(records, kind, p, m, v, instructions, median=True)
    f = bubble_formula(kind, p, m, v)
    out = {"wall_clock": bubble_fraction(records), "rebuilt": bubble_fraction(timeline),
           "rebuilt_median": bubble_fraction(steady),
           "rebuilt_synced": synced_bubble_fraction(timeline),
           "wall_clock_ratio": bubble_time_ratio(records),
           "rebuilt_ratio": bubble_time_ratio(timeline),
           "formula": f["fraction"], "formula_ratio": f["ratio"]}
    free = rebuild_compute(records, kind, p, m, v, instructions)
    out["rebuilt_compute"] = bubble_fraction(free)
    split = any(r.what == "backward_input" for r in records)
    if split:
        c = stage_costs(records)
        out["costs"] = c
        if kind in ("zb-h1", "zb-h2"):
            out["formula_measured"] = zero_bubble_formula(
                kind, p, m, c["forward"], c["backward_input"], c["backward_weight"])["fraction"]
    return out


def rebuild_compute(records: Sequence[Record], kind: str, p: int, m: int, v: int = 1,
                    instructions: Sequence[Sequence[Instruction]] | None = None
                    ) -> list[Record]:
    """The dedicated machine as the papers' formulas see it: each compute instruction costs
    the median of its kind on its stage and chunk, messages and the step cost nothing."""
    scheds = [list(s) for s in instructions] if instructions is not None else \
        schedules(kind, p, m, v)
    cost = _medians(_costs(records))

    def measured(ins: Instruction, stage: int) -> Real:
        key = (stage, WHAT[type(ins)], getattr(ins, "mb", None), getattr(ins, "chunk", None))
        if WHAT[type(ins)] not in COMPUTE_WHAT:
            return 0
        if key not in cost:
            raise ValueError(f"no record of {ins} on stage {stage}: the records are not of "
                             f"this schedule ({kind}, p={p}, m={m}, v={v})")
        return cost[key]
    return replay(scheds, _pairs(measured), placement=placement(kind))


def stage_costs(records: Sequence[Record]) -> dict[str, float]:
    """T_F, T_B, T_W (and T_B + T_W as ``backward``) of one stage's share of a step: per
    stage the median of each kind over its micro-batches, times its chunks, averaged over
    the stages — the costs Table 2's formulas take."""
    per: dict[tuple[int, str], list[Real]] = {}
    chunks: dict[int, set] = {}
    for r in records:
        if r.what in COMPUTE_WHAT:
            per.setdefault((r.stage, r.what), []).append(r.end - r.start)
            chunks.setdefault(r.stage, set()).add(r.chunk or 0)
    stages = sorted(chunks)
    out = {}
    for what in ("forward", "backward_input", "backward_weight"):
        vals = [statistics.median(per[s, what]) * len(chunks[s]) for s in stages
                if (s, what) in per]
        if vals:
            out[what] = float(sum(vals) / len(vals))
    if "backward_input" in out:
        out["backward"] = out["backward_input"] + out["backward_weight"]
    return out


def write_timeline(path: str | Path, records: Sequence[Record], schedule: str, p: int, m: int,
                   v: int = 1) -> None:
    """The records as one JSON object (``minipar bubble --from-run FILE`` reads it):
    ``{"format", "version", "schedule", "p", "m", "v", "unit": "s", "records": [...]}``."""
    doc = {"format": FORMAT, "version": 1, "schedule": schedule, "p": p, "m": m, "v": v,
           "unit": "s", "records": [{**r._asdict(), "start": float(r.start),
                                     "end": float(r.end)} for r in records]}
    Path(path).write_text(json.dumps(doc, indent=1) + "\n")


def read_timeline(path: str | Path) -> tuple[list[Record], dict[str, Any]]:
    """(records, meta) of a file :func:`write_timeline` wrote; ValueError if it is not one."""
    try:
        doc = json.loads(Path(path).read_text())
    except (OSError, json.JSONDecodeError) as e:
        raise ValueError(f"{path}: not a readable pipeline timeline ({e})") from None
    if not isinstance(doc, dict) or doc.get("format") != FORMAT:
        raise ValueError(f"{path}: not a pipeline timeline (written by minipar run pp "
                         f"--timeline FILE)")
    meta, records = load_run(path)
    return records, {k: meta[k] for k in ("schedule", "p", "m", "v", "unit")}


def load_run(path: str | Path) -> tuple[dict[str, Any], list[Record]]:
    """(meta, records) of a recorded pipeline step.

    The file is one JSON object ``{"schedule", "p", "m", "v", "records": [{"stage", "what",
    "micro_batch", "chunk", "start", "end"}, ...]}`` (times in seconds, any common origin;
    ``"timeline"`` is accepted for ``"records"``; other keys are kept in meta), or a bare list
    of records (then meta is read off the records: p stages, m micro-batches, v chunks).
    """
    try:
        data = json.loads(Path(path).read_text())
    except OSError as e:
        raise ValueError(f"--from-run {path}: cannot read it: {e.strerror or e}") from None
    except ValueError as e:
        raise ValueError(f"--from-run {path}: not JSON ({e})") from None
    meta = dict(data) if isinstance(data, dict) else {}
    raw = data if isinstance(data, list) else meta.pop("records", meta.pop("timeline", None))
    if not isinstance(raw, list) or not raw:
        raise ValueError(f"--from-run {path}: no records (a JSON object with a 'records' list "
                         "of {stage, what, micro_batch, chunk, start, end})")
    try:
        recs = [Record(int(r["stage"]), str(r["what"]), r.get("micro_batch"), r.get("chunk"),
                       float(r["start"]), float(r["end"])) for r in raw]
    except (KeyError, TypeError, ValueError, AttributeError) as e:
        raise ValueError(f"--from-run {path}: a record lacks stage, what, start or end "
                         f"({type(e).__name__}: {e})") from None
    compute = [r for r in recs if r.what in COMPUTE_WHAT]
    if not compute:
        raise ValueError(f"--from-run {path}: no forward or backward record")
    meta.setdefault("p", max(r.stage for r in recs) + 1)
    meta.setdefault("m", max(r.micro_batch for r in compute) + 1)
    meta.setdefault("v", max(r.chunk or 0 for r in compute) + 1)
    return meta, recs


def rebuild_fastest(records: Sequence[Record], kind: str, p: int, m: int, v: int = 1
                    ) -> list[Record]:
    """The dedicated machine's timeline with each stage's *fastest* forward, backward and
    optimizer step of the recorded step, messages instantaneous: the stalls of a shared
    machine (another process on the core: the same work, several times slower) removed,
    uneven stages kept — the fastest run of a piece of work is its uncontended cost, as
    ``timeit`` reports the minimum."""
    by: dict[tuple[int, str], list[float]] = {}
    for r in records:
        if r.what in (*COMPUTE_WHAT, "optimizer"):
            by.setdefault((r.stage, r.what), []).append(r.end - r.start)
    fastest = {k: min(ts) for k, ts in by.items()}

    def cost(ins: Any, stage: int) -> float:
        what = WHAT[type(ins)]
        if (stage, what) not in fastest:
            raise ValueError(f"the recorded run has no {what} on stage {stage}: it is not a "
                             f"{kind} step with p={p}, m={m}, v={v}")
        return fastest[stage, what]
    return replay(schedules(kind, p, m, v), _pairs(cost), placement=placement(kind))