"""Grader of the pipeline-schedule exercises (GPipe; 1F1B, ZB-H1, DualPipe-V reuse it): checker, simulator, MPI.

EN pipeline schedule grader · RU проверка расписания конвейера · ZH 流水线调度评分

The learner writes ``schedule(stage, p, m)``: the list of instructions
(:mod:`minipar.parallel.pipeline.stage_loop`) one stage runs.  A schedule is
plain data, so most of the grading needs no MPI; every rank computes it, rank
0's findings are reported:

1. **correct** — for p = 1..4 (and N) stages and m = 1..8 micro-batches,
   :func:`minipar.parallel.pipeline.check.problems`: every forward and
   backward once, receives before the compute that needs them, every send
   matched, no deadlock (the replay names the cycle of waiting stages);
2. **the schedule's rule** — GPipe (Huang et al. 2018, arXiv 1811.06965):
   all m forwards before any backward, so every stage holds m micro-batches;
   1F1B (Narayanan et al. 2021, arXiv 2104.04473): at most p − s on stage s;
   ZB-H1 (Qi et al. 2023, arXiv 2401.10241, §3): the same, counted from F to B,
   and at most p micro-batches from F to W on every stage (1F1B's peak: the W's
   must not pile up after the last F);
3. **the bubble** — on the simulator with equal costs (forward 1, backward
   2), exactly (Fractions): GPipe (p − 1)/(m + p − 1) of the step, 1F1B
   (p − 1)/m of the ideal time; ZB-H1 with the paper's T_F = T_B = T_W = 1 and
   its span bubble (:func:`~minipar.parallel.pipeline.measure.bubble_time`): at
   most (p − 1)(T_F + T_B − T_W) for m ≥ p (Table 2), below that at most the
   simulator's value for minipar's own zb-h1; a bubble that is 1F1B's
   (p − 1)(T_F + T_B + T_W), or a backward never split, is named;
   DualPipe-V (DeepSeek-AI 2024, arXiv 2412.19437; two chunks per rank in ZB-V's V,
   m >= 2p): each rank's idle time with F = 1, B = 2, W = 1, F&B = F + B at most
   what minipar's own dualpipev reaches, the table's (PP/2 − 1)(F&B + B − 3W), and at
   most PP + 1 = 2p + 1 chunk-activations in flight, with as many overlapped pairs as
   DeepSeek's steady state has (a pair whose halves depend on each other, one micro-batch,
   is named);
4. **real ranks** — on N ranks, each rank runs *its own stage's list* through
   minipar's MPI pipeline executor
   (:class:`minipar.parallel.pipeline.engine.PipelineParallel`, its
   ``instructions=`` option) for two AdamW steps of a small GPT (float64);
   the parameters must equal the serial run's within the shared parity
   tolerance (:data:`minipar.parallel.parity.TOLERANCE` × the distance
   trained).  Only schedules that passed check 1 for (N, m) are run: a
   deadlock is found by the replay, not by hanging ranks.

How it fits the exercise framework (:mod:`minipar.exercises.worker`, which
calls ``FUNCTION(comm, x, **kwargs)`` and compares an array with the oracle's):
the learner's file ends with a fixed ``run_stage(comm, x, **case)`` that
hands the learner's ``schedule`` to :func:`run_stage` here; the case (made by
the exercise's grader) names the schedule it is graded as.  A "rules" case
returns ``[0.]`` when nothing was found, else ``[1.]`` and the findings, as
JSON, through ``diagnose``; a "run" case returns the trained parameters.
The learner writes data, not communication, so the worker's "written by you"
check of minipar.collectives is off (``Exercise.writes_communication``: the
grader's executor sums the loss with it); copying the package's schedule is
caught separately (:func:`copied`).
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from typing import Any

import numpy as np

from minipar.exercises.grading import Check
from minipar.exercises.judging import Records

KIND = "gpipe"
MS = tuple(range(1, 9))  #: micro-batch counts every rules case tries
#: model chunks per rank and where they sit (stage_loop.virtual_stage), per schedule
CHUNKS, PLACE = {"dualpipev": 2}, {"dualpipev": "v"}


def ms_for(kind: str, p: int) -> tuple[int, ...]:
    """The micro-batch counts a rules case tries: 1..8; DualPipe-V m >= 2p (its PP)."""
    return (2 * p, 2 * p + 1, 3 * p + 2) if kind == "dualpipev" else MS
FIRST_STEP = (
    "stage s's forwards: for each micro-batch i, RecvAct(i) (not on stage 0), Forward(i), "
    "SendAct(i) (not on the last stage); then the backwards in reverse, then OptimizerStep()."
)
NAMES = {
    "check": "a correct schedule for p = 1..4 stages, m = 1..8: every dependency, every "
             "message matched, no deadlock",
    "bubble": {"gpipe": "bubble on the simulator (forward 1, backward 2) = (p - 1)/(m + p - 1) "
                        "of the step, exactly",
               "1f1b": "bubble on the simulator (forward 1, backward 2) = (p - 1)/m of the "
                       "ideal time, exactly",
               "zb-h1": "bubble on the simulator (T_F = T_B = T_W = 1, the longest stage's "
                        "span) at most ZB-H1's (p - 1)(T_F + T_B - T_W) for m >= p, a third "
                        "of 1F1B's (below m = p: the simulator's ZB-H1 value)",
               "dualpipev": "idle per rank on the simulator (F 1, B 2, W 1, F&B = F + B) at "
                            "most DualPipe-V's (PP/2 - 1)(F&B + B - 3W), PP = 2p"},
    "rule": {"gpipe": "GPipe: all m forwards before any backward (m micro-batches in flight)",
             "1f1b": "1F1B: at most p - s micro-batches in flight on stage s (never more than p)",
             "zb-h1": "ZB-H1: 1F1B's memory, at most p - s micro-batches between F and B on "
                      "stage s, at most p between F and W",
             "dualpipev": "DualPipe-V: at most PP + 1 = 2p + 1 chunk-activations in flight, "
                          "and DeepSeek's overlapped pairs (a forward of one micro-batch with "
                          "the backward of another)"},
    "own": "written by you (not a call to minipar.parallel.pipeline.schedule)",
}
_notes: dict[str, str] = {}  # case label -> findings, for diagnose (same process, rank side)


# -- the cases ----------------------------------------------------------------------
def cases_for(kind: str, n: int, run_ms: tuple[int, ...]) -> list[dict]:
    """The exercise's cases: the schedule ``kind`` is graded for is in every case (never
    taken from the learner's file)."""
    rules = [{"kind": kind, "what": "rules", "p": p} for p in sorted({1, 2, 3, 4, n})]
    return rules + [{"kind": kind, "what": "run", "p": n, "m": m} for m in sorted(set(run_ms))]


def cases(n: int) -> list[dict]:
    return cases_for(KIND, n, (1, n + 1, 2 * n + 1))


def label(case: dict) -> str:
    if case["what"] == "rules":
        ms = ms_for(case["kind"], case["p"])
        return (f"p = {case['p']} stages, m = {ms[0]}..{ms[-1]} (checker and simulator)"
                if ms != MS else f"p = {case['p']} stages, m = 1..{MS[-1]} (checker and "
                "simulator)")
    return f"{case['p']} rank{'s' if case['p'] != 1 else ''}, m = {case['m']} (MPI executor)"


def make_input(case: dict, rank: int, size: int) -> tuple[np.ndarray, dict]:
    return np.zeros(1), dict(case)


# -- the rank side --------------------------------------------------------------------
def _lists(fn: Callable, p: int, m: int) -> tuple[list[list], str | None]:
    """Every stage's list from the learner's ``fn``; (lists, what is wrong with their type)."""
    out = []
    for s in range(p):
        got = fn(s, p, m)
        if not isinstance(got, (list, tuple)):
            return [], (f"schedule({s}, {p}, {m}) returned {type(got).__name__}, not a list of "
                        "instructions")
        out.append(list(got))
    return out, None


def rule(kind: str, lists: list[list], p: int, m: int) -> str | None:
    """The schedule's own rule (in flight), in words, or None."""
    from minipar.parallel.pipeline.measure import in_flight

    if kind == "dualpipev":
        return dual_rule(lists, p, m)
    for s, ins in enumerate(lists):
        held = in_flight(ins)
        if kind == "gpipe" and held != m:
            return (f"p={p}, m={m}: stage {s} holds at most {held} micro-batches at once: a "
                    f"Backward runs before all {m} Forwards. GPipe runs every forward of the "
                    "mini-batch, then every backward (that is what makes it simple, and "
                    "memory-hungry: m micro-batches' activations at the turn)")
        if kind == "1f1b" and held > min(p - s, m):
            return (f"p={p}, m={m}: stage {s} holds {held} micro-batches at once; 1F1B holds at "
                    f"most p - s = {min(p - s, m)} there: p - s - 1 = {p - s - 1} warm-up "
                    "forwards, then one forward, one backward (never more than p in flight; "
                    "GPipe holds all m)")
        if kind == "zb-h1" and held > min(p - s, m):
            return (f"p={p}, m={m}: stage {s} holds {held} micro-batches between their F and "
                    f"their B at once; ZB-H1 keeps 1F1B's memory, at most p - s = "
                    f"{min(p - s, m)} there: p - s - 1 = {p - s - 1} warm-up forwards, then "
                    "one F, one B (extra warm-up forwards are ZB-H2, which holds 2p - 1)")
        if kind == "zb-h1" and (kept := in_flight(ins, until="W")) > p:
            return (f"p={p}, m={m}: stage {s} holds {kept} micro-batches between F and W (their "
                    "inputs and output gradients kept for W); ZB-H1 holds at most p = "
                    f"{p}, as 1F1B: run each W soon after its B, s B's late on stage s (W's "
                    "piled up after the last F fill the cool-down too, but hold up to m)")
    return None


def bubble(kind: str, lists: list[list], p: int, m: int) -> str | None:
    """The simulated bubble (forward 1, backward 2) against the formula, in words, or None."""
    from minipar.parallel.pipeline.measure import bubble_fraction, bubble_time_ratio
    from minipar.parallel.pipeline.simulate import replay, uniform_cost
    from minipar.plan.pipeline import bubble_formula

    if kind == "zb-h1":
        return zb_bubble(lists, p, m)
    if kind == "dualpipev":
        return dual_bubble(lists, p, m)
    tl = replay(lists, uniform_cost(1, 2))
    formula = bubble_formula(kind, p, m)
    if kind == "gpipe":
        got, want, what = bubble_fraction(tl), formula["fraction"], "of the step"
    else:
        got, want, what = bubble_time_ratio(tl), formula["ratio"], "of the ideal time"
    if got == want:
        return None
    return (f"p={p}, m={m}: on the simulator the bubble is {got} = {float(got):.3f} {what}, "
            f"the formula {want} = {float(want):.3f}: the stages wait for each other more than the schedule needs (e.g. "
            "backwards in a different order on neighbouring stages"
            + (", or too few warm-up forwards)" if kind == "1f1b" else ")"))


def zb_bubble(lists: list[list], p: int, m: int) -> str | None:
    """ZB-H1's bubble (Qi et al. 2023, Table 2): on the simulator with T_F = T_B = T_W = 1,
    the iteration time (the longest stage's span) − m(T_F + T_B + T_W), at most
    (p − 1)(T_F + T_B − T_W) for m >= p; below, at most what minipar's own zb-h1 reaches.
    In words, or None; 1F1B's bubble and a backward never split are named."""
    from minipar.parallel.pipeline.measure import bubble_time
    from minipar.parallel.pipeline.schedule import schedules
    from minipar.parallel.pipeline.stage_loop import BackwardInput
    from minipar.parallel.pipeline.simulate import replay, split_cost
    from minipar.plan.pipeline import zero_bubble_formula, zero_bubble_holds

    def span_bubble(ls: list[list]) -> Any:
        return bubble_time(replay(ls, split_cost(1, 1, 1)))

    got = span_bubble(lists)
    table = zero_bubble_holds("zb-h1", p, m)
    want = (zero_bubble_formula("zb-h1", p, m)["bubble"] if table
            else span_bubble(schedules("zb-h1", p, m)))
    if got <= want:
        return None
    said = (f"p={p}, m={m}: on the simulator (T_F = T_B = T_W = 1) the bubble is {got} time "
            "units, ZB-H1's " + (f"(p - 1)(F + B - W) = {want}" if table else
                                 f"{want} (the simulator's zb-h1; the formula needs m >= p)"))
    one_f = zero_bubble_formula("1f1b", p, m)["bubble"]
    if not any(isinstance(x, BackwardInput) for ins in lists for x in ins):
        return (said + ": every backward runs whole (Backward: B and W in one). Split it: "
                "BackwardInput(i) (B, the input's gradient, sent on at once) and "
                "BackwardWeight(i) (W, the weights' gradient, which nobody waits for)")
    if got == one_f:
        return (said + f": your bubble is 1F1B's (p - 1)(F + B + W) = {one_f}: move the W's "
                "into the cool-down / warm-up idle time (a W may run any time after its own "
                "B; right after it, it only makes the backward whole again)")
    if got == (p - 1) * 2:
        return (said + f": (p - 1)(F + B) = {got}, as when each gradient goes back right "
                "after its B but each W still runs right after it, in the steady state, where "
                "the next F or B should be: hold the W's back and run them where the stage "
                "would idle, in the cool-down")
    return (said + ": the stages wait for each other more than ZB-H1 needs: each B as soon as "
            "its gradient has come, its gradient sent on at once, and the W's where the stage "
            "would idle")


def _pairs(ins: list) -> int:
    from minipar.parallel.pipeline.stage_loop import ForwardBackward

    return sum(isinstance(x, ForwardBackward) for x in ins)


def dual_rule(lists: list[list], p: int, m: int) -> str | None:
    """DualPipe-V's memory (the table's PP + 1 chunk-activations) and its overlapped pairs
    (as many as DeepSeek's steady state, step 4: nF0B1F1B0), in words, or None."""
    from minipar.parallel.pipeline.measure import in_flight
    from minipar.parallel.pipeline.schedule import schedules

    ref = schedules("dualpipev", p, m, 2)
    for s, ins in enumerate(lists):
        if (held := in_flight(ins)) > 2 * p + 1:
            return (f"p={p}, m={m}: rank {s} holds {held} chunk-activations at once (a "
                    f"Forward run, its backward not yet); DualPipe-V holds at most PP + 1 = "
                    f"{2 * p + 1}: start the backwards of chunk 1 (the way back up the V) "
                    "as soon as the first micro-batches reach the loss, not after all forwards")
        if (got := _pairs(ins)) < (want := _pairs(ref[s])):
            return (f"p={p}, m={m}: rank {s} runs {got} overlapped pairs, DeepSeek's "
                    f"DualPipe-V {want}: in the steady state (step 4, nF0B1F1B0) each forward "
                    "runs in a pair with the backward of an older micro-batch of the other "
                    "chunk, ForwardBackward(Forward(j, 0), Backward(i, 1)) then "
                    "ForwardBackward(Forward(i', 1), Backward(i'', 0)): one's messages (and "
                    "with experts its all-to-all) travel while the other computes; the same "
                    "order as two separate instructions overlaps nothing")
    return None


def dual_bubble(lists: list[list], p: int, m: int) -> str | None:
    """Each rank's idle time on the simulator (F 1, B 2, W 1, F&B = F + B) against minipar's
    own dualpipev (= the table's (PP/2 − 1)(F&B + B − 3W) = 2(p − 1) for these costs), in
    words, or None."""
    from minipar.cli.bubble import idle_per_rank
    from minipar.parallel.pipeline.schedule import schedules
    from minipar.parallel.pipeline.simulate import replay, split_cost
    from minipar.parallel.pipeline.stage_loop import BackwardInput

    def idle(ls: list[list]) -> list:
        return idle_per_rank(replay(ls, split_cost(1, 1, 1), placement="v"))

    got, want = idle(lists), max(idle(schedules("dualpipev", p, m, 2)))
    if max(got) <= want:
        return None
    worst = got.index(max(got))
    said = (f"p={p}, m={m}: on the simulator (F 1, B 2, W 1, F&B = F + B) rank {worst} idles "
            f"{max(got)} time units; DualPipe-V's table gives (PP/2 - 1)(F&B + B - 3W) = "
            f"{want} (PP = 2p = {2 * p})")
    if not any(isinstance(x, BackwardInput) for ins in lists for x in ins):
        return (said + ": no backward is split. DualPipe-V splits the B's of step 3 "
                "(nB1W1F1: BackwardInput then its BackwardWeight) and, in the cool-down, "
                "runs B's alone and moves their W's to fill the gaps (steps 6-8: nB1B0 with "
                "zero bubble switched on mid-way, nWB0, nW)")
    return (said + ": a rank waits more than the schedule needs: follow DeepSeek's eight steps "
            "(nF0, nF0F1, nB1W1F1, nF0B1F1B0, nB1F1B0, nB1B0, nWB0, nW), each rank's step "
            "lengths set by its distance from the V's turn")


#: DualPipe-V's chunks, when a chunk is wrong or a message has no partner
V_CHUNKS = ("A rank that waits for itself ran a chunk out of turn. In DualPipe-V rank s "
            "holds two chunks of the V: chunk 0 is virtual stage s on "
            "the way down, chunk 1 virtual stage 2p - 1 - s on the way back up (rank p - 1 "
            "hands chunk 0's output to its own chunk 1, rank 0's chunk 1 adds the loss): "
            "every micro-batch i runs Forward(i, 0), Forward(i, 1), then the backward of "
            "chunk 1 before that of chunk 0, on every rank")

#: a pair whose two halves depend on each other
SAME_MB = ("the backward of micro-batch {i} needs its loss, which needs this very forward "
           "(the V goes down and back up through every rank): the two halves depend on "
           "each other and cannot overlap. Pair a forward with the backward of an OLDER "
           "micro-batch, one whose loss is already known")


def pair_problems(lists: list[list], p: int, m: int) -> list[str]:
    """Overlapped pairs of one micro-batch (its forward and its own backward)."""
    from minipar.parallel.pipeline.stage_loop import ForwardBackward

    return [f"p={p}, m={m}: stage {s}: {x} (position {k}): " + SAME_MB.format(i=x.forward.mb)
            for s, ins in enumerate(lists) for k, x in enumerate(ins)
            if isinstance(x, ForwardBackward) and x.forward.mb == x.backward.mb
            and x.forward.chunk != x.backward.chunk]


#: what the checker's words mean for a split backward
W_BEFORE_B = ("A W reads what its own B kept (the layer's input x and the gradient of its "
              "output dy): BackwardWeight(i) comes after BackwardInput(i) on the same stage, "
              "never before it (not in the warm-up either)")

#: what a deadlock of DualPipe-V usually is
V_STUCK = ("A pair receives both its inputs before it starts (with_comm puts its RecvAct and "
           "RecvGrad first), so a pair may only use what the neighbours' lists send EARLIER: "
           "rank s runs 2(p - s - 1) forwards of chunk 0 before its first chunk-1 forward "
           "(step 1, nF0), so that the V's way back is already under way when it waits")

#: what a deadlock of a 1F1B-shaped schedule (1F1B, ZB-H1) usually is
STUCK = ("Each stage in the cycle waits for a message its neighbour sends only later in its "
         "own list: stage s runs p - s - 1 warm-up forwards, so that the activations its next "
         "stage needs go out before it waits for a gradient")


def findings(kind: str, fn: Callable, p: int, ms: tuple[int, ...] | None = None
             ) -> dict[str, str]:
    """A problem of each kind over m in ``ms`` (default :func:`ms_for`) on p stages: "check"
    at the smallest m that fails it, "rule" and "bubble" at the largest."""
    out: dict[str, str] = {}
    for m in ms or ms_for(kind, p):
        lists, bad = _lists(fn, p, m)
        if not bad and kind == "dualpipev" and (same := pair_problems(lists, p, m)):
            out.setdefault("check", same[0])
            continue
        found = [bad] if bad else _problems(lists, kind)
        if found:
            out.setdefault("check", f"p={p}, m={m}: " + "\n".join(found[:4]) + (
                f"\n... and {len(found) - 4} more" if len(found) > 4 else "") + (
                "\n" + W_BEFORE_B if any("BackwardWeight(" in f and "comes before "
                                          "BackwardInput(" in f for f in found[:4]) else "") + (
                "\n" + STUCK if kind not in ("gpipe", "dualpipev")
                and found[0].startswith("deadlock") else "") + (
                "\n" + V_CHUNKS if kind == "dualpipev" and (any(
                    "chunk=1" in f and ("appears 0 times" in f or "appears 2 times" in f)
                    for f in found[:4]) or re.search(r"stages: (\d+) -> \1\)", found[0]))
                else "") + (
                "\n" + V_STUCK if kind == "dualpipev" and found[0].startswith("deadlock")
                else ""))
            continue
        for key, said in (("rule", rule(kind, lists, p, m)), ("bubble", bubble(kind, lists, p, m))):
            if said:  # the largest m wins: the clearest numbers
                out[key] = said
    return out


def copied(fn: Callable) -> bool:
    """Does the learner's function reach for the package's own schedule functions (any
    function of :mod:`minipar.parallel.pipeline.schedule`,
    :mod:`~minipar.parallel.pipeline.zero_bubble` or :mod:`~minipar.parallel.pipeline.dualpipe`;
    ``measure.in_flight`` is a helper a learner may use, the stage loop's ``virtual_stage``
    one too, and ``schedule.with_comm``, the rule that places the messages, which the
    DualPipe-V exercise gives)?"""
    import inspect

    from minipar.parallel.pipeline import dualpipe, zero_bubble
    from minipar.parallel.pipeline import schedule as sched

    theirs = {id(f) for mod in (sched, zero_bubble, dualpipe) for f in vars(mod).values()
              if inspect.isfunction(f) and f.__module__ == mod.__name__
              and f is not sched.with_comm}
    return any(id(v) in theirs for v in getattr(fn, "__globals__", {}).values())


SPEC_ARGS = {"vocab": 10, "seq": 8, "d_model": 16, "heads": 2, "steps": 2}


def spec(p: int, kind: str = KIND) -> Any:
    """The small GPT a run case trains: a block per virtual stage at least."""
    from minipar.parallel.common import RunSpec

    return RunSpec(layers=max(p, 2) * CHUNKS.get(kind, 1), batch=2 * p + 1, **SPEC_ARGS)


def execute(kind: str, fn: Callable, comm: Any, p: int, m: int) -> np.ndarray:
    """This rank runs the learner's list for its stage through the MPI executor; the whole
    model's parameters after two AdamW steps (on every rank)."""
    from minipar.comm.topology import Grid
    from minipar.parallel import loop
    from minipar.parallel.pipeline.engine import PipelineParallel

    raw = getattr(comm, "comm", comm)  # the grader's Dup of COMM_WORLD, untraced
    grid = Grid(raw, dp=1, pp=p)
    mine = fn(grid.coord("pp"), p, m)
    run = spec(p, kind)
    pp = PipelineParallel(grid, run, kind, m, CHUNKS.get(kind, 1), instructions=mine)
    loop.train(pp, run.batch_at, run.steps)
    return np.concatenate([np.asarray(v, dtype=np.float64).ravel()
                           for v in pp.full_params().values()])


def run_stage(fn: Callable, comm: Any, x: np.ndarray, **case: Any) -> np.ndarray:
    """One case on this rank (called through the learner's file's ``run_stage``); the
    schedule's kind is the case's."""
    key, kind = label(case), case["kind"]
    _notes.pop(key, None)
    if case["what"] == "rules":
        found = findings(kind, fn, case["p"])
        if copied(fn):
            found["own"] = ("your schedule calls minipar.parallel.pipeline.schedule's own "
                            "stage_schedule() (or its helpers): "
                            "the exercise is to write the list yourself")
        _notes[key] = json.dumps(found)
        return np.array([1.0 if found else 0.0])
    p, m = case["p"], case["m"]
    if p != comm.Get_size():
        raise ValueError(f"case for {p} ranks run on {comm.Get_size()}")
    lists, bad = _lists(fn, p, m)
    found = [bad] if bad else (pair_problems(lists, p, m) if kind == "dualpipev" else []
                               ) or _problems(lists, kind)
    if found:
        _notes[key] = (f"not run on the ranks: the schedule for p={p}, m={m} fails the "
                       f"checker first ({found[0]})")
        return np.full(_size(p, kind), np.nan)  # the expected shape: a wrong result
    return execute(kind, fn, comm, p, m)


def _size(p: int, kind: str = KIND) -> int:
    return sum(int(np.asarray(v).size) for v in spec(p, kind).initial_params().values())


def _problems(lists: list[list], kind: str = KIND) -> list[str]:
    from minipar.parallel.pipeline.check import problems

    return problems(lists, placement=PLACE.get(kind, "loop"))


def oracle(raw: Any, case: dict, x: np.ndarray) -> tuple[np.ndarray, np.ndarray | None]:
    """Rules: nothing found ([0.]).  Run: the serial run's parameters, within the shared
    parity tolerance x the distance trained max|theta_serial - theta_0|."""
    if case["what"] == "rules":
        return np.zeros(1), None
    from minipar.parallel.common import serial_reference
    from minipar.parallel.parity import TOLERANCE

    sp = spec(case["p"], case["kind"])
    ser = np.asarray(serial_reference(sp)["params"], dtype=np.float64)
    init = sp.initial_params()
    theta0 = np.concatenate([np.asarray(init[k]).ravel() for k in init])
    return ser, np.full(ser.shape, TOLERANCE * float(np.max(np.abs(ser - theta0))))


def diagnose(case: dict, rank: int, size: int, x: np.ndarray, out: np.ndarray,
             expected: np.ndarray) -> str | None:
    note = _notes.get(label(case))
    if note is not None or case["what"] == "rules":
        return note
    if out.shape == expected.shape:
        gap = float(np.max(np.abs(out - expected)))
        return (f"the parameters after two steps differ from the serial run's by up to {gap:.3g}: "
                "a correct schedule cannot change them (the executor weighs every micro-batch)")
    return None


# -- the launcher side ------------------------------------------------------------------
def judge_kind(kind: str, n: int, cases: list[dict], records: Records) -> list[Check]:
    found: dict[str, tuple[str, str]] = {}  # key -> (case label, words)
    rules = [(i, c) for i, c in enumerate(cases) if c["what"] == "rules"]
    # a broken schedule is clearest on few stages; a rule or a bubble on many
    for key, order in (("check", rules), ("own", rules), ("rule", rules[::-1]),
                       ("bubble", rules[::-1])):
        for i, case in order:
            said = records[0][i]["mistake"]
            if said and key in json.loads(said):
                found[key] = (label(case), json.loads(said)[key])
                break
    checks = []
    check_name = (NAMES["check"] if kind != "dualpipev" else NAMES["check"].replace(
        "p = 1..4 stages, m = 1..8", "p = 1..4 ranks (2p stages), m = 2p, 2p + 1, 3p + 2"))
    for key, name in (("check", check_name), ("rule", NAMES["rule"][kind]),
                      ("bubble", NAMES["bubble"][kind]), ("own", NAMES["own"])):
        where, words = found.get(key, (None, ""))
        if key in ("rule", "bubble") and key not in found and "check" in found:
            checks.append(Check(name, None, "not graded where the schedule fails the checker "
                                "(the ✗ above); graded on the (p, m) that pass it"))
            continue
        checks.append(Check(name, key not in found, words, case=where))
    runs = [(i, c) for i, c in enumerate(cases) if c["what"] == "run"]
    ms = ", ".join(str(c["m"]) for _, c in runs)
    name = (f"runs on {n} real rank{'s' if n != 1 else ''} (each its own stage's list, "
            f"MPI executor), m = {ms}: parameters equal the serial run's")
    for i, c in runs:
        for r in range(n):
            rec = records[r][i]
            if rec["mismatch"] or rec["contract"]:
                words = rec["mistake"] or rec["contract"] or ""
                if words.startswith("not run"):
                    checks.append(Check(name, None, words, case=label(c)))
                else:
                    m = rec["mismatch"] or {}
                    checks.append(Check(name, False, (
                        f"{label(c)}, rank {r}: parameter {m.get('index')} is {m.get('got')!r}, "
                        f"the serial run's {m.get('expected')!r}. {words}").strip(),
                        case=label(c)))
                return checks
    checks.append(Check(name, True))
    return checks


def judge(n: int, cases: list[dict], records: Records) -> list[Check]:
    return judge_kind(KIND, n, cases, records)
