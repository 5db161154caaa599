"""Wrong 1F1B: p - s warm-up forwards instead of p - s - 1: one micro-batch too many held."""

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
    warmup = min(p - stage, m)

    def forward(i):
        return ([] if first else [RecvAct(i)]) + [Forward(i)] + ([] if last else [SendAct(i)])

    def backward(i):
        return ([] if last else [RecvGrad(i)]) + [Backward(i)] + ([] if first else [SendGrad(i)])

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
    from minipar.exercises.one_f_one_b.grader import run_stage as grade

    return grade(schedule, comm, x, **case)
