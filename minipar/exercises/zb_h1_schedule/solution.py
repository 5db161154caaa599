"""Reference solution: the ZB-H1 zero-bubble schedule of one pipeline stage.

EN ZB-H1 schedule · RU расписание ZB-H1 · ZH ZB-H1 调度

Qi et al. 2023, "Zero Bubble Pipeline Parallelism", arXiv 2401.10241, §3.1.  The
backward is split in two: **B**, the gradient of the stage's input (the previous
stage waits for it), and **W**, the gradient of its weights (only the optimizer
step needs it).  ZB-H1 follows 1F1B and starts each stage's W's late, by as many
micro-batches as the stage has fewer warm-up forwards than stage 0, so that every
stage holds the same number in flight.  Stage s of p runs

1. 1F1B's warm-up: w = min(p − s − 1, m) forwards;
2. the steady state: m − w times F(w + i), then B(i) — sent on at once —, then
   the W of micro-batch i − s (stage s lets s W's wait);
3. the cool-down: the last B's, each with its late W; the s W's still waiting
   fill the tail, where 1F1B's stage idles; then the optimizer step.

Every stage holds p micro-batches from F to W (p − s between F and B, s
between B and W), 1F1B's peak; the bubble falls from 1F1B's
(p − 1)(T_F + T_B + T_W) to (p − 1)(T_F + T_B − T_W), a third with equal
costs (m ≥ p): the B's return sooner, the W's fill the cool-down.

Self-contained on purpose (only the instruction types): this is what the
learner writes.
"""

from __future__ import annotations

from minipar.parallel.pipeline.stage_loop import (
    BackwardInput,
    BackwardWeight,
    Forward,
    OptimizerStep,
    RecvAct,
    RecvGrad,
    SendAct,
    SendGrad,
)


def schedule(stage: int, p: int, m: int) -> list:
    """The instructions stage ``stage`` of ``p`` runs for one step of ``m`` micro-batches."""
    first, last = stage == 0, stage == p - 1
    warmup = min(p - stage - 1, m)  # as in 1F1B

    def F(i: int) -> list:  # forward: receive the input, compute, pass the output on
        return ([] if first else [RecvAct(i)]) + [Forward(i)] + ([] if last else [SendAct(i)])

    def B(i: int) -> list:  # input gradient: the previous stage waits for it, send it at once
        return ([] if last else [RecvGrad(i)]) + [BackwardInput(i)] + \
            ([] if first else [SendGrad(i)])

    def W(i: int) -> list:  # weight gradient: nobody waits for it (none yet while i < 0)
        return [BackwardWeight(i)] if i >= 0 else []

    out: list = []
    for i in range(warmup):                 # warm-up
        out += F(i)
    for i in range(m - warmup):             # steady state: one F, one B, a W s B's late
        out += F(warmup + i) + B(i) + W(i - stage)
    for i in range(m - warmup, m):          # cool-down: the last B's, with their late W's
        out += B(i) + W(i - stage)
    for i in range(m - stage, m):           # the W's still waiting fill the tail
        out += W(i)
    return out + [OptimizerStep()]


# -- the grader calls this on every rank: leave it as it is -----------------------------------
def run_stage(comm, x, **case):
    """Grade ``schedule`` on this rank: checker and simulator, then the MPI executor."""
    from minipar.exercises.zb_h1_schedule.grader import run_stage as grade

    return grade(schedule, comm, x, **case)
