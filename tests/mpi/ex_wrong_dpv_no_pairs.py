"""Wrong DualPipe-V: DeepSeek's order, but every overlapped pair run as two instructions
(its forward, then its backward): correct and as fast on the simulator, but nothing
overlaps: the missing pairs are named."""

from minipar.exercises.dualpipev_schedule.solution import steps
from minipar.parallel.pipeline.schedule import with_comm
from minipar.parallel.pipeline.stage_loop import ForwardBackward


def schedule(stage, p, m):
    order = []
    for x in steps(stage, p, m):
        order += [x.forward, x.backward] if isinstance(x, ForwardBackward) else [x]
    return with_comm(order, stage, p, 2, "v")


def run_stage(comm, x, **case):
    from minipar.exercises.dualpipev_schedule.grader import run_stage as grade

    return grade(schedule, comm, x, **case)
