"""Wrong DualPipe-V: the first pair of each rank takes the backward of its own forward's
micro-batch (ForwardBackward(Forward(j, c), Backward(j, 1 - c))): the two halves depend on
each other (the backward needs the loss, which needs that forward) and cannot overlap."""

from minipar.exercises.dualpipev_schedule.solution import steps
from minipar.parallel.pipeline.schedule import with_comm
from minipar.parallel.pipeline.stage_loop import Backward, ForwardBackward


def schedule(stage, p, m):
    order = steps(stage, p, m)
    k = next(i for i, x in enumerate(order) if isinstance(x, ForwardBackward))
    f, b = order[k].forward, order[k].backward
    want = Backward(f.mb, b.chunk)  # the same micro-batch's backward, later in the list
    for i in range(k + 1, len(order)):
        x = order[i]
        if x == want:
            order[i] = b
            break
        if isinstance(x, ForwardBackward) and x.backward == want:
            order[i] = ForwardBackward(x.forward, b)
            break
    order[k] = ForwardBackward(f, want)
    return with_comm(order, stage, p, 2, "v")


def run_stage(comm, x, **case):
    from minipar.exercises.dualpipev_schedule.grader import run_stage as grade

    return grade(schedule, comm, x, **case)
