"""Wrong GPipe: even stages run the backwards first to last, odd stages last to first."""

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
    for i in range(m):
        out += ([] if first else [RecvAct(i)]) + [Forward(i)] + ([] if last else [SendAct(i)])
    for i in (range(m) if stage % 2 == 0 else reversed(range(m))):
        out += ([] if last else [RecvGrad(i)]) + [Backward(i)] + ([] if first else [SendGrad(i)])
    return out + [OptimizerStep()]


# -- the grader calls this on every rank: leave it as it is -----------------------------------
def run_stage(comm, x, **case):
    from minipar.exercises.gpipe_schedule.grader import run_stage as grade

    return grade(schedule, comm, x, **case)
