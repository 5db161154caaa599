"""Pipeline schedules as data (minipar.parallel.pipeline), without MPI.

What the tests reproduce: the papers' bubble formulas (GPipe, Huang et al.
2018: (p − 1)/(m + p − 1) of the step; PTD-P, Narayanan et al. 2021:
(p − 1)/m of the ideal time for 1F1B, (1/v)(p − 1)/m interleaved) EXACTLY on
the simulated timeline with equal stage costs, as ``Fraction``s, and equal to
minipar.plan.pipeline's float formulas after rounding; the activations in
flight each schedule promises; and that a broken schedule is named.
"""

from __future__ import annotations

import importlib
import random
import re
from fractions import Fraction

import pytest

from minipar.parallel.pipeline.check import check_schedules, problems
from minipar.parallel.pipeline.measure import bubble_fraction, bubble_time_ratio, chart, in_flight
from minipar.parallel.pipeline.schedule import (
    KINDS,
    forward_schedule,
    schedules,
    stage_schedule,
)
from minipar.parallel.pipeline.simulate import Deadlock, replay, uniform_cost
from minipar.parallel.pipeline.stage_loop import (
    Backward,
    Forward,
    OptimizerStep,
    RecvAct,
    RecvGrad,
    SendAct,
    SendGrad,
)
from minipar.parallel.pipeline.dualpipe import DUALPIPE
from minipar.parallel.pipeline.zero_bubble import ZERO_BUBBLE
from minipar.plan import pipeline as formulas

#: the schedules with a whole backward (the zero-bubble ones: tests/test_schedule_zero_bubble.py)
CLASSIC = tuple(k for k in KINDS if k not in ZERO_BUBBLE + DUALPIPE)


def _grid(kind: str, every: bool = False) -> list[tuple[int, int, int]]:
    """Every p = 1..8 with the corners m = 1, p − 1, p, p + 1, 2p, 32 (m = multiples of p and
    v = 1..4 for interleaved), plus a seeded sample of the rest of m = 1..32; ``every``:
    all of m = 1..32 (interleaved: every multiple of p up to 32)."""
    if every:
        return [(p, m, v) for p in range(1, 9) for m in range(1, 33)
                for v in (range(1, 5) if kind == "interleaved" else (1,))
                if kind != "interleaved" or m % p == 0]
    rng = random.Random(10)
    out = set()
    for p in range(1, 9):
        if kind == "interleaved":
            ms = sorted({p, 2 * p, 32 // p * p} | {rng.randrange(1, 33 // p) * p})
            out |= {(p, m, v) for m in ms for v in range(1, 5)}
        else:
            ms = {1, max(1, p - 1), p, p + 1, 2 * p, 32} | set(rng.sample(range(1, 33), 3))
            out |= {(p, m, 1) for m in ms}
    return sorted(out)


@pytest.mark.parametrize("kind", CLASSIC)
def test_every_dependency_holds_and_nothing_deadlocks(kind: str) -> None:
    for p, m, v in _grid(kind, every=True):
        scheds = schedules(kind, p, m, v)
        assert problems(scheds) == [], (kind, p, m, v)
        if kind != "interleaved":  # safe even when MPI_Send waits for its receive
            assert problems(scheds, sends="rendezvous") == [], (kind, p, m, v)
        for s, ins in enumerate(scheds):  # each (micro-batch, chunk) once forward, once backward
            for op in (Forward, Backward):
                done = sorted((x.mb, x.chunk) for x in ins if isinstance(x, op))
                assert done == [(i, c) for i in range(m) for c in range(v)], (kind, p, m, v, s)
            assert ins[-1] == OptimizerStep() and ins.count(OptimizerStep()) == 1


def test_interleaving_around_the_ring_needs_nonblocking_sends() -> None:
    msg = problems(schedules("interleaved", 2, 4, 2), sends="rendezvous")
    assert len(msg) == 1 and "deadlock" in msg[0] and "SendAct" in msg[0]


@pytest.mark.parametrize("p", range(1, 9))
def test_micro_batches_in_flight(p: int) -> None:
    for m in (1, p, 2 * p + 1, 32):
        for s in range(p):
            assert in_flight(stage_schedule("gpipe", s, p, m)) == m
            assert in_flight(stage_schedule("naive", s, p, m)) == 1
            assert in_flight(stage_schedule("1f1b", s, p, m)) == min(p - s, m) <= p
    for m in range(p, 33, p):  # Megatron-LM's warm-up + 1, in chunk-activations
        for v in range(1, 5):
            for s in range(p):
                want = m * v if m == p else min(2 * (p - s - 1) + (v - 1) * p + 1, m * v)
                assert in_flight(stage_schedule("interleaved", s, p, m, v)) == want, (p, m, v, s)


@pytest.mark.parametrize("kind", CLASSIC)
def test_bubble_equals_the_papers_formulas_exactly(kind: str) -> None:
    """Forward 1, backward 2 per stage (per chunk: 1/v, 2/v); the schedules were checked
    above, so the timeline is rebuilt with replay() directly."""
    for p, m, v in _grid(kind):
        tl = replay(schedules(kind, p, m, v), uniform_cost(forward=1, backward=2, v=v))
        fraction, ratio = bubble_fraction(tl), bubble_time_ratio(tl)
        assert fraction == ratio / (1 + ratio)
        if kind == "naive":
            assert fraction == Fraction(p - 1, p)
        elif kind == "gpipe":
            assert fraction == Fraction(p - 1, m + p - 1), (p, m)
            assert float(fraction) == formulas.gpipe_bubble_fraction(p, m)
        else:  # 1f1b, interleaved: bubble over ideal time
            assert ratio == Fraction(p - 1, v * m), (kind, p, m, v)
            assert float(ratio) == formulas.bubble_time_ratio(p, m, v)


def test_rendezvous_sends_give_the_same_bubble() -> None:
    for kind in ("gpipe", "1f1b"):
        tl = replay(schedules(kind, 4, 8), uniform_cost(1, 2), sends="rendezvous")
        assert bubble_fraction(tl) == Fraction(3, 11)


def test_records_and_communication_cost() -> None:
    """Naive, 2 stages, 1 micro-batch, forward 1, backward 2, every send 1 unit (by hand)."""
    tl = replay(schedules("naive", 2, 1), uniform_cost(1, 2), comm_cost=lambda ins, s: 1)
    got = sorted((r.stage, r.what, r.micro_batch, r.chunk, r.start, r.end) for r in tl)
    assert got == [
        (0, "backward", 0, 0, 6, 8), (0, "forward", 0, 0, 0, 1), (0, "optimizer", None, None, 8, 8),
        (0, "recv_grad", 0, 0, 2, 6), (0, "send_act", 0, 0, 1, 2),
        (1, "backward", 0, 0, 3, 5), (1, "forward", 0, 0, 2, 3), (1, "optimizer", None, None, 6, 6),
        (1, "recv_act", 0, 0, 0, 2), (1, "send_grad", 0, 0, 5, 6),
    ]
    assert bubble_fraction(tl) == Fraction(2 * 8 - 6, 2 * 8)  # P·T − C over P·T
    assert bubble_time_ratio(tl) == Fraction(2 * 8 - 6, 6)
    with pytest.raises(ValueError, match="no forward or backward"):
        bubble_fraction([r for r in tl if r.what == "optimizer"])


def test_docstring_drawings_are_the_simulators() -> None:
    doc = importlib.import_module("minipar.parallel.pipeline.schedule").__doc__
    for kind, m, v, cost in (("gpipe", 6, 1, uniform_cost(1, 2)),
                             ("1f1b", 6, 1, uniform_cost(1, 2)),
                             ("interleaved", 4, 2, uniform_cost(2, 4, v=2))):
        drawn = chart(replay(schedules(kind, 4, m, v), cost))
        assert "\n".join("    " + line for line in drawn.splitlines()) in doc, kind


# ------------------------------------------------------------------ broken schedules
def test_a_missing_receive_is_named() -> None:
    scheds = schedules("gpipe", 2, 2)
    scheds[1] = [x for x in scheds[1] if x != RecvAct(1)]
    needle = "stage 1: RecvAct(mb=1, chunk=0) appears 0 times, needs exactly once"
    with pytest.raises(ValueError, match=re.escape(needle)):
        check_schedules(scheds)


def test_two_stages_both_receiving_first_is_a_deadlock() -> None:
    stage0 = [RecvGrad(0), Forward(0), SendAct(0), Backward(0), OptimizerStep()]
    stage1 = [RecvAct(0), Forward(0), Backward(0), SendGrad(0), OptimizerStep()]
    with pytest.raises(ValueError) as e:
        check_schedules([stage0, stage1])
    msg = str(e.value)
    assert "stage 0 waits at RecvGrad(mb=0, chunk=0) for stage 1" in msg
    assert "stage 1 waits at RecvAct(mb=0, chunk=0) for stage 0" in msg
    assert "cycle of waiting stages: 0 -> 1 -> 0" in msg
    with pytest.raises(Deadlock):
        replay([stage0, stage1], uniform_cost())


def test_sending_before_receiving_deadlocks_only_with_blocking_sends() -> None:
    """1F1B's steady pair with the activation sent before the gradient is received: fine
    with Isend, a deadlock when MPI_Send waits for its receive (the next stage is sending
    that gradient and will receive the activation only afterwards)."""
    scheds = schedules("1f1b", 2, 3)
    i = scheds[0].index(RecvGrad(0))
    assert scheds[0][i + 1] == SendAct(1)
    scheds[0][i], scheds[0][i + 1] = SendAct(1), RecvGrad(0)
    assert problems(scheds) == []
    msg = problems(scheds, sends="rendezvous")
    assert msg and "stage 0 waits at SendAct(mb=1, chunk=0) for stage 1" in msg[0]


@pytest.mark.parametrize(("edit", "needle"), [
    (lambda s: s[1].remove(Forward(0)), "stage 1: Forward(mb=0, chunk=0) appears 0 times"),
    (lambda s: s[0].insert(0, Forward(1)), "stage 0: Forward(mb=1, chunk=0) appears 2 times"),
    (lambda s: s[0].pop(), "stage 0: needs exactly one OptimizerStep()"),
    (lambda s: s[1].append(OptimizerStep()), "stage 1: needs exactly one OptimizerStep()"),
    (lambda s: s[0].append(SendGrad(0)),
     "stage 0: SendGrad(mb=0, chunk=0) at position 9 talks past the first stage"),
    (lambda s: s[1].insert(0, s[1].pop(s[1].index(Backward(1)))),
     "stage 1: Backward(mb=1, chunk=0) at position 0 comes before Forward(mb=1, chunk=0)"),
    (lambda s: s[0].insert(0, ("F", 0)), "stage 0: ('F', 0) at position 0 is not a pipeline"),
    (lambda s: s[1].insert(0, Forward(7)), "stage 1: Forward(mb=7, chunk=0) (position 0)"),
])
def test_broken_schedules_are_named(edit, needle: str) -> None:
    scheds = schedules("gpipe", 2, 2)
    edit(scheds)
    with pytest.raises(ValueError, match=re.escape(needle)):
        check_schedules(scheds)


@pytest.mark.parametrize(("args", "needle"), [
    (("gpipe", 0, 0, 4), "p=0"), (("gpipe", 0, 2, 0), "m=0"),
    (("interleaved", 0, 2, 4, 0), "v=0"), (("1f1b", 2, 2, 4), "stage 2 is out of range for p=2"),
    (("1f1b", -1, 2, 4), "stage -1"), (("interleaved", 0, 4, 6, 2), ("m=6 micro-batches is not a "
                                       "multiple of p=4")),
    (("zigzag", 0, 2, 4), ("the pipeline schedule must be one of naive, gpipe, 1f1b, "
                           "interleaved, zb-h1, zb-h2, zb-v, dualpipe, dualpipev; got 'zigzag'")),
    (("gpipe", 0, 2, 4, 2), "v=2"),
    (("gpipe", 0, 2.5, 4), "p must be an integer, got 2.5"),
])
def test_bad_input_is_one_clear_error(args: tuple, needle: str) -> None:
    with pytest.raises(ValueError, match=re.escape(needle)):
        stage_schedule(*args)


def test_every_module_name_of_the_package_is_the_module() -> None:
    """``import minipar.parallel.pipeline.simulate as s`` gives the module, never a function
    of the same name: the package's ``__init__`` binds nothing but its submodules."""
    import types

    import minipar.parallel.pipeline as package

    names = ("stage_loop", "schedule", "zero_bubble", "dualpipe", "check", "simulate", "partition",
             "stage",
             "p2p", "measure")
    for name in names:
        module = importlib.import_module(f"minipar.parallel.pipeline.{name}")
        assert getattr(package, name) is module, name
        assert not hasattr(module, name) or isinstance(getattr(module, name), types.ModuleType)
    own = {k for k in vars(package) if not k.startswith("__")}
    assert own <= {*names, "engine"}, own


@pytest.mark.parametrize(("p", "m", "v"), [(1, 1, 1), (2, 3, 1), (4, 4, 2), (3, 6, 3)])
def test_the_forward_only_pass_runs_every_forward_once_without_deadlock(p: int, m: int,
                                                                        v: int) -> None:
    """Validation (``PipelineParallel.evaluate``): m·v forwards a stage, each between its
    receive and its send, no backward, no step; even rendezvous sends do not stick."""
    scheds = [forward_schedule(s, p, m, v) for s in range(p)]
    for s, sched in enumerate(scheds):
        fw = [(i.mb, i.chunk) for i in sched if isinstance(i, Forward)]
        assert fw == [(i, c) for i in range(m) for c in range(v)]
        assert not any(isinstance(i, Backward | RecvGrad | SendGrad | OptimizerStep)
                       for i in sched)
        assert sum(isinstance(i, SendAct) for i in sched) == m * v - m * (s == p - 1)
    for sends in ("buffered", "rendezvous"):
        tl = replay(scheds, uniform_cost(1, 2, v=v), sends=sends)
        assert sum(r.what == "forward" for r in tl) == p * m * v
