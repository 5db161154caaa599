"""Exercise: activation checkpointing under a memory budget, chosen by you (ends notebook 09).

EN activation checkpointing · RU чекпоинтинг активаций · ZH 激活检查点

Grade it (1 rank is enough: every rank runs the same model; no message is sent, so
comm.Send and its friends are not needed here):

    minipar exercise check remat_budget remat_budget.py -n 1

THE SETTING
    A tiny GPT (float64) walked as n units: the embedding, the blocks, the head.
    Backward needs every unit's activations.  minipar.parallel.remat.Checkpointing
    can keep less, in one of three ways (a PLAN):

    * {"every": n}      keep everything: no recomputation (the most memory);
    * {"every": k}      Chen et al. 2016 (arXiv 1604.06174): segments of k units,
                        keep only each segment's input, recompute the segment's
                        forward in backward -- except the LAST segment, which
                        backward needs first and is kept whole.  Units whose
                        forward runs twice: n - last, last = n - (ceil(n/k) - 1)·k;
    * {"selective": True}  Korthikanti et al. 2022 (arXiv 2205.05198): keep every
                        unit's activations except the attention probabilities,
                        recomputed from q, k, v (no unit's forward runs twice).

THE GOAL
    plan(n, budget, peak_bytes) returns the plan whose MEASURED peak activation
    bytes are <= budget and that recomputes the least: no recomputation is
    best, then selective (one attention core per block, cheap next to a whole
    unit), then segments, ranked by how many unit forwards run twice (fewer is
    better; on a tie, the smaller peak).  peak_bytes(plan) is GIVEN: it walks
    forward and backward once with that plan and returns the ledger's peak
    (ActivationLedger.bytes_peak: the activations held, each buffer once).  Note
    that a larger k is NOT always fewer recomputed forwards.  Return None only
    if no plan fits.

WHAT THE GRADER MEASURES
    For several budgets (between the measured peaks of the plans):
    * the gradients of the model run with YOUR plan, bit for bit equal to the
      serial model's (float64: recomputation runs the very same forward);
    * the ledger's peak bytes of that run: at most the budget;
    * the unit forwards it ran (counted): the fewest any fitting plan runs.
    Stuck?  minipar exercise hint remat_budget   (level 1, 2, 3)
"""

from __future__ import annotations


def plan(n: int, budget: int, peak_bytes) -> dict | None:
    """The plan ({"every": k} or {"selective": True}) that fits ``budget``, recomputing least."""
    # TODO 1: the candidate plans: every = 1 .. n, and selective
    # TODO 2: the unit forwards each one runs twice (0 for every = n and for selective)
    # TODO 3: the ones whose peak_bytes(plan) <= budget; the cheapest of them (ties: less memory)
    raise NotImplementedError("TODO: choose what to keep for the budget")


# -- the grader calls this on every rank: leave it as it is -----------------------------------
def remat_step(comm, x, **case):
    """Run one step of the model with your plan: gradients, measured peak and forwards."""
    from minipar.exercises.remat_budget.grader import remat_step as grade

    return grade(plan, comm, x, **case)
