"""Grader of the ring-attention exercise: full attention (float64), the merges, the ring.

EN ring attention grader · RU проверка кольцевого внимания · ZH 环形注意力评分

Rank r's input is its block of the queries (positions r·B … (r+1)·B of a
sequence of T = N·B) and its own K and V blocks; the result must be its rows
of full softmax attention over the whole sequence (causal: with
:func:`minipar.nn.attention.attention_core_forward`, the serial model's
core; non-causal: softmax without mask), float64, within 1e-12 x the largest
output entry.  A wrong result is named when it is exactly what a known
mistake gives (:func:`diagnose` re-runs the ring's merges locally with that
mistake, no message sent): a plain average of the partial outputs, no
rescaling of the running output by exp(lse_old - lse_new), the max instead of
the log-sum-exp, unweighted sums; every block masked like the diagonal, later
blocks not skipped, no causal mask, the diagonal block unmasked.

Formula checked (Liu et al. 2023, arXiv 2310.01889): each rank sends
(N-1) x (|K_r| + |V_r|) bytes, only to (r + 1) % N, and receives only from
(r - 1) % N.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from functools import lru_cache

import numpy as np
from mpi4py import MPI

from minipar.exercises.grading import Check
from minipar.exercises.judging import Records, contract_checks, describe_cases
from minipar.exercises.ring_attention_merge.solution import attention_block
from minipar.nn.attention import attention_core_forward

Arr = np.ndarray
SEED = 2310_01889  # the paper's arXiv number
TOL = 1e-12  #: tolerance, relative to the largest output entry (at least 1)
#: (batch, heads, block length B, head dim d): the sequence is T = N·B
SHAPES = ((1, 2, 3, 4), (2, 1, 1, 3))
FIRST_STEP = (
    "merge() (TODO 1), the online-softmax merge of two partial results (o, lse): the new "
    "log-sum-exp of both, then each output weighed by its share of it; then the causal mask "
    "in ring_attention() (TODO 2)."
)


def cases(n: int) -> list[dict]:
    return [{"causal": causal, "batch": b, "heads": h, "block": B, "d_head": d,
             "seq": n * B, "length": b * h * B * d, "dtype": "float64"}
            for b, h, B, d in SHAPES for causal in (True, False)]


def shape_label(case: dict) -> str:
    return (f"sequence {case['seq']} = N x {case['block']}, {case['batch']}x{case['heads']} "
            f"heads of {case['d_head']}")


def label(case: dict) -> str:
    return f"{'causal' if case['causal'] else 'full'}, {shape_label(case)}"


@lru_cache(maxsize=8)
def full(b: int, h: int, T: int, d: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """q, k, v of the whole sequence, (b, h, T, d): partition-independent."""
    g = np.random.default_rng([SEED, b, h, T, d])
    return g.standard_normal((b, h, T, d)), g.standard_normal((b, h, T, d)), \
        g.standard_normal((b, h, T, d))


def _full(case: dict) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    return full(case["batch"], case["heads"], case["seq"], case["d_head"])


def rows(case: dict, rank: int) -> slice:
    return slice(rank * case["block"], (rank + 1) * case["block"])


def make_input(case: dict, rank: int, size: int) -> tuple[np.ndarray, dict]:
    """x = this rank's query block; k, v = its own key and value blocks; causal."""
    q, k, v = _full(case)
    r = rows(case, rank)
    return q[..., r, :].copy(), {"k": k[..., r, :].copy(), "v": v[..., r, :].copy(),
                                 "causal": case["causal"]}


def serial(case: dict) -> np.ndarray:
    """Full attention over the whole sequence (the serial model's core when causal)."""
    q, k, v = _full(case)
    if case["causal"]:
        return attention_core_forward(q, k, v)[0]
    s = q @ k.swapaxes(-1, -2) / math.sqrt(q.shape[-1])
    p = np.exp(s - s.max(axis=-1, keepdims=True))
    return (p / p.sum(axis=-1, keepdims=True)) @ v


def oracle(raw: MPI.Comm, case: dict, x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """This rank's rows of full attention, and the tolerance per entry."""
    o = serial(case)[..., rows(case, raw.Get_rank()), :]
    return o, np.full(o.shape, TOL * max(1.0, float(np.abs(o).max())))


# -- naming the mistake: the ring re-run locally with it ----------------------------------------
def _right(o: Arr, lse: Arr, ob: Arr, lb: Arr) -> tuple[Arr, Arr]:
    new = np.logaddexp(lse, lb)
    return np.exp(lse - new)[..., None] * o + np.exp(lb - new)[..., None] * ob, new


def _no_rescale(o: Arr, lse: Arr, ob: Arr, lb: Arr) -> tuple[Arr, Arr]:
    new = np.logaddexp(lse, lb)
    return o + np.exp(lb - new)[..., None] * ob, new


def _max(o: Arr, lse: Arr, ob: Arr, lb: Arr) -> tuple[Arr, Arr]:
    new = np.maximum(lse, lb)
    return np.exp(lse - new)[..., None] * o + np.exp(lb - new)[..., None] * ob, new


def _sum(o: Arr, lse: Arr, ob: Arr, lb: Arr) -> tuple[Arr, Arr]:
    return o + ob, np.logaddexp(lse, lb)


MERGES: dict[str, tuple[Callable, str]] = {
    "average": (_right, (
        "o is the plain average of the blocks' partial outputs. Each o_blk is normalised over "
        "its own block's keys only; it weighs exp(lse_blk - lse) in the whole softmax, where "
        "lse = log Σ exp over every key seen so far.")),
    "no_rescale": (_no_rescale, (
        "the running o was not rescaled when a block arrived: the new lse = "
        "logaddexp(lse_old, lse_blk) grows the softmax's denominator, so the old o must shrink "
        "by exp(lse_old - lse_new) while the block's o_blk gets exp(lse_blk - lse_new).")),
    "max": (_max, (
        "the running lse was updated with the max, not the log-sum-exp: the softmax's "
        "denominators add, lse_new = log(exp(lse_old) + exp(lse_blk)) = np.logaddexp(lse_old, "
        "lse_blk); the max is only a safe shift for the exponentials.")),
    "sum": (_sum, (
        "the partial outputs were added without weights: o = exp(lse_old - lse_new) o_old + "
        "exp(lse_blk - lse_new) o_blk, each weighed by its block's share of the softmax.")),
}
MASKS: dict[str, tuple[Callable[[int, int], str], str]] = {
    "every_block_diagonal": (lambda src, r: "tri", (
        "every block was masked with the lower triangle, as if it were the own (diagonal) "
        "block. The mask is about global positions: a block from an earlier rank (src < r) "
        "lies wholly in the past and is seen without a mask.")),
    "future_seen": (lambda src, r: "tri" if src == r else "full", (
        "blocks from later ranks (src > r) were attended to: under the causal mask every key "
        "of such a block is in the future of every query here: skip them.")),
    "no_mask": (lambda src, r: "full", (
        "no causal mask at all: the own block needs the lower-triangular mask and later "
        "blocks must be skipped.")),
    "diagonal_unmasked": (lambda src, r: "full" if src <= r else "skip", (
        "the own block (src == r) was seen without a mask: within it query i may see keys "
        "0 … i only (np.tri(B, dtype=bool)).")),
}


def _right_mask(src: int, r: int) -> str:
    return "full" if src < r else ("tri" if src == r else "skip")


def rerun(case: dict, rank: int, size: int, merge: Callable, mask: Callable[[int, int], str],
          average: bool = False) -> np.ndarray:
    """Rank ``rank``'s output when the ring runs with ``merge`` and ``mask`` (local, no MPI)."""
    q, k, v = _full(case)
    x, B = q[..., rows(case, rank), :], case["block"]
    o, lse, seen = np.zeros(x.shape), np.full(x.shape[:-1], -np.inf), []
    for s in range(size):
        src = (rank - s) % size
        how = mask(src, rank) if case["causal"] else "full"
        if how == "skip":
            continue
        part = attention_block(x, k[..., rows(case, src), :], v[..., rows(case, src), :],
                               np.tri(B, dtype=bool) if how == "tri" else None)
        seen.append(part[0])
        o, lse = merge(o, lse, *part)
    return sum(seen) / len(seen) if average else o


def diagnose(case: dict, rank: int, size: int, x: np.ndarray, out: np.ndarray,
             expected: np.ndarray) -> str | None:
    """The mistake that gives exactly ``out``, in words; None if no known one does."""
    tol = 1e-9 * max(1.0, float(np.abs(expected).max()))

    def same(cand: np.ndarray) -> bool:
        return cand.shape == out.shape and bool(np.all(np.abs(cand - out) <= tol))

    for name, (fn, said) in MERGES.items():
        if same(rerun(case, rank, size, fn, _right_mask, average=name == "average")):
            return said
    if case["causal"]:
        for fn, said in MASKS.values():
            if same(rerun(case, rank, size, _right, fn)):
                return said
    return None


# -- judging (launcher side) -------------------------------------------------------------------
def judge(n: int, cases: list[dict], records: Records) -> list[Check]:
    checks = contract_checks(cases, records, label, "attention")
    for c in checks:  # causal is its own factor: the shapes alone are the variants
        c.name = c.name.replace("MPI's attention", "full attention over the whole sequence "
                                                   "(float64)").replace(
            describe_cases(cases, label), describe_cases(cases, shape_label))
    checks.append(ring_check(n, cases, records))
    return checks


def ring_check(n: int, cases: list[dict], records: Records) -> Check:
    """K and V go around the ring once: (N-1)(|K_r| + |V_r|) bytes, right neighbour only."""
    name = "K/V blocks go around the ring: (N-1) x (|K_r| + |V_r|) bytes per rank, to r + 1 only"
    for i, case in enumerate(cases):
        want = (n - 1) * 2 * case["length"] * 8
        for r in range(n):
            rec = records[r][i]
            to = [p for p, _ in rec["peers_sent"]]
            if rec["bytes_sent"] != want or to != [(r + 1) % n]:
                return Check(name, False, (
                    f"{label(case)}: rank {r} sent {rec['bytes_sent']} bytes to ranks {to}; "
                    f"the ring sends {want} = (N-1) x 2 blocks of {case['length']} elements, "
                    f"all to rank {(r + 1) % n}. Keep the given Sendrecv: at step s, pass the "
                    "block you hold to the right and receive the next from the left."),
                    case=label(case))
    big = max(cases, key=lambda c: c["length"])
    return Check(name, True, f"e.g. {(n - 1) * 2 * big['length'] * 8} bytes per rank "
                             f"({label(big)})")
