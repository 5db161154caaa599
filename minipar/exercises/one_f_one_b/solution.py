"""Reference solution: the 1F1B (PipeDream-Flush) schedule of one pipeline stage.

EN 1F1B schedule · RU расписание 1F1B · ZH 1F1B 调度

Narayanan et al. 2021, "Efficient Large-Scale Language Model Training on GPU
Clusters Using Megatron-LM", arXiv 2104.04473, §2.2.1.  Stage s of p:

1. warm-up: w = min(p − s − 1, m) forwards;
2. steady state: m − w pairs — forward w + i, then backward i;
3. cool-down: the last w backwards; then the optimizer step (the flush).

Stage s holds at most p − s micro-batches at once (GPipe: all m), and the
bubble is GPipe's: (p − 1)/m of the ideal time.  In a steady pair the
gradient i from the next stage is received before activation w + i is sent
to it, the order in which the next stage sends and receives them.

Self-contained on purpose (only the instruction types): this is what the
learner writes.
"""

from __future__ import annotations

from minipar.parallel.pipeline.stage_loop import (
    Backward,
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
    warmup = min(p - stage - 1, m)

    def forward(i: int) -> list:
        return ([] if first else [RecvAct(i)]) + [Forward(i)] + ([] if last else [SendAct(i)])

    def backward(i: int) -> list:
        return ([] if last else [RecvGrad(i)]) + [Backward(i)] + ([] if first else [SendGrad(i)])

    out: list = []
    for i in range(warmup):
        out += forward(i)
    for i in range(m - warmup):  # one forward, one backward
        k = warmup + i
        out += [] if first else [RecvAct(k)]
        out += [Forward(k)]
        out += [] if last else [RecvGrad(i), SendAct(k)]  # receive i before sending k
        out += [Backward(i)] + ([] if first else [SendGrad(i)])
    for i in range(m - warmup, m):
        out += backward(i)
    return out + [OptimizerStep()]


# -- the grader calls this on every rank: leave it as it is -----------------------------------
def run_stage(comm, x, **case):
    """Grade ``schedule`` on this rank: checker and simulator, then the MPI executor."""
    from minipar.exercises.one_f_one_b.grader import run_stage as grade

    return grade(schedule, comm, x, **case)
