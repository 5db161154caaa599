"""Reference solution: the GPipe schedule of one pipeline stage, as a list of instructions.

EN GPipe schedule · RU расписание GPipe · ZH GPipe 调度

Huang et al. 2018, "GPipe: Efficient Training of Giant Neural Networks using
Pipeline Parallelism", arXiv 1811.06965, §2.2: the mini-batch is cut into m
micro-batches; every stage runs all m forwards, then all m backwards (in
reverse, as autograd would), then updates its weights once (the flush).
On p stages with forward 1, backward 2: bubble (p − 1)/(m + p − 1) of the
step, and every stage holds m micro-batches' activations at the turn.

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
    out: list = []
    for i in range(m):  # all forwards: receive the input, compute, pass the output on
        out += ([] if first else [RecvAct(i)]) + [Forward(i)] + ([] if last else [SendAct(i)])
    for i in reversed(range(m)):  # all backwards, last micro-batch first
        out += ([] if last else [RecvGrad(i)]) + [Backward(i)] + ([] if first else [SendGrad(i)])
    return out + [OptimizerStep()]


# -- the grader calls this on every rank: leave it as it is -----------------------------------
def run_stage(comm, x, **case):
    """Grade ``schedule`` on this rank: checker and simulator, then the MPI executor."""
    from minipar.exercises.gpipe_schedule.grader import run_stage as grade

    return grade(schedule, comm, x, **case)
