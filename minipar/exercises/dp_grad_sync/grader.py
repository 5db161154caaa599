"""Grader of the gradient-synchronisation exercise: cases, serial oracle, the ring's traffic.

EN gradient synchronisation grader · RU проверка синхронизации градиентов · ZH 梯度同步评分

Each case is one global batch of the modular-sum task (minipar.data.synthetic) for a
tiny GPT (float64).  Rank r's input is the gradient of the mean loss over
its ``numpy.array_split`` rows; the oracle is the serial gradient of the
whole batch (``GPT.loss_and_grads`` on all rows), which equals
Σ_r (rows_r / batch) · g_r up to rounding: the result must agree within
1e-10 x max|g| (a sum instead of a mean is off by a factor of about N; a
plain average is off by several percent whenever the slices are uneven).
Traffic: the ring's 2(N-1)/N x S per rank, only between ring neighbours
(:mod:`minipar.exercises.ring_allreduce.grader`'s checks).
"""

from __future__ import annotations

from dataclasses import replace
from functools import lru_cache

import numpy as np
from mpi4py import MPI

from minipar.data import synthetic
from minipar.exercises.grading import Check
from minipar.exercises.judging import Records, contract_checks
from minipar.exercises.ring_allreduce.grader import bytes_check, neighbour_check
from minipar.optim import FlatParams
from minipar.parallel.common import RunSpec, local_rows

SPEC = RunSpec(vocab=10, seq=8, d_model=16, layers=1, heads=2)
RTOL_SCALE = 1e-10  #: tolerance, relative to the largest gradient entry
FIRST_STEP = (
    "weighting: y = x * (rows / batch), a new array. Then sum y over the ranks with a ring "
    "of comm.Sendrecv calls (reduce-scatter, then all-gather)."
)


@lru_cache(maxsize=1)
def _model() -> tuple:
    model = SPEC.model()
    params = model.init(SPEC.seed)
    return model, params, FlatParams.like(params)


def _grad(batch: int, step: int, lo: int, hi: int) -> np.ndarray:
    """Flat gradient of the mean loss over rows [lo, hi) of the global batch of ``step``."""
    model, params, layout = _model()
    tokens, targets = synthetic.modular_sum(SPEC.data_seed, step, batch, SPEC.seq, SPEC.vocab,
                                            lo, hi)
    _, grads = model.loss_and_grads(params, tokens, targets)
    return layout.flatten(grads)


def cases(n: int) -> list[dict]:
    psi = _model()[2].size
    batches = sorted({n, n + 1, 2 * n + 1, 3 * n})
    return [{"batch": b, "step": i, "length": psi, "dtype": "float64",
             "values": "gradient",
             "split": [hi - lo for lo, hi in (local_rows(b, r, n) for r in range(n))]}
            for i, b in enumerate(batches)]


def label(case: dict) -> str:
    return f"global batch of {case['batch']} rows, split {case['split']}"


def make_input(case: dict, rank: int, size: int) -> tuple[np.ndarray, dict]:
    """This rank's gradient (mean over its rows) and its ``rows`` and the ``batch``."""
    lo, hi = local_rows(case["batch"], rank, size)
    return _grad(case["batch"], case["step"], lo, hi), {"rows": hi - lo, "batch": case["batch"]}


def parts(case: dict, size: int) -> list[np.ndarray]:
    """Each rank's term (rows_r / batch) · g_r of the serial gradient."""
    out = []
    for q in range(size):
        lo, hi = local_rows(case["batch"], q, size)
        out.append(_grad(case["batch"], case["step"], lo, hi) * ((hi - lo) / case["batch"]))
    return out


def diagnose(case: dict, rank: int, size: int, x: np.ndarray, out: np.ndarray,
             expected: np.ndarray) -> str | None:
    """The missing average, said first: ``out`` is the plain sum Σ_r g_r of the ranks' means.

    With even slices that is exactly N x the serial gradient, which the generic
    sum diagnosis would call "each contribution added N times"; here the cause is
    a sum that was never turned into a mean (rank side, no message sent)."""
    if size < 2:
        return None
    total = np.zeros_like(expected, dtype=np.float64)
    for q in range(size):
        lo, hi = local_rows(case["batch"], q, size)
        total += _grad(case["batch"], case["step"], lo, hi)
    tol = 1e-9 * float(np.abs(total).max() or 1.0)
    if out.shape != total.shape or not np.all(np.abs(out - total) <= tol):
        return None
    return (f"You returned the SUM of the ranks' gradients, never averaged: about {size} x the "
            f"serial gradient on N = {size} ranks. Each rank's gradient is a mean over its own "
            "rows, and the serial gradient is the mean over the whole batch: weight each "
            "rank's gradient by rows / batch before summing (with even slices that is "
            f"dividing by the world size, N = {size}).")


def oracle(raw: MPI.Comm, case: dict, x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The serial gradient of the whole global batch, and the tolerance per entry."""
    g = _grad(case["batch"], case["step"], 0, case["batch"])
    return g, np.full(g.shape, RTOL_SCALE * float(np.abs(g).max()))


def judge(n: int, cases: list[dict], records: Records) -> list[Check]:
    checks = contract_checks(cases, records, label, "Allreduce")
    for i, c in enumerate(checks):
        if c.name.startswith("result equals"):
            checks[i] = replace(c, name=f"result equals the serial gradient of the global batch "
                                        f"({len(cases)} batches, even and uneven splits)",
                                detail=_hint(n, cases, records, c.detail))
    checks.append(neighbour_check(n, cases, records))
    checks.append(bytes_check(n, cases, records))
    return checks


def _hint(n: int, cases: list[dict], records: Records, detail: str) -> str:
    if not detail:
        return ""
    if "You returned the SUM" in detail:
        return detail  # the sum's own diagnosis (diagnose) already said it, first
    for i, case in enumerate(cases):
        for rec in (records[r][i] for r in range(n)):
            m = rec["mismatch"]
            if m and m["expected"]:
                ratio = m["got"] / m["expected"]
                if n > 1 and abs(ratio - n) < 0.35 * n:
                    return (detail + f"\nThat is about {ratio:.2f} x the expected value, near N = {n}: "
                            "you returned the SUM of the ranks' gradients. The serial gradient is a "
                            "mean: weight each rank's gradient by rows / batch before summing.")
                break
    uneven = next((c["split"] for c in cases if len(set(c["split"])) > 1), None)
    return (detail + "\nThe serial gradient is Σ_r (rows_r / batch) · g_r: multiply your gradient by "
            "rows / batch, then sum over the ranks."
            + (f" Not 1/N: with uneven slices ({uneven} rows) the ranks' means weigh differently."
               if uneven else ""))
