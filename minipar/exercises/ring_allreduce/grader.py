"""Grader of the ring all-reduce exercise: cases, oracle, and the ring's traffic.

EN ring all-reduce grader · RU проверка кольцевого all-reduce · ZH 环形全归约评分

Formula checked (Patarasuk & Yuan 2009; docs/REFERENCES.md): for a
buffer of S bytes on N ranks, every rank sends and receives

    2(N-1)/N x S bytes                       (exactly, when N divides the length L)
    2(N-1) chunks of floor(L/N)..ceil(L/N)   (otherwise; 2(N-1) x S over all ranks)

only to (r+1)%N and only from (r-1)%N.  The oracle is MPI's own Allreduce.
"""

from __future__ import annotations

import math

import numpy as np
from mpi4py import MPI

from minipar.exercises.grading import Check
from minipar.exercises.judging import Records, any_calls, contract_checks

SEED = 20_09  # Patarasuk & Yuan's year: any fixed seed works
#: (values, dtype): random floats test rounding; rank-valued integers make sums exact
KINDS = (
    ("random", "float64"),
    ("ranks", "float64"),
    ("random", "float32"),
    ("ranks", "int64"),
    ("ranks", "int32"),
)
FIRST_STEP = (
    "the reduce-scatter: N-1 steps in which every rank sends one chunk of y = x.copy() to "
    "(r + 1) % N with comm.Sendrecv and adds the chunk arriving from (r - 1) % N into its own."
)


def lengths(n: int) -> list[int]:
    return sorted({0, 1, n - 1, n, n + 1, 1000, 1001})


def cases(n: int) -> list[dict]:
    return [{"length": L, "values": v, "dtype": d} for L in lengths(n) for v, d in KINDS]


def label(case: dict) -> str:
    kind = {"ranks": "rank"}.get(case["values"], case["values"])
    return f"length {case['length']}, {case['dtype']} ({kind} values)"


def make_input(case: dict, rank: int, size: int) -> tuple[np.ndarray, dict]:
    """This rank's x: random normals, or (rank+1) x small integers (exact sums)."""
    L, dtype = case["length"], np.dtype(case["dtype"])
    if case["values"] == "random":
        x = np.random.default_rng([SEED, L, rank]).standard_normal(L).astype(dtype)
    else:
        x = ((rank + 1) * (np.arange(L) % 89 + 1)).astype(dtype)
    return x, {}


def parts(case: dict, size: int) -> list[np.ndarray]:
    """Every rank's x (a function of the case and the rank): the terms of the expected sum."""
    return [make_input(case, q, size)[0] for q in range(size)]


def oracle(raw: MPI.Comm, case: dict, x: np.ndarray) -> tuple[np.ndarray, np.ndarray | None]:
    """MPI's Allreduce, and the rounding bound N·eps·Σ|x_r| for random floats."""
    expected = np.empty_like(x)
    raw.Allreduce(x, expected, op=MPI.SUM)
    if case["values"] != "random":
        return expected, None
    abs_sum = np.empty_like(x)
    raw.Allreduce(np.abs(x), abs_sum, op=MPI.SUM)
    eps = float(np.finfo(x.dtype).eps)
    return expected, raw.Get_size() * eps * abs_sum.astype(np.float64)


def judge(n: int, cases: list[dict], records: Records) -> list[Check]:
    checks = contract_checks(cases, records, label, "Allreduce")
    checks.append(neighbour_check(n, cases, records))
    checks.append(bytes_check(n, cases, records))
    return checks


def neighbour_check(n: int, cases: list[dict], records: Records) -> Check:
    name = "talks only to its ring neighbours: sends to (r+1)%N, receives from (r-1)%N"
    for i, case in _clearest_first(n, cases):
        for r in range(n):
            rec = records[r][i]
            right, left = {(r + 1) % n} - {r}, {(r - 1) % n} - {r}
            to = [p for p, _ in rec["peers_sent"] if p not in right]
            frm = [p for p, _ in rec["peers_recv"] if p not in left]
            if not (to or frm):
                continue
            hub = _hub(n, [records[q][i] for q in range(n)])
            if hub is not None:
                p, rec_p = hub
                return Check(
                    name,
                    False,
                    (
                        f"{label(case)}: rank {p} received from all {n - 1} other ranks "
                        f"({rec_p['msgs_recv']} messages) and sent to all of them: this is the "
                        "parameter-server pattern (gather to a root, send back), not a ring. "
                        f"Rank {p}'s link carries (N-1) x S each way; in a ring every rank "
                        "talks only to its two neighbours and sends 2(N-1)/N x S."
                    ),
                )
            what = f"sent to rank {to[0]}" if to else f"received from rank {frm[0]}"
            return Check(
                name,
                False,
                (
                    f"{label(case)}: rank {r} {what}; in a ring of {n} ranks rank {r} sends "
                    f"only to rank {(r + 1) % n} and receives only from rank {(r - 1) % n}."
                ),
            )
    return Check(name, True)


def _hub(n: int, recs: list[dict]) -> tuple[int, dict] | None:
    """A rank that received from every other rank (n >= 3): a parameter server."""
    for p, rec in enumerate(recs):
        if n >= 3 and len({q for q, _ in rec["peers_recv"]} - {p}) == n - 1:
            return p, rec
    return None


def bytes_check(n: int, cases: list[dict], records: Records) -> Check:
    """Bytes per rank equal the ring's 2(N-1)/N x S (bounds for uneven chunks)."""
    name = "bytes per rank = 2(N-1)/N x S, sent and received (the ring's count)"
    big = max(cases, key=lambda c: (c["length"] % n == 0, c["length"], c["dtype"] == "float64"))
    S_big = big["length"] * np.dtype(big["dtype"]).itemsize
    passed = f"e.g. {2 * (n - 1) * S_big // n} bytes for S = {S_big} ({label(big)})"
    for i, case in _clearest_first(n, cases):
        L, item = case["length"], np.dtype(case["dtype"]).itemsize
        S = L * item
        lo, hi = 2 * (n - 1) * (L // n) * item, 2 * (n - 1) * math.ceil(L / n) * item
        recs = [records[r][i] for r in range(n)]
        for r, rec in enumerate(recs):
            for way in ("sent", "recv"):
                b = rec[f"bytes_{way}"]
                if lo <= b <= hi:
                    continue
                verb = "sent" if way == "sent" else "received"
                want = f"exactly {lo}" if lo == hi else f"between {lo} and {hi}"
                return Check(
                    name,
                    False,
                    (
                        f"{label(case)}: rank {r} {verb} {b} bytes = {b / S if S else 0:.2f} x S "
                        f"(S = {S}); in a ring each rank {verb.replace('ent', 'ends').replace('ived', 'ives')} "
                        f"{want} bytes = 2(N-1)/N x S." + _zero_hint(n, records, b)
                    ),
                )
        total = sum(rec["bytes_sent"] for rec in recs)
        if total != 2 * (n - 1) * S:
            return Check(
                name,
                False,
                (
                    f"{label(case)}: all ranks together sent {total} bytes; a ring sends "
                    f"2(N-1) x S = {2 * (n - 1) * S} (every chunk travels N-1 hops twice)."
                    + _zero_hint(n, records, total)
                ),
            )
    return Check(name, True, passed)


def _clearest_first(n: int, cases: list[dict]) -> list[tuple[int, dict]]:
    """(index, case), cases whose length N divides first, empty ones last: clearer messages."""
    return sorted(
        enumerate(cases), key=lambda ic: (ic[1]["length"] == 0, ic[1]["length"] % n != 0, ic[0])
    )


def _zero_hint(n: int, records: Records, b: int) -> str:
    if b != 0 or n == 1:
        return ""
    if any_calls(records):
        return " The data went through MPI's own collective, which a ring's count does not see."
    return (
        " Nothing went through the communicator you were given: use the comm "
        "argument (not MPI.COMM_WORLD or comm.comm), so its traffic is measured."
    )
