"""Grader of the binomial-tree broadcast exercise: cases, oracle, the tree's shape.

EN broadcast grader · RU проверка широковещательной рассылки · ZH 广播评分

Formula checked (Thakur, Rabenseifner & Gropp 2005, IJHPCA 19(1)): for S
bytes on N ranks every non-root rank receives S bytes in one message, the
root none; N-1 messages and (N-1) x S bytes in total; no rank sends more
than ceil(log2 N) messages and the tree is at most ceil(log2 N) levels deep.
The last two tell a tree from a linear broadcast only for N >= 4 (for N <= 3,
N-1 <= ceil(log2 N)), so they are graded from 4 ranks up.  The oracle is
MPI's own Bcast.
"""

from __future__ import annotations

import numpy as np
from mpi4py import MPI

from minipar.exercises.grading import Check
from minipar.exercises.judging import Records, contract_checks

SEED = 2005
KINDS = (("random", "float64"), ("ranks", "int64"), ("random", "float32"))
FIRST_STEP = (
    "the receive: count ranks from the root, vr = (r - root) % N; every rank but the root "
    "receives once, with comm.Recv into y = np.empty_like(x), from its parent in the tree."
)


def levels(n: int) -> int:
    """ceil(log2 N): rounds of a binomial tree, and the most any rank sends."""
    return (n - 1).bit_length()


def cases(n: int) -> list[dict]:
    lengths = sorted({0, 1, n - 1, n, n + 1, 1000, 1001})
    roots = sorted({0, n // 2, n - 1})
    return [
        {"length": L, "values": v, "dtype": d, "root": root}
        for root in roots
        for L in lengths
        for v, d in KINDS
    ]


def label(case: dict) -> str:
    return f"root {case['root']}, length {case['length']}, {case['dtype']} ({case['values']})"


def make_input(case: dict, rank: int, size: int) -> tuple[np.ndarray, dict]:
    """The root's data; garbage (NaN, or -1) of the same shape and dtype elsewhere."""
    L, dtype, root = case["length"], np.dtype(case["dtype"]), case["root"]
    if rank != root:
        return np.full(L, np.nan if dtype.kind == "f" else -1, dtype=dtype), {"root": root}
    if case["values"] == "random":
        x = np.random.default_rng([SEED, L, root]).standard_normal(L).astype(dtype)
    else:
        x = ((root + 1) * (np.arange(L) % 89 + 1)).astype(dtype)
    return x, {"root": root}


def oracle(raw: MPI.Comm, case: dict, x: np.ndarray) -> tuple[np.ndarray, None]:
    """MPI's Bcast of the root's x (exact: a broadcast copies bits)."""
    buf = x.copy() if raw.Get_rank() == case["root"] else np.empty_like(x)
    raw.Bcast(buf, root=case["root"])
    return buf, None


def judge(n: int, cases: list[dict], records: Records) -> list[Check]:
    checks = contract_checks(cases, records, label, "Bcast")
    checks.append(receive_check(n, cases, records))
    checks.append(total_check(n, cases, records))
    checks.append(shape_check(n, cases, records))
    return checks


def _nbytes(case: dict) -> int:
    return case["length"] * np.dtype(case["dtype"]).itemsize


def receive_check(n: int, cases: list[dict], records: Records) -> Check:
    name = "every non-root rank receives S bytes, in one message; the root receives nothing"
    for i, case in enumerate(cases):
        S, root = _nbytes(case), case["root"]
        for r in range(n):
            rec = records[r][i]
            b, m = rec["bytes_recv"], rec["msgs_recv"]
            if r == root and (b or m):
                return Check(
                    name,
                    False,
                    (
                        f"{label(case)}: the root received {m} messages ({b} bytes); "
                        "it already has the data and should only send."
                    ),
                )
            if r != root and (b != S or (S and m != 1)):
                return Check(
                    name,
                    False,
                    (
                        f"{label(case)}: rank {r} received {m} messages, {b} bytes; expected "
                        f"one message of S = {S} bytes. Each rank receives once, from its "
                        "parent, then only forwards."
                    ),
                )
    return Check(name, True)


def total_check(n: int, cases: list[dict], records: Records) -> Check:
    name = "N-1 messages and (N-1) x S bytes in total"
    for i, case in enumerate(cases):
        S = _nbytes(case)
        msgs = sum(records[r][i]["msgs_sent"] for r in range(n))
        sent = sum(records[r][i]["bytes_sent"] for r in range(n))
        if sent != (n - 1) * S or (S and msgs != n - 1):
            return Check(
                name,
                False,
                (
                    f"{label(case)}: all ranks together sent {msgs} messages, {sent} bytes; "
                    f"a broadcast to {n - 1} ranks needs exactly {n - 1} messages, "
                    f"{(n - 1) * S} bytes."
                ),
            )
    return Check(name, True)


def shape_check(n: int, cases: list[dict], records: Records) -> Check:
    k = levels(n)
    name = f"a binomial tree: each rank sends at most ceil(log2 N) = {k} messages, depth <= {k}"
    if n < 4:
        return Check(
            name,
            None,
            (
                f"not graded on {n} ranks: with N <= 3, N-1 <= ceil(log2 N), so a linear "
                "broadcast and a tree look the same. Check again with -n 4 or more."
            ),
        )
    for i, case in enumerate(cases):
        if not _nbytes(case):
            continue
        root, recs = case["root"], [records[r][i] for r in range(n)]
        for r in [root] + [q for q in range(n) if q != root]:
            m = recs[r]["msgs_sent"]
            if m > k:
                who = "the root" if r == root else "rank"
                linear = (
                    " This is a linear broadcast: the root sends to everyone, one "
                    "after the other, N-1 messages on one link. In a binomial tree "
                    "every rank that has the data forwards it, so the number of "
                    "holders doubles each round."
                    if r == root and m == n - 1
                    else ""
                )
                return Check(
                    name,
                    False,
                    (
                        f"{label(case)}: {who} {r} sent {m} messages, expected <= ceil(log2 N) = "
                        f"{k}.{linear}"
                    ),
                )
        depth = _depth(n, root, recs)
        if depth > k:
            return Check(
                name,
                False,
                (
                    f"{label(case)}: the tree is {depth} levels deep (the data passes through "
                    f"{depth} hops to reach the last rank): a binomial tree on {n} ranks has "
                    f"ceil(log2 N) = {k}. A chain r -> r+1 is a pipeline, not a tree: let "
                    "every holder send in every round."
                ),
            )
    return Check(name, True)


def _depth(n: int, root: int, recs: list[dict]) -> int:
    """Longest root-to-rank path, following each rank's single parent (0 if not a tree:
    the receive check reports that)."""
    if any(len(recs[r]["peers_recv"]) != 1 for r in range(n) if r != root):
        return 0
    parent = {r: recs[r]["peers_recv"][0][0] for r in range(n) if r != root}
    deepest = 0
    for r in parent:
        d, q = 0, r
        while q != root and d <= n:
            q, d = parent[q], d + 1
        deepest = max(deepest, d)
    return deepest
