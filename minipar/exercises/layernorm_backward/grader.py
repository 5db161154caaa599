"""Grader of the layer-norm backward: the serial layer as oracle, a gradient check, one all-reduce.

EN layer-norm backward grader · RU проверка обратного прохода LayerNorm · ZH 层归一化反向评分

Each case is a batch of rows (b·s tokens of d features, float64) split over the ranks
by ``numpy.array_split``.  The oracle is the serial model's own layer,
:func:`minipar.nn.layers.layernorm_forward` / :func:`~minipar.nn.layers.layernorm_backward`
on all rows: rank r must return its rows of dx and the whole batch's dγ and dβ.  The
judge also checks the oracle itself against central differences of the forward
(a gradient check, on the smallest case), so a pass means "equals the true derivative",
not only "equals our code".  Traffic: one ring all-reduce of 2·d elements, 2(N-1)·S
bytes over all ranks (S = 16·d).
"""

from __future__ import annotations

from functools import lru_cache

import numpy as np
from mpi4py import MPI

from minipar.exercises.grading import Check
from minipar.exercises.judging import Records, contract_checks
from minipar.nn.layers import layernorm_backward, layernorm_forward

SEED = 1607_06450  # the paper's arXiv number
TOL = 1e-12  #: tolerance, relative to the largest entry of each part
#: (rows, d): rows split unevenly over most N; d small enough to read a printed row
SHAPES = ((5, 4), (8, 6), (11, 7))
FIRST_STEP = (
    "layernorm_backward() (TODOs 1-3): dx of your rows needs no message, dγ and dβ are sums "
    "over every row, so over every rank. The file's docstring says which three paths reach x "
    "(WHY IT WORKS); allreduce() is given."
)


def cases(n: int) -> list[dict]:
    return [{"rows": rows, "d": d, "step": i, "length": rows * d + 2 * d, "dtype": "float64",
             "values": "random",
             "split": [len(p) for p in np.array_split(np.arange(rows), n)]}
            for i, (rows, d) in enumerate(SHAPES)]


def label(case: dict) -> str:
    return f"{case['rows']} rows of d = {case['d']}, split {case['split']}"


@lru_cache(maxsize=8)
def _full(rows: int, d: int, step: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    rng = np.random.default_rng([SEED, step])
    x = rng.standard_normal((rows, d)) * 2.0 + 0.5
    gamma = 1.0 + 0.5 * rng.standard_normal(d)
    dy = rng.standard_normal((rows, d))
    return x, gamma, dy


def _rows(case: dict, rank: int) -> slice:
    lo = sum(case["split"][:rank])
    return slice(lo, lo + case["split"][rank])


def make_input(case: dict, rank: int, size: int) -> tuple[np.ndarray, dict]:
    """This rank's rows of x and dy, and γ (the same on every rank)."""
    x, gamma, dy = _full(case["rows"], case["d"], case["step"])
    s = _rows(case, rank)
    return x[s].copy(), {"gamma": gamma.copy(), "dy": dy[s].copy()}


def serial(case: dict) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The serial layer's (dx, dγ, dβ) on all rows."""
    x, gamma, dy = _full(case["rows"], case["d"], case["step"])
    _, saved = layernorm_forward(x, gamma, np.zeros_like(gamma))
    return layernorm_backward(gamma, saved, dy)


def oracle(raw: MPI.Comm, case: dict, x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    dx, dg, db = serial(case)
    parts = [dx[_rows(case, raw.Get_rank())], dg, db]
    atol = np.concatenate([np.full(p.size, TOL * max(1.0, float(np.abs(p).max())))
                           for p in parts])
    return np.concatenate([p.ravel() for p in parts]), atol


def gradient_check(case: dict, h: float = 1e-6) -> float:
    """Largest |analytic - numeric| / max|analytic| of the serial layer's dx, dγ, dβ.

    The loss is L = Σ dy ⊙ y (so ∂L/∂y = dy); every derivative is compared with the
    central difference (L(p + h) - L(p - h)) / 2h, entry by entry."""
    x, gamma, dy = (a.copy() for a in _full(case["rows"], case["d"], case["step"]))
    beta = np.zeros_like(gamma)

    def loss() -> float:
        return float((layernorm_forward(x, gamma, beta)[0] * dy).sum())

    worst = 0.0
    for arr, grad in zip((x, gamma, beta), serial(case)):
        num = np.empty_like(arr)
        for i in np.ndindex(arr.shape):
            keep = arr[i]
            arr[i] = keep + h
            up = loss()
            arr[i] = keep - h
            num[i] = (up - loss()) / (2 * h)
            arr[i] = keep
        worst = max(worst, float(np.abs(num - grad).max() / max(1.0, np.abs(grad).max())))
    return worst


# -- naming the mistake (rank side, no message sent) ------------------------------------------
def _pieces(case: dict, rank: int) -> dict[str, np.ndarray]:
    x, gamma, dy = _full(case["rows"], case["d"], case["step"])
    s = _rows(case, rank)
    xr, dyr = x[s], dy[s]
    mu = xr.mean(axis=-1, keepdims=True)
    rstd = 1.0 / np.sqrt(((xr - mu) ** 2).mean(axis=-1, keepdims=True) + 1e-5)
    xhat = (xr - mu) * rstd
    dxhat = dyr * gamma
    return {"rstd": rstd, "xhat": xhat, "dxhat": dxhat, "dy": dyr,
            "dg": (dyr * xhat).sum(axis=0), "db": dyr.sum(axis=0)}


def _close(a: np.ndarray, b: np.ndarray) -> bool:
    return a.shape == b.shape and bool(np.all(np.abs(a - b) <= TOL * max(1.0, np.abs(b).max())
                                              + 1e-14))


def diagnose(case: dict, rank: int, size: int, x: np.ndarray, out: np.ndarray,
             expected: np.ndarray) -> str | None:
    """The mistake that gives exactly ``out``, in words; None if no known one does."""
    d, k = case["d"], case["split"][rank] * case["d"]
    if out.shape != expected.shape or not k:
        return None
    p = _pieces(case, rank)
    r, xh, g = p["rstd"], p["xhat"], p["dxhat"]
    dx, dg, db = out[:k].reshape(xh.shape), out[k:k + d], out[k + d:]
    said = []
    wrong_dx = {
        "rstd · dx̂ alone, the paths through the row's mean μ and its σ are left out (both "
        "depend on every entry of the row)": r * g,
        "the σ path is left out: dx lacks the - x̂ · mean(dx̂ ⊙ x̂) term": r * (g - g.mean(-1, keepdims=True)),
        "the μ path is left out: dx lacks the - mean(dx̂) term": r * (g - xh * (g * xh).mean(-1, keepdims=True)),
        "γ is not applied: dx̂ = dy ⊙ γ, not dy": r * (p["dy"] - p["dy"].mean(-1, keepdims=True)
                                                       - xh * (p["dy"] * xh).mean(-1, keepdims=True)),
    }
    for words, wrong in wrong_dx.items():
        if _close(dx, wrong):
            said.append(f"dx of your rows: {words}.")
            break
    if size > 1 and _close(dg, p["dg"]) and _close(db, p["db"]):
        said.append("dγ and dβ are the sums over YOUR rows only: they are shared by every row of "
                    "the batch, so finish the sums over the ranks with one allreduce of both.")
    return " ".join(said) or None


def judge(n: int, cases: list[dict], records: Records) -> list[Check]:
    checks = contract_checks(cases, records, label, "layer norm")
    for c in checks:
        c.name = c.name.replace(
            "returns a new array with the input's shape and dtype",
            "returns a new float64 array: pack(dx of your rows, dγ, dβ)").replace(
            "MPI's layer norm", "the serial layer's backward (minipar.nn.layers, float64)")
    worst = gradient_check(min(cases, key=lambda c: c["length"]))
    checks.append(Check("the serial layer agrees with central differences of its forward "
                        "(gradient check)", worst < 1e-7,
                        f"largest difference {worst:.1e} of max|gradient| (h = 1e-6)"))
    checks.append(allreduce_check(n, cases, records))
    return checks


def allreduce_check(n: int, cases: list[dict], records: Records) -> Check:
    """One ring all-reduce of 2·d elements per case: 2(N-1)·S bytes over all ranks."""
    name = "exactly 1 all-reduce, of dγ and dβ's 2·d elements (dx needs no message)"
    for i, case in enumerate(cases):
        S = 2 * case["d"] * 8
        sent = sum(records[r][i]["bytes_sent"] for r in range(n))
        if sent != 2 * (n - 1) * S:
            return Check(name, False, (
                f"{label(case)}: all ranks together sent {sent} bytes = "
                f"{sent / (2 * (n - 1) * S):.2f} x 2(N-1)·S, the volume of one ring all-reduce "
                f"of 2·d = {2 * case['d']} elements (S = {S} bytes); expected exactly 1. "
                "dx of a row needs only that row; only dγ and dβ are summed over the ranks."),
                case=label(case))
    d = cases[-1]["d"]
    return Check(name, True, f"e.g. 2(N-1)·S = {2 * (n - 1) * 16 * d} bytes over all ranks for "
                             f"S = {16 * d} (d = {d})")
