"""Wrong ZB-H1: just 1F1B with each backward split in place, W right after its B (and the
gradient sent after both): a correct schedule with 1F1B's bubble, (p - 1)(F + B + W)."""

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


def schedule(stage, p, m):
    first, last = stage == 0, stage == p - 1
    warmup = min(p - stage - 1, m)

    def forward(i):
        return ([] if first else [RecvAct(i)]) + [Forward(i)] + ([] if last else [SendAct(i)])

    def backward(i):
        return ([] if last else [RecvGrad(i)]) + [BackwardInput(i), BackwardWeight(i)] + \
            ([] if first else [SendGrad(i)])

    out = []
    for i in range(warmup):
        out += forward(i)
    for i in range(m - warmup):
        out += forward(warmup + i) + backward(i)
    for i in range(m - warmup, m):
        out += backward(i)
    return out + [OptimizerStep()]


# -- the grader calls this on every rank: leave it as it is -----------------------------------
def run_stage(comm, x, **case):
    from minipar.exercises.zb_h1_schedule.grader import run_stage as grade

    return grade(schedule, comm, x, **case)
