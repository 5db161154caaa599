"""Wrong GPipe: every stage but the last waits for a gradient before sending any activation."""

from minipar.parallel.pipeline.stage_loop import (
    Backward,
    Forward,
    OptimizerStep,
    RecvAct,
    RecvGrad,
    SendAct,
    SendGrad,
)


def schedule(stage, p, m):
    first, last = stage == 0, stage == p - 1
    out = []
    if not last:
        out += [RecvGrad(m - 1)]  # too early: stage + 1 has not seen a single activation yet
    for i in range(m):
        out += ([] if first else [RecvAct(i)]) + [Forward(i)] + ([] if last else [SendAct(i)])
    for i in reversed(range(m)):
        out += ([] if last or i == m - 1 else [RecvGrad(i)]) + [Backward(i)]
        out += [] if first else [SendGrad(i)]
    return out + [OptimizerStep()]


# -- the grader calls this on every rank: leave it as it is -----------------------------------
def run_stage(comm, x, **case):
    from minipar.exercises.gpipe_schedule.grader import run_stage as grade

    return grade(schedule, comm, x, **case)
