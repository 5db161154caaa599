"""Wrong DualPipe-V: in step 3 (nB1W1F1) each W runs before its own B."""

from minipar.exercises.dualpipev_schedule.solution import steps
from minipar.parallel.pipeline.schedule import with_comm
from minipar.parallel.pipeline.stage_loop import BackwardInput, BackwardWeight


def schedule(stage, p, m):
    order = steps(stage, p, m)
    for i in range(len(order) - 1):
        a, b = order[i], order[i + 1]
        if isinstance(a, BackwardInput) and b == BackwardWeight(a.mb, a.chunk):
            order[i], order[i + 1] = b, a
    return with_comm(order, stage, p, 2, "v")


def run_stage(comm, x, **case):
    from minipar.exercises.dualpipev_schedule.grader import run_stage as grade

    return grade(schedule, comm, x, **case)
