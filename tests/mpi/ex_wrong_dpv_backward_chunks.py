"""Wrong DualPipe-V: the chunks of every backward swapped (chunk 0 taken for the V's way
back): each rank's backwards wait for gradients the V has not produced yet."""

from minipar.exercises.dualpipev_schedule.solution import steps
from minipar.parallel.pipeline.schedule import with_comm
from minipar.parallel.pipeline.stage_loop import Backward, BackwardInput, BackwardWeight
from minipar.parallel.pipeline.stage_loop import ForwardBackward


def swap(x):
    if isinstance(x, ForwardBackward):
        return ForwardBackward(x.forward, swap(x.backward))
    if isinstance(x, (Backward, BackwardInput, BackwardWeight)):
        return type(x)(x.mb, 1 - x.chunk)
    return x


def schedule(stage, p, m):
    return with_comm([swap(x) for x in steps(stage, p, m)], stage, p, 2, "v")


def run_stage(comm, x, **case):
    from minipar.exercises.dualpipev_schedule.grader import run_stage as grade

    return grade(schedule, comm, x, **case)
