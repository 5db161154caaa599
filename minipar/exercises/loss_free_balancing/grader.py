"""Grader of the loss-free routing step: the serial routing as oracle, named mistakes, one all-reduce.

EN loss-free balancing grader · RU проверка балансировки без потерь · ZH 无辅助损失均衡评分

Each case is one step's tokens (sigmoid scores in (0, 1), float64) split over the ranks by
``numpy.array_split``, a bias per expert, top-k and the rate u.  The oracle is the serial
routing of :mod:`minipar.nn.moe_routing` on all the tokens at once: ``choose`` (top-k of
s + b), ``gates`` (the chosen s normalised), ``update_bias`` with the loads of the whole
step.  Rank r must return its tokens' order and gates and the (shared) new bias.

A wrong result is named (:func:`diagnose`) by recomputing the mistakes the issue lists:
the bias added to the gates, the choice made on s alone, the loads of this rank only,
the sign reversed.  Traffic: one ring all-reduce of E loads, 2(N-1)·S bytes over all
ranks (S = 8·E).
"""

from __future__ import annotations

from functools import lru_cache

import numpy as np
from mpi4py import MPI

from minipar.exercises.grading import Check
from minipar.exercises.judging import Records, contract_checks
from minipar.nn.moe_routing import choose, gates, update_bias

SEED = 2408_15664  # the loss-free paper's arXiv number
TOL = 1e-12
#: (tokens, E, top_k, rate): uneven splits, k from 2 to 4
SHAPES = ((10, 4, 2, 1e-3), (13, 8, 3, 1e-2), (17, 6, 4, 0.1))
FIRST_STEP = (
    "loss_free_step() (TODOs 1-3): the choice by s + b and the gates need no message; the "
    "loads are the whole step's, so sum them over the ranks with the given allreduce()."
)


def cases(n: int) -> list[dict]:
    return [{"tokens": t, "E": e, "k": k, "rate": u, "step": i, "dtype": "float64",
             "length": 2 * t * k + e,
             "split": [len(p) for p in np.array_split(np.arange(t), n)]}
            for i, (t, e, k, u) in enumerate(SHAPES)]


def label(case: dict) -> str:
    return (f"{case['tokens']} tokens, E = {case['E']}, top-{case['k']}, u = {case['rate']:g}, "
            f"split {case['split']}")


@lru_cache(maxsize=8)
def _full(tokens: int, e: int, step: int) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng([SEED, step])
    scores = 1.0 / (1.0 + np.exp(-rng.standard_normal((tokens, e))))
    bias = 0.2 * rng.standard_normal(e)  # large enough to change choices
    return scores, bias


def _rows(case: dict, rank: int) -> slice:
    lo = sum(case["split"][:rank])
    return slice(lo, lo + case["split"][rank])


def make_input(case: dict, rank: int, size: int) -> tuple[np.ndarray, dict]:
    """This rank's tokens' scores; the bias (the same on every rank), k and u."""
    scores, bias = _full(case["tokens"], case["E"], case["step"])
    return scores[_rows(case, rank)].copy(), {"bias": bias.copy(), "top_k": case["k"],
                                              "rate": case["rate"]}


def _step(scores: np.ndarray, bias: np.ndarray, k: int, u: float, loads_of: np.ndarray
          ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    order = choose(scores, k, bias)
    loads = np.bincount(choose(loads_of, k, bias).reshape(-1),
                        minlength=scores.shape[1]).astype(np.float64)
    return order, gates(np.take_along_axis(scores, order, axis=1), "sigmoid"), \
        update_bias(bias, loads, u)


def _pack(*arrays: np.ndarray) -> np.ndarray:
    return np.concatenate([np.ravel(a).astype(np.float64) for a in arrays])


def serial(case: dict, rank: int) -> np.ndarray:
    """pack(order, gates, new bias) of rank ``rank``'s tokens, the step's loads."""
    scores, bias = _full(case["tokens"], case["E"], case["step"])
    order, g, b = _step(scores, bias, case["k"], case["rate"], scores)
    s = _rows(case, rank)
    return _pack(order[s], g[s], b)


def oracle(raw: MPI.Comm, case: dict, x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    out = serial(case, raw.Get_rank())
    return out, np.full(out.size, TOL)


# -- naming the mistake (rank side, no message sent) ---------------------------------------
def _close(a: np.ndarray, b: np.ndarray) -> bool:
    return a.shape == b.shape and bool(np.all(np.abs(a - b) <= TOL))


def diagnose(case: dict, rank: int, size: int, x: np.ndarray, out: np.ndarray,
             expected: np.ndarray) -> str | None:
    """The mistake that gives exactly ``out``, in words; None if no known one does."""
    if out.shape != expected.shape:
        return None
    scores, bias = _full(case["tokens"], case["E"], case["step"])
    k, u, e = case["k"], case["rate"], case["E"]
    mine = scores[_rows(case, rank)]
    n = mine.shape[0] * k
    o, g, b = out[:n], out[n:2 * n], out[2 * n:]
    right_o, right_g, right_b = expected[:n], expected[n:2 * n], expected[2 * n:]
    said = []
    order = right_o.reshape(-1, k).astype(np.int64)
    biased = np.take_along_axis(mine + bias, order, axis=1)
    if _close(o, right_o) and _close(g, (biased / biased.sum(axis=1, keepdims=True)).ravel()):
        said.append("the gates hold the bias: they are the chosen s + b normalised, but the "
                    "bias only chooses the experts; the gates are the chosen s alone, "
                    "normalised (the bias has no gradient and would drift the output).")
    plain = choose(mine, k)
    if not _close(o, right_o) and _close(o, plain.ravel().astype(np.float64)):
        said.append("the experts are chosen by s alone: the choice is the top-k of s + b "
                    "(the bias is what steers the loads).")
    local = np.bincount(choose(mine, k, bias).reshape(-1), minlength=e).astype(np.float64)
    if size > 1 and not _close(b, right_b) and _close(b, update_bias(bias, local, u)):
        said.append("the new bias comes from THIS rank's loads only: the loads are the whole "
                    "step's, summed over every rank's tokens (one allreduce), or the ranks' "
                    "biases part ways.")
    loads = np.bincount(choose(scores, k, bias).reshape(-1), minlength=e).astype(np.float64)
    if _close(b, update_bias(bias, loads, -u)):
        said.append("the sign is reversed: an overloaded expert (load above the mean) must get "
                    "a LOWER bias, b_i + u·sign(mean load − load_i).")
    return " ".join(said) or None


def judge(n: int, cases: list[dict], records: Records) -> list[Check]:
    checks = contract_checks(cases, records, label, "routing")
    for c in checks:
        c.name = c.name.replace(
            "returns a new array with the input's shape and dtype",
            "returns a new float64 array: pack(order, gates, new_bias)").replace(
            "MPI's routing", "the serial routing (minipar.nn.moe_routing, all tokens at once)")
    checks.append(allreduce_check(n, cases, records))
    return checks


def allreduce_check(n: int, cases: list[dict], records: Records) -> Check:
    """One ring all-reduce of E loads per case: 2(N-1)·S bytes over all ranks."""
    name = "exactly 1 all-reduce, of the E loads (the choice and the gates need no message)"
    for i, case in enumerate(cases):
        S = case["E"] * 8
        sent = sum(records[r][i]["bytes_sent"] for r in range(n))
        if sent != 2 * (n - 1) * S:
            return Check(name, False, (
                f"{label(case)}: all ranks together sent {sent} bytes = "
                f"{sent / (2 * (n - 1) * S):.2f} x 2(N-1)·S, the volume of one ring all-reduce "
                f"of E = {case['E']} loads (S = {S} bytes); expected exactly 1. The order and "
                "the gates of a token need only that token; only the loads are summed."),
                case=label(case))
    e = cases[-1]["E"]
    return Check(name, True, f"e.g. 2(N-1)·S = {2 * (n - 1) * 8 * e} bytes over all ranks for "
                             f"S = {8 * e} (E = {e})")
