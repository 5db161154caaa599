"""Wrong DualPipe-V: no warm-up of chunk 0 (step 1, nF0, left out: its forwards run after
step 2): the ranks wait for each other in a cycle."""

from minipar.exercises.dualpipev_schedule.solution import steps
from minipar.parallel.pipeline.schedule import with_comm


def schedule(stage, p, m):
    order = steps(stage, p, m)
    k = 2 * (p - stage - 1)  # step 1's forwards, moved behind step 2 (2(r + 1) forwards)
    order = order[k:k + 2 * (stage + 1)] + order[:k] + order[k + 2 * (stage + 1):]
    return with_comm(order, stage, p, 2, "v")


def run_stage(comm, x, **case):
    from minipar.exercises.dualpipev_schedule.grader import run_stage as grade

    return grade(schedule, comm, x, **case)
