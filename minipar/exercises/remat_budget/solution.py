"""Reference solution of remat_budget: rank every plan by its recomputation, keep the best that fits."""

from __future__ import annotations

import math


def recomputed(n: int, p: dict) -> int:
    """Unit forwards a plan runs twice: Chen et al.'s n - last (0 for selective and every = n)."""
    if p.get("selective"):
        return 0
    k = p["every"]
    return n - (n - (math.ceil(n / k) - 1) * k)


def cost(n: int, p: dict) -> float:
    """The recomputation a plan costs, in unit forwards: selective's attention cores count less
    than one whole unit (0.5), no remat nothing."""
    return 0.5 if p.get("selective") else recomputed(n, p)


def plan(n: int, budget: int, peak_bytes) -> dict | None:
    plans = [{"every": k} for k in range(1, n + 1)] + [{"selective": True}]
    fits = [(p, b) for p in plans if (b := peak_bytes(p)) <= budget]
    if not fits:
        return None
    return min(fits, key=lambda pb: (cost(n, pb[0]), pb[1]))[0]


def remat_step(comm, x, **case):
    from minipar.exercises.remat_budget.grader import remat_step as grade

    return grade(plan, comm, x, **case)
