"""Wrong 1F1B: in the steady state the backward runs before its gradient is received."""

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
    warmup = min(p - stage - 1, m)

    def forward(i):
        return ([] if first else [RecvAct(i)]) + [Forward(i)] + ([] if last else [SendAct(i)])

    def backward(i):
        return ([] if last else [RecvGrad(i)]) + [Backward(i)] + ([] if first else [SendGrad(i)])

    out = []
    for i in range(warmup):
        out += forward(i)
    for i in range(m - warmup):
        out += forward(warmup + i) + [Backward(i)] + ([] if last else [RecvGrad(i)])
        out += [] if first else [SendGrad(i)]
    for i in range(m - warmup, m):
        out += backward(i)
    return out + [OptimizerStep()]


# -- the grader calls this on every rank: leave it as it is -----------------------------------
def run_stage(comm, x, **case):
    from minipar.exercises.one_f_one_b.grader import run_stage as grade

    return grade(schedule, comm, x, **case)
