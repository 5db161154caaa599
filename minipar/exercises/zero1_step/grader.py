"""Grader of the ZeRO-1 step exercise: the serial AdamW step, the shard's state, the traffic.

EN ZeRO-1 grader · RU проверка шага ZeRO-1 · ZH ZeRO-1 评分

Formula checked (Rajbhandari et al. 2019, arXiv 1910.02054, P_os): for S = Ψ x 8
bytes, every rank sends one reduce-scatter plus one all-gather,

    2(N-1)/N x S bytes           (between 2(N-1)·floor(Ψ/N) and 2(N-1)·ceil(Ψ/N) elements)
    2(N-1) x S over all ranks    (each of the two collectives moves (N-1) x S in total)

whereas an all-reduce of the gradients followed by the all-gather would send
3(N-1)/N x S.  The result must equal the serial step: ``minipar.optim.AdamW``
on the full buffer with the mean gradient over ranks.

How the shard's optimizer state is graded: each rank is handed only the
moments m, v of its own slice, so a right result *proves* it stepped its own
slice and gathered the rest (it has nothing else to step with); each length
runs two steps in a row, the second starting from the very ``state`` dict the
first one updated, so m, v and t must be kept in place.  Gradients are
multiples of 2**-16 (sums exact in any order); the tolerance 1e-13 + 1e-12·|p|
allows only the rounding of a differently ordered AdamW formula.
"""

from __future__ import annotations

import numpy as np
from mpi4py import MPI

from minipar import spans
from minipar.exercises.grading import Check
from minipar.exercises.judging import Records, contract_checks
from minipar.optim import AdamW

SEED = 1910_02054  # the paper's arXiv number
HYPER = {"lr": 1e-2, "betas": (0.9, 0.999), "eps": 1e-8, "weight_decay": 0.01}
FIRST_STEP = (
    "the reduce-scatter: N-1 comm.Sendrecv steps on the ring (r + 1) % N, (r - 1) % N that "
    "leave the sum of your own slice r in g[r]; then g[r] / N is its mean gradient."
)
_states: dict[int, dict] = {}  # length -> the state dict handed to the learner (per rank)


def cases(n: int) -> list[dict]:
    return [{"length": L, "dtype": "float64", "step": s}
            for L in sorted({1, n + 1, 1000, 1001}) for s in (1, 2)]


def label(case: dict) -> str:
    return f"length {case['length']}, step {case['step']}"


def grads(length: int, step: int, rank: int) -> np.ndarray:
    """Rank ``rank``'s gradient at ``step``: integers in [-64, 64] x 2**-16 (exact sums)."""
    k = np.random.default_rng([SEED, length, step, rank]).integers(-64, 65, length)
    return k.astype(np.float64) * 2.0**-16


def serial(length: int, world: int, steps: int) -> tuple[np.ndarray, AdamW]:
    """Parameters and full-buffer AdamW after ``steps`` serial steps on the mean gradient."""
    p = np.random.default_rng([SEED, length]).standard_normal(length) * 0.02
    opt = AdamW(length, **HYPER)
    for s in range(1, steps + 1):
        total = sum(grads(length, s, q) for q in range(world))
        opt.step(p, total / world)
    return p, opt


def shard(length: int, world: int, rank: int) -> slice:
    """Rank ``rank``'s slice: ZeRO's rule (:func:`minipar.parallel.zero.shard.shard_range`,
    :func:`minipar.spans.span`), here with lengths shorter than the ranks too."""
    return slice(*spans.span(length, world, rank))


def make_input(case: dict, rank: int, size: int) -> tuple[np.ndarray, dict]:
    """x = this rank's gradient; params after step-1 steps; the optimizer-state shard
    (fresh at step 1, at step 2 the same dict the learner's step 1 updated)."""
    L, step = case["length"], case["step"]
    params, _ = serial(L, size, step - 1)
    if step == 1:
        n = shard(L, size, rank).stop - shard(L, size, rank).start
        _states[L] = {"m": np.zeros(n), "v": np.zeros(n), "t": 0}
    return grads(L, step, rank), {"params": params, "state": _states[L], **HYPER}


def oracle(raw: MPI.Comm, case: dict, x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The serial AdamW step on the full buffer (no communication needed: every rank's
    gradient is a function of (length, step, rank)), and the rounding tolerance."""
    expected, _ = serial(case["length"], raw.Get_size(), case["step"])
    return expected, 1e-13 + 1e-12 * np.abs(expected)


def judge(n: int, cases: list[dict], records: Records) -> list[Check]:
    checks = contract_checks(cases, records, label, "AdamW step")
    for c in checks:  # the oracle here is the serial optimizer, not an MPI collective
        c.name = c.name.replace("MPI's AdamW step", "minipar.optim's serial AdamW step")
    checks.append(state_check(cases, records))
    checks.append(bytes_check(n, cases, records))
    return checks


def state_check(cases: list[dict], records: Records) -> Check:
    """Step 1 right but step 2 wrong: the shard's m, v, t were not kept in place."""
    name = "keeps its optimizer-state shard between steps (m, v, t updated in place)"
    wrong = {(c["length"], c["step"]) for i, c in enumerate(cases)
             if any(recs[i]["mismatch"] or recs[i]["contract"] for recs in records)}
    for L, step in sorted(wrong):
        if step == 2 and (L, 1) not in wrong:
            return Check(name, False, (
                f"length {L}: step 1 was right, step 2 was not. Step 2 starts from the state "
                "dict your step 1 updated: change state['m'] and state['v'] in place "
                "(m *= b1; m += (1 - b1) * g), do not rebind them (m = b1 * m + ...), and "
                "increment state['t']."))
    return Check(name, True)


def bytes_check(n: int, cases: list[dict], records: Records) -> Check:
    name = "bytes per rank = reduce-scatter + all-gather = 2(N-1)/N x S (no all-reduce)"
    for i, case in sorted(enumerate(cases), key=lambda ic: -ic[1]["length"]):  # clearest first
        L = case["length"]
        S = L * 8
        lo, hi = 2 * (n - 1) * (L // n) * 8, 2 * (n - 1) * -(-L // n) * 8
        sent = [records[r][i]["bytes_sent"] for r in range(n)]
        for r, b in enumerate(sent):
            if not lo <= b <= hi:
                extra = (" That is 3(N-1)/N x S: an all-reduce of the gradients (2(N-1)/N x S) "
                         "plus the all-gather; ZeRO-1 needs only the reduce-scatter half."
                         if S and abs(b / S - 3 * (n - 1) / n) < 0.5 / n else "")
                return Check(name, False, (
                    f"{label(case)}: rank {r} sent {b} bytes = {b / S if S else 0:.2f} x S "
                    f"(S = {S}); a reduce-scatter plus an all-gather sends between {lo} and "
                    f"{hi} bytes per rank." + extra))
        if sum(sent) != 2 * (n - 1) * S:
            return Check(name, False, (
                f"{label(case)}: all ranks together sent {sum(sent)} bytes; a reduce-scatter "
                f"plus an all-gather send 2(N-1) x S = {2 * (n - 1) * S}."))
    big = max(cases, key=lambda c: (c["length"] % n == 0, c["length"]))
    S = big["length"] * 8
    return Check(name, True, f"e.g. {2 * (n - 1) * S // n} bytes per rank for S = {S}")
