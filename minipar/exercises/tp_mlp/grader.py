"""Grader of the tensor-parallel MLP exercise: the serial MLP, its gradients, the all-reduces.

EN tensor-parallel MLP grader · RU проверка тензорно-параллельного MLP · ZH 张量并行 MLP 评分

Each input shape runs twice: a *forward* case (``dy`` is None, the result is
y) and a *backward* case (the result is ``pack(dx, dw1, db1, dw2, db2)``,
this rank's shard of every weight gradient).  The oracle is the serial MLP,
:func:`minipar.nn.mlp.mlp_forward` / ``mlp_backward`` on the full weights
(float64), of which rank r's shards are cut (columns r·k … (r+1)·k of W1
and b1, the same rows of W2, k = d_ff / N).  Tolerance: 1e-11 x the largest
entry of each part (rounding only: the ranks sum over d_ff in another order).

Formula checked (Shoeybi et al. 2019, arXiv 1909.08053, Fig. 3a): exactly one
all-reduce of S = b·s·h x 8 bytes in each case (g forward, f's adjoint
backward), measured as the bytes all ranks together sent, which is exactly
2(N-1)·S for one ring all-reduce, and 2(N-1)/N x S per rank (between
2(N-1)·floor(L/N) and 2(N-1)·ceil(L/N) elements, L = b·s·h).  The named
mistakes (:func:`diagnose`, worked out from the full weights, no message
sent): an all-reduce after the first linear, no g, the bias added on every
rank, no all-reduce of dx, weight gradients summed over ranks, db2 split.
"""

from __future__ import annotations

from functools import lru_cache

import numpy as np
from mpi4py import MPI

from minipar.exercises.grading import Check
from minipar.exercises.judging import Records, contract_checks
from minipar.exercises.tp_mlp.solution import gelu, gelu_grad, pack
from minipar.nn.mlp import mlp_backward, mlp_forward

SEED = 1909_08053  # the paper's arXiv number
TOL = 1e-11  #: tolerance, relative to the largest entry of each part
#: (batch, seq, d_model, d_ff per rank): d_ff = N x the last number, so N always divides it
SHAPES = ((2, 3, 8, 8), (1, 4, 5, 3))
PARTS = ("dx", "dw1", "db1", "dw2", "db2")
FIRST_STEP = (
    "forward() (TODO 1), then backward() (TODO 2): both still raise NotImplementedError. "
    "Read WHY IT WORKS in the file's docstring: what your columns of W1 and your rows of W2 "
    "each give you, and where the one all-reduce of each direction goes (allreduce() is given)."
)


def cases(n: int) -> list[dict]:
    out = []
    for b, s, h, f in SHAPES:
        k = f  # d_ff / N
        for part in ("forward", "backward"):
            length = b * s * h + (2 * h * k + k + h if part == "backward" else 0)
            out.append({"part": part, "batch": b, "seq": s, "d_model": h, "d_ff": f * n,
                        "length": length, "dtype": "float64"})
    return out


def label(case: dict) -> str:
    return (f"{case['part']}, x {case['batch']}x{case['seq']}x{case['d_model']}, "
            f"d_ff {case['d_ff']}")


@lru_cache(maxsize=8)
def full(b: int, s: int, h: int, d_ff: int) -> dict[str, np.ndarray]:
    """The full (unsliced) weights and data of a shape: partition-independent."""
    g = np.random.default_rng([SEED, b, s, h, d_ff])
    return {"x": g.standard_normal((b, s, h)),
            "w_in": g.standard_normal((h, d_ff)) / np.sqrt(h),
            "b_in": 0.5 * g.standard_normal(d_ff),
            "w_out": g.standard_normal((d_ff, h)) / np.sqrt(d_ff),
            "b_out": 0.5 * g.standard_normal(h),
            "dy": g.standard_normal((b, s, h))}


def _full(case: dict) -> dict[str, np.ndarray]:
    return full(case["batch"], case["seq"], case["d_model"], case["d_ff"])


def cols(case: dict, rank: int, size: int) -> slice:
    k = case["d_ff"] // size
    return slice(rank * k, (rank + 1) * k)


def make_input(case: dict, rank: int, size: int) -> tuple[np.ndarray, dict]:
    """x (the same on every rank), this rank's shards of W1, b1, W2, the full b2, and dy
    (None in the forward case)."""
    f, c = _full(case), cols(case, rank, size)
    return f["x"].copy(), {
        "w1": f["w_in"][:, c].copy(), "b1": f["b_in"][c].copy(),
        "w2": f["w_out"][c, :].copy(), "b2": f["b_out"].copy(),
        "dy": f["dy"].copy() if case["part"] == "backward" else None}


def serial(case: dict) -> tuple[np.ndarray, np.ndarray, dict[str, np.ndarray]]:
    """The serial MLP on the full weights: y, dx and the full weight gradients."""
    f = _full(case)
    p = {k: f[k] for k in ("w_in", "b_in", "w_out", "b_out")}
    y, saved = mlp_forward(p, f["x"])
    dx, grads = mlp_backward(p, saved, f["dy"])
    return y, dx, grads


def expected_parts(case: dict, rank: int, size: int) -> list[np.ndarray]:
    """[y] (forward) or [dx, dw1, db1, dw2, db2] of this rank (backward)."""
    y, dx, g = serial(case)
    if case["part"] == "forward":
        return [y]
    c = cols(case, rank, size)
    return [dx, g["w_in"][:, c], g["b_in"][c], g["w_out"][c, :], g["b_out"]]


def oracle(raw: MPI.Comm, case: dict, x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The serial result (this rank's shard of it) and the tolerance per entry."""
    parts = expected_parts(case, raw.Get_rank(), raw.Get_size())
    atol = pack(*[np.full(p.shape, TOL * max(1.0, float(np.abs(p).max()))) for p in parts])
    if case["part"] == "forward":
        return parts[0], atol.reshape(parts[0].shape)
    return pack(*parts), atol


# -- naming the mistake (rank side, no message sent) ------------------------------------------
def _close(a: np.ndarray, b: np.ndarray) -> bool:
    return a.shape == b.shape and bool(np.all(np.abs(a - b) <= TOL * max(1.0, np.abs(b).max())))


def diagnose(case: dict, rank: int, size: int, x: np.ndarray, out: np.ndarray,
             expected: np.ndarray) -> str | None:
    """The mistake that gives exactly ``out``, in words; None if no known one does."""
    if size < 2:
        return None
    f = _full(case)
    shards = [cols(case, q, size) for q in range(size)]
    a = [f["x"] @ f["w_in"][:, c] + f["b_in"][c] for c in shards]
    if case["part"] == "forward":
        return _forward_mistake(f, shards, a, rank, size, out, expected)
    return _backward_mistake(case, f, shards, a, rank, size, out)


def _forward_mistake(f: dict, shards: list[slice], a: list[np.ndarray], rank: int, size: int,
                     out: np.ndarray, expected: np.ndarray) -> str | None:
    b2, w2 = f["b_out"], [f["w_out"][c, :] for c in shards]
    mine = gelu(a[rank]) @ w2[rank]
    hidden, act = sum(a), sum(gelu(ai) for ai in a)
    if _close(out, expected + (size - 1) * b2):
        return (f"y is off by exactly (N-1) x b2 (N = {size}): you added the bias b2 on every "
                "rank before the all-reduce, so the sum holds it N times. The row-parallel "
                "output is a partial sum: add b2 once, after the all-reduce.")
    if _close(out, mine + b2) or _close(out, mine):
        return ("y is this rank's partial sum GELU(a_r) W2_r only: the all-reduce g after the "
                "row-parallel linear is missing. Each rank holds d_ff/N of the rows of W2, so "
                "the N partial products must be summed.")
    for z in (hidden, act):
        if any(_close(out, cand) for cand in (gelu(z) @ w2[rank] + b2, z @ w2[rank] + b2,
                                               sum(gelu(z) @ w for w in w2) + b2,
                                               sum(z @ w for w in w2) + b2)):
            return ("you all-reduced after the first (column-parallel) linear. Its output "
                    "columns are whole features, not partial sums: rank r's a_r = x W1_r + b1_r "
                    "is complete, GELU is applied to it locally, and nothing is summed until "
                    "the row-parallel output (one all-reduce, g).")
    return None


def _backward_mistake(case: dict, f: dict, shards: list[slice], a: list[np.ndarray], rank: int,
                      size: int, out: np.ndarray) -> str | None:
    want = expected_parts(case, rank, size)
    got, at = [], 0
    for p in want:
        got.append(out.reshape(-1)[at:at + p.size].reshape(p.shape))
        at += p.size
    wrong = [name for name, g, w in zip(PARTS, got, want) if not _close(g, w)]
    if not wrong:
        return None
    said = []
    if "dx" in wrong:
        c = shards[rank]
        dh = f["dy"] @ f["w_out"][c, :].T
        da = dh * gelu_grad(a[rank])
        if _close(got[0], da @ f["w_in"][:, c].T):
            said.append("dx is this rank's partial sum da_r W1_rᵀ only: you forgot the "
                        "all-reduce of dx. f is the identity forward, so its backward is an "
                        "all-reduce: x fed all N shards of W1, and its gradient is the sum of "
                        "the N paths.")
    grads = [expected_parts(case, q, size) for q in range(size)]
    for i, name in ((1, "dw1"), (2, "db1"), (3, "dw2")):
        if name in wrong and _close(got[i], sum(g[i] for g in grads)):
            said.append(f"{name} is the sum of the N ranks' shards: weight gradients are not "
                        "summed over tensor-parallel ranks, each rank owns a different shard "
                        "(summing replicas' gradients is data parallelism's job).")
            break
    if "db2" in wrong and (_close(got[4], want[4] / size) or _close(got[4], want[4] * size)):
        said.append("db2 is scaled by N or 1/N: b2 is added once, after the all-reduce, and is "
                    "the same on every rank: its gradient is Σ dy, the same on every rank.")
    right = [p for p in PARTS if p not in wrong]
    return " ".join(said) or (f"wrong in the backward: {', '.join(wrong)}"
                              + (f" (right: {', '.join(right)})" if right else "") + ".")


# -- judging (launcher side) -------------------------------------------------------------------
def judge(n: int, cases: list[dict], records: Records) -> list[Check]:
    checks = contract_checks(cases, records, label, "MLP")
    for c in checks:
        c.name = c.name.replace(
            "returns a new array with the input's shape and dtype",
            "returns a new float64 array: y of x's shape (forward), "
            "pack(dx, dw1, db1, dw2, db2) (backward)").replace(
            "MPI's MLP", "the serial MLP (minipar.nn.mlp, float64)")
    checks.append(allreduce_check(n, cases, records, "forward"))
    checks.append(allreduce_check(n, cases, records, "backward"))
    return checks


NAMES = {
    "forward": "forward: exactly 1 all-reduce, of y's b·s·h elements (g after the row-parallel "
               "linear)",
    "backward": "backward: exactly 1 all-reduce, of dx's b·s·h elements (f's backward)",
}


def allreduce_check(n: int, cases: list[dict], records: Records, part: str) -> Check:
    """One ring all-reduce of b·s·h elements per case: 2(N-1)·S bytes over all ranks."""
    name = NAMES[part]
    for i, case in enumerate(cases):
        if case["part"] != part:
            continue
        b, s, h, k = case["batch"], case["seq"], case["d_model"], case["d_ff"] // n
        L = b * s * h
        one = 2 * (n - 1) * L * 8
        sent = [records[r][i]["bytes_sent"] for r in range(n)]
        if sum(sent) != one:
            return Check(name, False, (
                f"{label(case)}: all ranks together sent {sum(sent)} bytes = "
                f"{sum(sent) / one:.2f} x 2(N-1)·S, the volume of one ring all-reduce of "
                f"b·s·h = {L} elements (S = {8 * L} bytes); expected exactly 1."
                + _why(part, sum(sent) - one, n, L, b * s * k, (h * k, k))), case=label(case))
        lo, hi = 2 * (n - 1) * (L // n) * 8, 2 * (n - 1) * -(-L // n) * 8
        for r, got in enumerate(sent):
            if not lo <= got <= hi:
                return Check(name, False, (
                    f"{label(case)}: rank {r} sent {got} bytes; in a ring all-reduce of {L} "
                    f"elements every rank sends between {lo} and {hi}. Use the ring "
                    "allreduce(comm, a) of the skeleton, not a gather to one rank."),
                    case=label(case))
    big = max((c for c in cases if c["part"] == part), key=lambda c: c["length"])
    L = big["batch"] * big["seq"] * big["d_model"]
    return Check(name, True, f"e.g. 2(N-1)/N x S = {2 * (n - 1) * L * 8 // n} bytes per rank "
                             f"for S = {8 * L} ({label(big)})")


def _why(part: str, extra: int, n: int, L: int, hidden: int, shard: tuple[int, int]) -> str:
    """The extra (or missing) traffic in words."""
    vol = 2 * (n - 1) * 8  # bytes over all ranks per element all-reduced
    if extra == -vol * L:
        return (" No all-reduce at all: each rank's y is only its partial sum (g is missing)."
                if part == "forward" else
                " No all-reduce of dx: each rank's da_r W1_rᵀ is a partial sum over its d_ff/N "
                "features (f's backward is the all-reduce).")
    if part == "forward" and extra == vol * hidden:
        return (f" The extra one has the size of the hidden activation a_r (b·s·d_ff/N = "
                f"{hidden} elements): an all-reduce after the first linear, which the "
                "column-parallel layout does not need.")
    if part == "backward" and extra == vol * L:
        return (" The backward needs only dx summed: dy is already the same on every rank "
                "(g's backward is the identity).")
    hk, k = shard  # elements of dw1 (= of dw2) and of db1
    if part == "backward" and extra in (vol * hk, 2 * vol * hk, vol * (2 * hk + k)):
        return (" The extra traffic has the size of your weight-gradient shards: they are not "
                "summed over tensor-parallel ranks (each rank owns a different shard).")
    return ""
