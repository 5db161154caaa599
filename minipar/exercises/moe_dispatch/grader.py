"""Grader of the MoE dispatch/combine exercise: MPI's Alltoall oracle, named mistakes, bytes.

EN expert-parallel dispatch grader · RU проверка рассылки к экспертам · ZH 专家分发评分

Each rank holds its dispatch buffers x (E, C, d), float64: rows of tokens routed
to each expert (GShard, Lepikhin et al. 2020, arXiv 2006.16668; Switch, Fedus
et al. 2021, arXiv 2101.03961).  Rank r holds experts r·E/N … (r+1)·E/N − 1.
The learner's function must return out with out[e] = Expert_e(x[e]) for this
rank's own tokens, although this rank can run only its own experts: the
``expert(e, tokens)`` callable handed to it refuses any other expert.

Experts are integer matrices (tokens @ W_e, no bias: zero padding rows stay
zero) and tokens are small integers, so every sum is exact in any order and
the result must equal the oracle bit for bit.  The oracle is MPI's own
Alltoall (dispatch), the experts, and MPI's Alltoall again (combine); it is
checked on the spot against the serial block (every expert applied to its
buffer on one process).  Buffers come from random integers, and from the
serial MoE block's own router (``minipar.nn.moe_steps.dispatch_forward``,
top-1, capacity factor 1.25: zero rows where an expert got fewer than C tokens).

Formula checked: per direction rank r sends (N-1)/N of its buffer,
S = E·C·d·8 bytes, E/N·C·d·8 bytes to each other rank, nothing to itself:

    bytes sent per rank = 2 (N-1)/N x S     (dispatch + combine), exactly
    bytes sent to each peer = 2 S / N

A wrong result is named (:func:`diagnose`) by recomputing the usual mistakes
from every rank's input (each input is a function of the case and the rank):
the strided expert-to-rank mapping (expert e on rank e % N), the combine's
blocks sent back to the wrong ranks or not at all, experts never run.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
from mpi4py import MPI

from minipar.exercises.grading import Check
from minipar.exercises.judging import Records, contract_checks
from minipar.nn.moe_steps import dispatch_forward, expert_capacity

SEED = 2006_16668  # GShard's arXiv number
FIRST_STEP = (
    "the dispatch: rank s gets x[s*E/N:(s+1)*E/N], the rows for its experts; exchange these "
    "blocks with every other rank (N-1 comm.Sendrecv steps, peer (r + step) % N)."
)
ROUTED_TOKENS = 12  #: tokens routed by the serial MoE block on each rank, times N
CAPACITY_FACTOR = 1.25  #: of the routed case (Switch's default): some tokens are dropped


# -- cases and inputs ----------------------------------------------------------------
def cases(n: int) -> list[dict]:
    found = [{"E": e, "C": c, "d": 4, "values": "random"}
             for e in sorted({n, 2 * n}) for c in (1, 3)]
    found.append({"E": 2 * n, "C": 0, "d": 4, "values": "routed"})
    found.append({"E": 2 * n, "C": 64, "d": 128, "values": "random"})  # > MPI's eager limit
    for case in found:
        if case["values"] == "routed":  # C as the serial block defines it
            case["C"] = expert_capacity(ROUTED_TOKENS * n, case["E"], CAPACITY_FACTOR)
    return found


def label(case: dict) -> str:
    how = "random integer tokens"
    if case["values"] == "routed":
        how = f"routed by the serial MoE block, top-1, capacity factor {CAPACITY_FACTOR}"
    return f"E {case['E']}, C {case['C']}, d {case['d']} ({how})"


def weights(e: int, d: int) -> np.ndarray:
    """Expert e: a (d, d) matrix of integers in [-2, 2] (exact products and sums)."""
    return np.random.default_rng([SEED, 7, e, d]).integers(-2, 3, (d, d)).astype(np.float64)


def buffers(case: dict, rank: int, size: int) -> np.ndarray:
    """Rank ``rank``'s dispatch buffers (E, C, d): a function of the case and the rank."""
    E, C, d = case["E"], case["C"], case["d"]
    rng = np.random.default_rng([SEED, E, C, d, rank])
    if case["values"] == "random":
        return rng.integers(-4, 5, (E, C, d)).astype(np.float64)
    h = rng.integers(-4, 5, (ROUTED_TOKENS * size, d)).astype(np.float64)
    router = np.random.default_rng([SEED, E, d]).standard_normal((d, E))
    x, _ = dispatch_forward(router, h, E, top_k=1, capacity_factor=CAPACITY_FACTOR)
    return x


class Experts:
    """This rank's experts: ``expert(e, tokens)`` = tokens @ W_e for e it holds, else an error."""

    def __init__(self, rank: int, size: int, E: int, d: int):
        k = E // size
        self.rank, self.mine = rank, range(rank * k, (rank + 1) * k)
        self.w = {e: weights(e, d) for e in self.mine}
        self.d = d

    def __call__(self, e: int, tokens: np.ndarray) -> np.ndarray:
        if e not in self.w:
            m = self.mine
            raise ValueError(
                f"rank {self.rank} was asked to run expert {e}, but it holds only experts "
                f"{m.start}..{m.stop - 1}: rank r holds experts r*E/N .. (r+1)*E/N - 1, so "
                f"expert {e} lives on rank {e // len(m)}. Send its tokens there (the dispatch).")
        t = np.asarray(tokens)
        if t.ndim != 2 or t.shape[1] != self.d:
            raise ValueError(f"expert({e}, tokens): tokens must be a (rows, d = {self.d}) "
                             f"array, got shape {t.shape}")
        return t @ self.w[e]


def make_input(case: dict, rank: int, size: int) -> tuple[np.ndarray, dict]:
    """x = this rank's dispatch buffers; ``expert`` runs the experts this rank holds."""
    return buffers(case, rank, size), {"expert": Experts(rank, size, case["E"], case["d"])}


def serial(case: dict, x: np.ndarray) -> np.ndarray:
    """The serial block on one process: out[e] = Expert_e(x[e]) for every expert."""
    return np.stack([x[e] @ weights(e, case["d"]) for e in range(case["E"])])


def oracle(raw: MPI.Comm, case: dict, x: np.ndarray) -> tuple[np.ndarray, None]:
    """MPI's Alltoall (dispatch), the experts, MPI's Alltoall back (combine): exact."""
    n, r = raw.Get_size(), raw.Get_rank()
    E, C, d = x.shape
    k = E // n
    got = np.empty_like(x)  # got[s*k + i] = rank s's rows for my expert r*k + i
    raw.Alltoall(np.ascontiguousarray(x), got)
    done = np.empty_like(got)
    for i in range(k):
        rows = got.reshape(n, k, C, d)[:, i].reshape(-1, d)
        done.reshape(n, k, C, d)[:, i] = (rows @ weights(r * k + i, d)).reshape(n, C, d)
    out = np.empty_like(x)
    raw.Alltoall(done, out)
    assert np.array_equal(out, serial(case, x)), "oracle disagrees with the serial block"
    return out, None


# -- naming a wrong result ---------------------------------------------------------------
def _outcomes(case: dict, size: int) -> dict[str, Callable[[int], np.ndarray]]:
    """What rank r would return under each usual mistake (recomputed from every input)."""
    E, d = case["E"], case["d"]
    k = E // size
    xs = [buffers(case, q, size) for q in range(size)]
    w = [weights(e, d) for e in range(E)]
    strided = [(e % size) * k + e // size for e in range(E)]  # who ran e's rows, e on rank e % N

    def processed(q: int, s: int) -> np.ndarray:  # rank q's experts on rank s's rows for them
        return np.stack([xs[s][q * k + i] @ w[q * k + i] for i in range(k)])

    return {
        "mapping": lambda r: np.stack([xs[r][e] @ w[strided[e]] for e in range(E)]),
        "no combine": lambda r: np.concatenate([processed(r, s) for s in range(size)]),
        "no experts": lambda r: xs[r].copy(),
    }


def diagnose(case: dict, rank: int, size: int, x: np.ndarray, out: np.ndarray,
             expected: np.ndarray) -> str | None:
    """The mistake behind a wrong ``out`` on ``rank``, in a sentence (None: no pattern fits)."""
    E, C = case["E"], case["C"]
    k = E // size
    if out.shape != expected.shape or not C:
        return None
    said = _outcomes(case, size)
    if np.array_equal(out, said["no experts"](rank)):
        return ("The result is your own input: the tokens went out and came back, but no expert "
                "ran on them. Between the two all-to-alls call expert(e, tokens) for each expert "
                "e this rank holds, on the rows every rank sent it.")
    if size > 1 and k > 1 and np.array_equal(out, said["mapping"](rank)):
        return (f"Wrong expert-to-rank mapping: expert e's rows went to rank e % N (strided), "
                f"but rank r holds experts r*E/N .. (r+1)*E/N - 1 (blocked; here E/N = {k}): "
                f"send rank s the block x[s*E/N:(s+1)*E/N].")
    if size > 1 and np.array_equal(out, said["no combine"](rank)):
        return ("The combine all-to-all is missing: you returned what YOUR experts computed for "
                "every rank's tokens. Send each rank back the block you computed for its tokens "
                "and put the block that comes from rank s at out[s*E/N:(s+1)*E/N].")
    blocks = _whose_tokens(case, size, rank, out)
    if size > 1 and blocks and all(s is not None for s in blocks.values()):
        wrong = {b: s for b, s in blocks.items() if s != rank}
        b, s = next(iter(wrong.items()), (None, None))
        if b is not None:
            return (f"Forgot the reverse permutation: the outputs of rank {b}'s experts that "
                    f"rank {rank} got back are those of rank {s}'s tokens. The combine must send "
                    "each block back to the rank it came from: the block received from rank s "
                    "in the dispatch returns to rank s, into out[r*E/N:(r+1)*E/N] there.")
    return None


def _whose_tokens(case: dict, size: int, rank: int, out: np.ndarray) -> dict[int, int | None]:
    """For each block b (the experts of rank b): the rank whose tokens it holds, or None."""
    E, d = case["E"], case["d"]
    k = E // size
    xs = [buffers(case, q, size) for q in range(size)]
    found: dict[int, int | None] = {}
    for b in range(size):
        es = range(b * k, (b + 1) * k)
        want = {s: np.stack([xs[s][e] @ weights(e, d) for e in es]) for s in range(size)}
        found[b] = next((s for s, v in want.items() if np.array_equal(out[b * k:(b + 1) * k], v)),
                        None)
    return found


# -- judging -----------------------------------------------------------------------------
def judge(n: int, cases: list[dict], records: Records) -> list[Check]:
    sized = [{**c, "length": c["E"] * c["C"] * c["d"]} for c in cases]
    checks = contract_checks(sized, records, label, "Alltoall")
    for c in checks:
        if c.name.startswith("result equals"):
            c.name = (f"result equals MPI's Alltoall -> experts -> Alltoall, and the serial "
                      f"block ({len(cases)} cases: E = N and 2N, C = 1 and 3, routed, large)")
    checks.append(bytes_check(n, cases, records))
    return checks


def bytes_check(n: int, cases: list[dict], records: Records) -> Check:
    """Exactly (N-1)/N of the buffer per direction: E/N·C·d·8 bytes to each other rank, twice."""
    name = "bytes per rank = 2(N-1)/N x S: each other rank gets its E/N experts' rows, both ways"
    for i, case in sorted(enumerate(cases), key=lambda ic: -ic[1]["C"] * ic[1]["d"]):
        S = case["E"] * case["C"] * case["d"] * 8
        block = S // n
        for r in range(n):
            rec = records[r][i]
            sent, to = rec["bytes_sent"], dict(rec["peers_sent"])
            if to.get(r):
                return Check(name, False, (
                    f"{label(case)}: rank {r} sent {to[r]} bytes to itself. The block for its "
                    "own experts stays on the rank: copy x[r*E/N:(r+1)*E/N] (and its outputs) "
                    "locally; only the N-1 other blocks travel."))
            if sent == 2 * (n - 1) * S // n and all(to.get(q) == 2 * block
                                                    for q in range(n) if q != r):
                continue
            ratio = sent / S if S else 0.0
            why = ""
            if n > 1 and sent >= (n - 1) * S:
                why = (f" That is about (N-1) x S = {(n - 1) * S} per direction: the whole "
                       "buffer to every rank. Rank s needs only x[s*E/N:(s+1)*E/N], the rows "
                       "for its experts (and, on the way back, only its own tokens' outputs).")
            elif n > 1 and sent == (n - 1) * S // n:
                why = (" That is one direction only: the outputs must travel back too (the "
                       "combine, the reverse all-to-all).")
            per = ", ".join(f"{b} to rank {q}" for q, b in sorted(to.items()))
            return Check(name, False, (
                f"{label(case)}: rank {r} sent {sent} bytes = {ratio:.2f} x S (S = {S}: "
                f"{per or 'nothing'}); expected 2(N-1)/N x S = {2 * (n - 1) * S // n}, "
                f"{2 * block} to each other rank." + why))
    big = max(cases, key=lambda c: c["C"] * c["d"])
    S = big["E"] * big["C"] * big["d"] * 8
    return Check(name, True, f"e.g. {2 * (n - 1) * S // n} bytes per rank for S = {S}")
