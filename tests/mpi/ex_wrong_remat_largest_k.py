"""Wrong on purpose: the largest segment length k that fits, taken as the least recomputation
(a larger k is not always fewer recomputed forwards: n - last is not monotone in k)."""


def plan(n, budget, peak_bytes):
    for k in range(n, 0, -1):
        if peak_bytes({"every": k}) <= budget:
            return {"every": k}
    return None


def remat_step(comm, x, **case):
    from minipar.exercises.remat_budget.grader import remat_step as grade

    return grade(plan, comm, x, **case)
