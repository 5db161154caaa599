"""Wrong ZB-H1: 1F1B's forwards and B's, each gradient sent at once, but the W's held back
until the last F, then one after each cool-down B and the rest at the end (the shape of
minipar's zb-h1 before it took the paper's): Table 2's bubble, but the last stage keeps
every micro-batch's inputs and output gradients for W, up to m from F to W where ZB-H1
(and 1F1B) holds p."""

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

    def b(i):
        return ([] if last else [RecvGrad(i)]) + [BackwardInput(i)] + \
            ([] if first else [SendGrad(i)])

    out, waiting = [], []
    for i in range(warmup):
        out += forward(i)
    for i in range(m - warmup):
        out += forward(warmup + i) + b(i)
        waiting.append(i)
    out += [BackwardWeight(waiting.pop(0))] if waiting else []  # the last F has run
    for i in range(m - warmup, m):
        out += b(i)
        waiting.append(i)
        out += [BackwardWeight(waiting.pop(0))]
    out += [BackwardWeight(i) for i in waiting]
    return out + [OptimizerStep()]


# -- the grader calls this on every rank: leave it as it is -----------------------------------
def run_stage(comm, x, **case):
    from minipar.exercises.zb_h1_schedule.grader import run_stage as grade

    return grade(schedule, comm, x, **case)
