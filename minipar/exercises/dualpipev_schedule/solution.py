"""Reference solution: DeepSeek-V3's DualPipe-V schedule of one pipeline rank.

EN DualPipe-V schedule · RU расписание DualPipe-V · ZH DualPipe-V 调度

DeepSeek-AI 2024, arXiv 2412.19437, §3.2.1: DualPipe, cut in half on ZB-V's V (DeepSeek's
``dualpipev.py``).  Rank s of p holds two chunks: chunk 0 is virtual stage s on the way
down the V, chunk 1 virtual stage 2p − 1 − s on the way back up, so PP = 2p stages and
rank 0 computes the loss.  The compute order is DeepSeek's eight steps, their lengths set
by the rank's distance from the V's turn (r = s, n = p):

1. nF0       2(n − r − 1) forwards of chunk 0;
2. nF0F1     r + 1 times a forward of chunk 0, then one of chunk 1;
3. nB1W1F1   n − r − 1 times B of chunk 1 (split: B then its W at once), F of chunk 1;
4. nF0B1F1B0 the steady state: pairs F0 & B1, F1 & B0 (the last rank's first F0, B1 run
             apart: its F0's output is what its own B1 needs soonest);
5. nB1F1B0   n − r − 1 times B of chunk 1, then the pair F1 & B0;
6. nB1B0     r + 1 times B1, B0, zero bubble switched on half-way (their W's wait);
7. nWB0      n − r − 1 times a waiting W, then B0 split;
8. nW        the W's still waiting.

A pair (``ForwardBackward``) is a forward of one micro-batch and the whole backward of
an older one, of the other chunk: one's messages travel while the other computes.
Self-contained on purpose (only the instruction types and with_comm, given): this is what
the learner writes.
"""

from __future__ import annotations

from minipar.parallel.pipeline.schedule import with_comm
from minipar.parallel.pipeline.stage_loop import (
    Backward,
    BackwardInput,
    BackwardWeight,
    Forward,
    ForwardBackward,
)


def schedule(stage: int, p: int, m: int) -> list:
    """The instructions rank ``stage`` of ``p`` runs for one step of ``m`` >= 2p micro-batches."""
    return with_comm(steps(stage, p, m), stage, p, 2, "v")  # each receive before, send after


def steps(stage: int, p: int, m: int) -> list:
    """The compute order of rank ``stage``: DeepSeek's eight steps."""
    n, r = p, stage
    order: list = []
    nf, nb = [0, 0], [0, 0]            # next forward / backward, per chunk
    waiting: list = []                 # W's of the B's run split, first in first out

    def F(c: int) -> Forward:
        nf[c] += 1
        return Forward(nf[c] - 1, c)

    def B(c: int, split: bool = False) -> Backward | BackwardInput:
        nb[c] += 1
        if split:
            waiting.append(BackwardWeight(nb[c] - 1, c))
            return BackwardInput(nb[c] - 1, c)
        return Backward(nb[c] - 1, c)

    order += [F(0) for _ in range(2 * (n - r - 1))]                    # 1 nF0
    for _ in range(r + 1):                                              # 2 nF0F1
        order += [F(0), F(1)]
    for _ in range(n - r - 1):                                          # 3 nB1W1F1
        order += [B(1, split=True), waiting.pop(0), F(1)]
    for i in range(m - 2 * n + r + 1):                                  # 4 nF0B1F1B0
        order += [F(0), B(1)] if i == 0 and r == n - 1 else [ForwardBackward(F(0), B(1))]
        order.append(ForwardBackward(F(1), B(0)))
    for _ in range(n - r - 1):                                          # 5 nB1F1B0
        order += [B(1), ForwardBackward(F(1), B(0))]
    split = False
    for i in range(r + 1):                                              # 6 nB1B0
        split = split or (i == (r + 1) // 2 and r % 2 == 1)
        order.append(B(1, split))
        split = split or (i == (r + 1) // 2 and r % 2 == 0)
        order.append(B(0, split))
    for _ in range(n - r - 1):                                          # 7 nWB0
        order += [waiting.pop(0), B(0, split=True)]
    return order + waiting                                              # 8 nW


# -- the grader calls this on every rank: leave it as it is -----------------------------------
def run_stage(comm, x, **case):
    """Grade ``schedule`` on this rank: checker and simulator, then the MPI executor."""
    from minipar.exercises.dualpipev_schedule.grader import run_stage as grade

    return grade(schedule, comm, x, **case)
