"""Wrong ZB-H1: the later stages idle at the start, so they run W's there, before their B's
(a W needs what its B kept: the layer's input and the gradient of its output)."""

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
    early = min(stage, m)  # W's of the first micro-batches, in the warm-up idle time

    def F(i):
        return ([] if first else [RecvAct(i)]) + [Forward(i)] + ([] if last else [SendAct(i)])

    def B(i):
        out = ([] if last else [RecvGrad(i)]) + [BackwardInput(i)]
        out += [] if first else [SendGrad(i)]
        return out + ([BackwardWeight(i)] if i >= early else [])

    out = [BackwardWeight(i) for i in range(early)]
    for i in range(warmup):
        out += F(i)
    for i in range(m - warmup):
        out += F(warmup + i) + B(i)
    for i in range(m - warmup, m):
        out += B(i)
    return out + [OptimizerStep()]


# -- the grader calls this on every rank: leave it as it is -----------------------------------
def run_stage(comm, x, **case):
    from minipar.exercises.zb_h1_schedule.grader import run_stage as grade

    return grade(schedule, comm, x, **case)
