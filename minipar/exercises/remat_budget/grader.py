"""Grader of remat_budget: the learner's plan run for real, its ledger peak and forwards measured.

EN activation checkpointing grader · RU проверка чекпоинтинга активаций · ZH 激活检查点评分

Each case is a memory budget for one step of a tiny GPT (float64, n = 8 units).
The budgets lie between the measured peaks of the plans (every = 1 .. n, selective),
so each case has one best plan.  On every rank the learner's ``plan`` is run with
:class:`minipar.parallel.remat.Checkpointing` on forward and backward; the result is
the flat gradient followed by two measured figures: the ledger's peak
(:class:`~minipar.parallel.offload.measure.ActivationLedger`'s ``bytes_peak`` around
it; written as the budget itself when it fits, so every fitting plan reads the same)
and the recomputation (unit forwards counted by wrapping each unit, minus n; plus 0.5 for selective's attention cores).  The oracle is the
serial model's gradient (``GPT.loss_and_grads``, no remat) followed by the budget
and the least recomputation of any fitting plan (measured): compared exactly, so
the gradient must be bit-identical, the peak within the budget and the plan one of
the cheapest (ties between equally cheap plans both pass).  ``diagnose`` says
which figure is off: over the budget, or fitting while recomputing more.
"""

from __future__ import annotations

from functools import cache, lru_cache
from itertools import pairwise
from typing import Any

import numpy as np
from mpi4py import MPI

from minipar.exercises.grading import Check
from minipar.exercises.judging import Records, contract_checks
from minipar.nn import GPT, GPTConfig, Hooks, executor
from minipar.nn.units import Unit
from minipar.parallel.offload.measure import ActivationLedger
from minipar.parallel.remat import Checkpointing

CONFIG = {"vocab_size": 16, "block_size": 16, "n_layer": 6, "n_head": 2, "d_model": 16,
          "dtype": "float64"}
BATCH = 4
FIRST_STEP = (
    "plan() (TODOs 1-3): list the plans (every = 1 .. n, selective), what each recomputes, "
    "and keep the cheapest whose measured peak_bytes(plan) fits the budget (THE GOAL in the "
    "file's docstring ranks them)."
)


class _Counted(Unit):
    """A unit that counts its forwards (the recomputation, measured)."""

    def __init__(self, unit: Unit, counter: list[int]) -> None:
        self.unit, self.counter = unit, counter
        self.name, self.prefix, self.names = unit.name, unit.prefix, unit.names

    def forward(self, p: dict, x: Any) -> tuple[Any, Any]:
        self.counter[0] += 1
        return self.unit.forward(p, x)

    def backward(self, p: dict, saved: Any, dy: Any, daux: float = 1.0) -> tuple[Any, dict]:
        return self.unit.backward(p, saved, dy, daux)

    def aux_loss(self, saved: Any) -> float:
        return self.unit.aux_loss(saved)


@lru_cache(maxsize=1)
def _setup() -> tuple[GPT, dict, np.ndarray, np.ndarray]:
    model = GPT(GPTConfig(**CONFIG))
    r = np.random.default_rng(1604_06174)  # Chen et al.'s arXiv number
    p = {k: v + 0.1 * r.standard_normal(v.shape) for k, v in model.init(1).items()}
    x = r.integers(0, CONFIG["vocab_size"], (BATCH, CONFIG["block_size"]))
    return model, p, x, np.roll(x, -1, axis=1)


def units() -> int:
    return len(_setup()[0].units())


def run_plan(plan: dict) -> tuple[np.ndarray, int, int]:
    """One forward and backward with ``plan``: (flat gradient, ledger peak, unit forwards)."""
    model, p, x, y = _setup()
    counter = [0]
    walk = [_Counted(u, counter) for u in model.units()]
    led = ActivationLedger(Checkpointing(Hooks(p), walk, **plan))
    executor.loss_and_grads(walk, led, x, y)
    return np.concatenate([np.ravel(led.grads[k]) for k in sorted(p)]), led.bytes_peak, counter[0]


@cache
def _measured(key: tuple) -> tuple[int, int]:
    _, peak, forwards = run_plan(dict(key))
    return peak, forwards


def peak_bytes(plan: dict) -> int:
    """GIVEN to the learner: the ledger's peak bytes of one step with ``plan``."""
    return _measured(tuple(sorted(plan.items())))[0]


def _plans() -> list[dict]:
    n = units()
    return [{"every": k} for k in range(1, n + 1)] + [{"selective": True}]


def _cost(plan: dict) -> float:
    """Recomputed unit forwards (measured), selective's attention cores counted as 0.5."""
    extra = _measured(tuple(sorted(plan.items())))[1] - units()
    return 0.5 if plan.get("selective") else float(extra)


def best(budget: int) -> dict:
    fits = [p for p in _plans() if peak_bytes(p) <= budget]
    return min(fits, key=lambda p: (_cost(p), peak_bytes(p)))


def _words(plan: dict | None) -> str:
    if plan is None:
        return "None"
    return "selective" if plan.get("selective") else f"every = {plan['every']}"


def cases(n: int) -> list[dict]:
    peaks = sorted({peak_bytes(p) for p in _plans()})
    budgets = [(a + b) // 2 for a, b in pairwise(peaks)] + [peaks[-1]]
    length = _setup_length()
    return [{"budget": b, "length": length, "dtype": "float64", "values": "gradient",
             "best": _words(best(b))} for b in budgets]


def _setup_length() -> int:
    return sum(v.size for v in _setup()[1].values()) + 2


def label(case: dict) -> str:
    return f"budget {case['budget']:,} bytes"


def make_input(case: dict, rank: int, size: int) -> tuple[np.ndarray, dict]:
    """The step's tokens (the same on every rank) and the case."""
    return _setup()[2].astype(np.float64), {"budget": case["budget"]}


def remat_step(fn: Any, comm: Any, x: np.ndarray, budget: int) -> np.ndarray:
    """The learner's plan for ``budget`` run for real: gradient, measured peak, forwards."""
    chosen = fn(units(), budget, lambda plan: peak_bytes(dict(plan)))
    if chosen is None:
        return np.full(_setup_length(), np.nan)
    grads, peak, forwards = run_plan(dict(chosen))
    cost = forwards - units() + (0.5 if chosen.get("selective") else 0.0)
    return np.concatenate([grads, [float(max(peak, budget)), cost]])


def oracle(raw: MPI.Comm, case: dict, x: np.ndarray) -> tuple[np.ndarray, None]:
    """The serial model's gradient (no remat), then the best plan's measured peak and forwards."""
    model, p, tokens, y = _setup()
    _, grads = model.loss_and_grads(p, tokens, y)
    flat = np.concatenate([np.ravel(grads[k]) for k in sorted(p)])
    return np.concatenate([flat, [float(case["budget"]), _cost(best(case["budget"]))]]), None


def diagnose(case: dict, rank: int, size: int, x: np.ndarray, out: np.ndarray,
             expected: np.ndarray) -> str | None:
    if out.shape != expected.shape:
        return None
    want = best(case["budget"])
    if np.isnan(out[-1]):
        return (f"plan() returned None for a budget of {case['budget']:,} bytes, but "
                f"{_words(want)} fits (measured peak {peak_bytes(want):,} bytes).")
    if not np.array_equal(out[:-2], expected[:-2]):
        return ("the gradients differ from the serial model's: a plan changes only what is "
                "kept, never the result (recomputation runs the very same forward)")
    peak, cost = int(out[-2]), float(out[-1])
    if peak > case["budget"]:
        return (f"your plan's measured peak is {peak:,} bytes, over the budget of "
                f"{case['budget']:,}: keep less. {_words(want).capitalize()} fits "
                f"({peak_bytes(want):,} bytes).")

    def said(c: float) -> str:
        return ("one attention core per block (selective)" if c == 0.5 else
                f"{c:g} unit forward{'s' if c != 1 else ''}")

    return (f"your plan fits the budget of {case['budget']:,} bytes but recomputes "
            f"{said(cost)}; {_words(want)} fits too (measured peak {peak_bytes(want):,} bytes) "
            f"and recomputes {said(_cost(want))}. A larger k is not always fewer recomputed "
            "forwards: count n - last; and selective recomputation costs less than any "
            "segment.")


def judge(n: int, cases: list[dict], records: Records) -> list[Check]:
    checks = contract_checks(cases, records, label, "remat")
    for c in checks:
        c.name = c.name.replace(
            "returns a new array with the input's shape and dtype",
            "plan() returns a plan the grader can run").replace(
            "result equals MPI's remat",
            "bit-identical gradients, measured peak <= budget, fewest recomputed forwards")
    # the tokens are read only by the grader's walk, and no message is sent: neither is graded
    return [c for c in checks if not c.name.startswith(("leaves the input", "built from"))]

