"""Grader of allgather_mask: the learner's mask against the one all-gather attention uses.

EN all-gather context parallelism grader · RU проверка маски контекстного параллелизма ·
ZH 全收集上下文并行掩码评分

Each case is (s, P, r): rank r of P, a sequence of s positions cut into 2P chunks.  The
oracle is the mask of :mod:`minipar.parallel.context_parallel.allgather_attention`: the
positions :class:`~minipar.parallel.context_parallel.layout.Sharding` (zigzag) gives rank
r, each against keys 0 … its own position.  The mask travels as float64 0/1, row by row.
``diagnose`` reads a wrong mask back as positions (a causal row is a prefix: its length
says which query it is) and names the mistake: a chunk off by one, the contiguous
(unbalanced) split, or a query that sees a key after its own position.
"""

from __future__ import annotations

from typing import Any

import numpy as np
from mpi4py import MPI

from minipar.exercises.grading import Check
from minipar.exercises.judging import Records, contract_checks
from minipar.parallel.context_parallel.layout import Sharding

FIRST_STEP = (
    "causal_mask() (TODOs 1-2): the positions rank r holds (chunks r and 2P-1-r), then for "
    "each the keys it may see (THE GOAL in the file's docstring)."
)


def cases(n: int) -> list[dict]:
    return [{"s": s, "P": P, "r": r, "length": s // P * s, "dtype": "float64", "values": "mask"}
            for P in (2, 3, 4) for s in (4 * P, 8 * P) for r in range(P)]


def label(case: dict) -> str:
    return f"s = {case['s']}, P = {case['P']}, rank {case['r']}"


def _mask(s: int, P: int, r: int) -> np.ndarray:
    mine = Sharding(s, P, zigzag=True).positions(r)
    return np.arange(s)[None, :] <= mine[:, None]


def make_input(case: dict, rank: int, size: int) -> tuple[np.ndarray, dict]:
    """The key positions 0 … s-1 (read by no one), and the case."""
    return np.arange(case["s"], dtype=np.float64), {k: case[k] for k in ("s", "P", "r")}


def mask_step(fn: Any, comm: Any, x: np.ndarray, s: int, P: int, r: int) -> np.ndarray:
    """The learner's mask for (s, P, r) as float64 0/1, row by row (any shape: the contract
    check names a wrong one)."""
    return np.asarray(fn(s, P, r), dtype=np.float64).ravel()


def oracle(raw: MPI.Comm, case: dict, x: np.ndarray) -> tuple[np.ndarray, None]:
    return _mask(case["s"], case["P"], case["r"]).astype(np.float64).ravel(), None


def _chunks(positions: list[int], c: int) -> list[int]:
    return list(dict.fromkeys(p // c for p in positions))


def diagnose(case: dict, rank: int, size: int, x: np.ndarray, out: np.ndarray,
             expected: np.ndarray) -> str | None:
    s, P, r = case["s"], case["P"], case["r"]
    if out.shape != expected.shape:
        return None
    c, t = s // (2 * P), s // P
    got = out.reshape(t, s) > 0.5
    want = Sharding(s, P, zigzag=True).positions(r).tolist()
    rows = [int(row.sum()) - 1 if row.any() and row[:int(row.sum())].all() else None
            for row in got]  # a causal row is a prefix 0 … p: it names its query p
    need = [r, 2 * P - 1 - r]
    if None not in rows and rows != want and _chunks(rows, c) != need:
        if rows == list(range(r * t, (r + 1) * t)):
            return (f"your rows are rank {r}'s contiguous positions {r * t}…{(r + 1) * t - 1}: "
                    f"an unbalanced split (rank {P - 1} would compute about {P}x the scores "
                    f"of rank 0). Llama 3 gives rank r chunks r and 2P-1-r of c = s/(2P) = "
                    f"{c}: here chunks {r} and {2 * P - 1 - r}.")
        have = _chunks(rows, c)
        h, n = next(((h, n) for h, n in zip(have, need) if h != n), (have, need))
        return (f"a chunk off by one: your rows are chunks {have} of c = {c} positions; "
                f"rank {r} holds chunks {need} (r and 2P-1-r = {2 * P - 1 - r}), so you "
                f"used chunk {h} where chunk {n} belongs.")
    for i, p in enumerate(want):
        later = np.flatnonzero(got[i, p + 1:])
        if later.size:
            return (f"a query sees the future: rank {r}'s query {i} (position {p}) sees the key "
                    f"at position {p + 1 + int(later[0])}. Causal means keys 0…p only, per "
                    f"position: not the whole of the query's own chunk.")
    for i, p in enumerate(want):
        if not got[i, :p + 1].all():
            return (f"rank {r}'s query {i} (position {p}) does not see every key 0…{p}: "
                    f"the causal mask hides only the keys after the query (itself included "
                    f"in what it sees).")
    return None


def judge(n: int, cases: list[dict], records: Records) -> list[Check]:
    checks = contract_checks(cases, records, label, "mask")
    for c in checks:
        c.name = c.name.replace(
            "returns a new array with the input's shape and dtype",
            "causal_mask() returns a (s/P, s) mask").replace(
            "result equals MPI's mask",
            "equals all-gather attention's load-balanced causal mask")
    # no message is sent and the input is never read: neither is graded
    return [c for c in checks if not c.name.startswith(("leaves the input", "built from"))]
