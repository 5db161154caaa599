"""Wrong ZB-H1: the warm-up counted from the wrong end (stage s runs s warm-up forwards, not
p - s - 1): stage 0 waits for a gradient while stage 1 waits for an activation: a deadlock."""

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
    warmup = min(stage, m)  # wrong end: the last stage warms up longest

    def F(i):
        return ([] if first else [RecvAct(i)]) + [Forward(i)] + ([] if last else [SendAct(i)])

    def B(i):
        return ([] if last else [RecvGrad(i)]) + [BackwardInput(i)] + \
            ([] if first else [SendGrad(i)])

    def W(i):
        return [BackwardWeight(i)] if i >= 0 else []

    out = []
    for i in range(warmup):
        out += F(i)
    for i in range(m - warmup):
        out += F(warmup + i) + B(i) + W(i - stage)
    for i in range(m - warmup, m):
        out += B(i) + W(i - stage)
    for i in range(m - stage, m):
        out += W(i)
    return out + [OptimizerStep()]


# -- the grader calls this on every rank: leave it as it is -----------------------------------
def run_stage(comm, x, **case):
    from minipar.exercises.zb_h1_schedule.grader import run_stage as grade

    return grade(schedule, comm, x, **case)
