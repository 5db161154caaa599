"""Grader of the parameter-server exercise: the serial step, the star's traffic, the mistakes.

EN parameter server grader · RU проверка сервера параметров · ZH 参数服务器评分

Formula checked (Li et al. 2014, OSDI '14; ``minipar.plan.parameter_server_bytes_at_server``):
with W = N-1 workers and S = Ψ x 8 bytes of parameters, one synchronous step

    server:  receives W x S (the gradients), sends W x S (the parameters)
    worker:  sends S, receives S, and only to / from the server (rank 0)

The result must equal the step computed serially: g = mean of the workers'
gradients, v = μ·v + g (the server's momentum buffer), p - lr·v.  Gradients
are integers x 2**-16, so their sum is exact in any order; the tolerance
1e-15 + 1e-12·|p| allows only the rounding of the division and the update.
Each length runs two steps in a row, the second from the ``state`` dict the
first updated: the momentum makes the server's state matter, so a server
that broadcasts the averaged *gradient* (and lets the workers step without
the momentum buffer) is caught at step 2 even though its bytes are right.
"""

from __future__ import annotations

import numpy as np
from mpi4py import MPI

from minipar.exercises.grading import Check
from minipar.exercises.judging import Records, contract_checks

SEED = 2014  # Li et al.'s year
LR, MOMENTUM = 0.1, 0.9
SERVER = 0
FIRST_STEP = (
    "the push: on a worker (rank > 0) comm.Send(x, dest=0), then comm.Recv the new "
    "parameters from rank 0; on the server, receive the W = N-1 gradients first."
)
_states: dict[int, dict] = {}  # length -> the server's state dict handed to the learner


def cases(n: int) -> list[dict]:
    return [{"length": L, "dtype": "float64", "step": s}
            for L in sorted({1, n + 1, 1000, 1001}) for s in (1, 2)]


def label(case: dict) -> str:
    return f"length {case['length']}, step {case['step']}"


def grad(length: int, step: int, rank: int) -> np.ndarray:
    """Worker ``rank``'s gradient at ``step``: integers in [-64, 64] x 2**-16 (exact sums)."""
    k = np.random.default_rng([SEED, length, step, rank]).integers(-64, 65, length)
    return k.astype(np.float64) * 2.0**-16


def mean_grad(length: int, step: int, world: int) -> np.ndarray:
    return sum(grad(length, step, w) for w in range(1, world)) / (world - 1)


def serial(length: int, world: int, steps: int) -> tuple[np.ndarray, np.ndarray]:
    """(parameters, momentum buffer) after ``steps`` synchronous steps."""
    p = np.random.default_rng([SEED, length]).standard_normal(length)
    v = np.zeros(length)
    for s in range(1, steps + 1):
        v = MOMENTUM * v + mean_grad(length, s, world)
        p = p - LR * v
    return p, v


def make_input(case: dict, rank: int, size: int) -> tuple[np.ndarray, dict]:
    """x = this worker's gradient (zeros on the server); params after step-1 steps; the
    server's state (fresh at step 1, at step 2 the dict the learner's step 1 updated)."""
    L, step = case["length"], case["step"]
    params, _ = serial(L, size, step - 1)
    state = None
    if rank == SERVER:
        if step == 1:
            _states[L] = {"v": np.zeros(L)}
        state = _states[L]
    x = grad(L, step, rank) if rank != SERVER else np.zeros(L)
    return x, {"params": params, "state": state, "lr": LR, "momentum": MOMENTUM}


def oracle(raw: MPI.Comm, case: dict, x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The step computed serially (every gradient is a function of the case and the rank)."""
    expected, _ = serial(case["length"], raw.Get_size(), case["step"])
    return expected, 1e-15 + 1e-12 * np.abs(expected)


def diagnose(case: dict, rank: int, size: int, x: np.ndarray, out: np.ndarray,
             expected: np.ndarray) -> str | None:
    """Which of the common parameter-server mistakes ``out`` is, in a sentence."""
    L, step, w = case["length"], case["step"], size - 1
    p0, v0 = serial(L, size, step - 1)
    g = mean_grad(L, step, size)

    def near(a: np.ndarray) -> bool:
        return bool(np.all(np.abs(out - a) <= 1e-15 + 1e-12 * np.abs(a)))

    if rank != SERVER and near(p0):
        return (f"rank {rank} returned the parameters from before the update: the worker pulled "
                "before the server had updated. The server must receive all W gradients, "
                "update, and only then send the new parameters.")
    if step == 2 and near(p0 - LR * g):
        if rank == SERVER:
            return ("step 2 has no momentum in it (p - lr·g): the server's state['v'] was not "
                    "kept. Update it in place (v *= momentum; v += g), do not rebind it.")
        return (f"rank {rank}'s update has no momentum in it (p - lr·g, g the averaged gradient): "
                "the server broadcast the gradient and the worker stepped by itself, but only "
                "the server holds the momentum buffer. Send the updated parameters, not the "
                "gradient.")
    wrong_mean = {"averaged twice (divided by W twice)": g / w,
                  "summed, not averaged (divide the sum by W)": g * w,
                  "divided by N, counting the server as a worker (divide by W = N-1)": g * w / size}
    for what, bad in wrong_mean.items():
        if w > 1 and near(p0 - LR * (MOMENTUM * v0 + bad)):
            return ("The update is the right direction but the wrong size: the gradients "
                    f"were {what}.")
    if np.isnan(out).any():
        return "The result holds NaN: a receive buffer (np.empty_like) was returned unfilled."
    return None


def judge(n: int, cases: list[dict], records: Records) -> list[Check]:
    checks = contract_checks(cases, records, label, "step")
    for c in checks:
        c.name = c.name.replace("MPI's step", "the synchronous step computed serially")
    checks.append(star_check(n, cases, records))
    checks.append(bytes_check(n, cases, records))
    return checks


def star_check(n: int, cases: list[dict], records: Records) -> Check:
    name = "messages only between the server (rank 0) and the workers"
    for i, case in enumerate(cases):
        for r in range(1, n):
            rec = records[r][i]
            peers = {p for p, _ in rec["peers_sent"]} | {p for p, _ in rec["peers_recv"]}
            if peers - {SERVER}:
                other = min(peers - {SERVER})
                return Check(name, False, (
                    f"{label(case)}: worker {r} exchanged messages with rank {other}. In a "
                    "parameter server the workers talk only to the server: a push and a pull."))
    return Check(name, True)


def bytes_check(n: int, cases: list[dict], records: Records) -> Check:
    """The server receives and sends W x S; every worker sends and receives S."""
    name = "bytes: the server receives W x S and sends W x S; each worker S each way"
    w = n - 1
    for i, case in sorted(enumerate(cases), key=lambda ic: -ic[1]["length"]):  # clearest first
        S = case["length"] * 8
        for r in range(n):
            rec = records[r][i]
            want = w * S if r == SERVER else S
            who = "the server" if r == SERVER else f"worker {r}"
            for way, verb in (("sent", "sent"), ("recv", "received")):
                b = rec[f"bytes_{way}"]
                if b != want:
                    return Check(name, False, (
                        f"{label(case)}: {who} {verb} {b} bytes = {b / S:.2f} x S (S = {S}); "
                        f"it should have {verb} {want} = {'W x S' if r == SERVER else 'S'} "
                        f"(W = {w} workers)." + _why(r, way, b, S, w)))
    S = max(c["length"] for c in cases) * 8
    return Check(name, True, f"e.g. the server: {w * S} bytes each way for S = {S}, W = {w}")


def _why(rank: int, way: str, b: int, S: int, w: int) -> str:
    if rank == SERVER and way == "sent" and b == 2 * w * S:
        return " Twice W x S: the server sent both the gradient and the parameters."
    if rank == SERVER and way == "recv" and b == 0:
        return " Nothing reached the server: the workers must push their gradients to rank 0."
    return ""
