"""Wrong DualPipe-V: DeepSeek's order with every backward whole (no B/W split): correct,
but the W's no longer fill the gaps of steps 3 and 6-8: the bubble is named."""

from minipar.exercises.dualpipev_schedule.solution import steps
from minipar.parallel.pipeline.schedule import with_comm
from minipar.parallel.pipeline.stage_loop import Backward, BackwardInput, BackwardWeight


def schedule(stage, p, m):
    order = [Backward(x.mb, x.chunk) if isinstance(x, BackwardInput) else x
             for x in steps(stage, p, m) if not isinstance(x, BackwardWeight)]
    return with_comm(order, stage, p, 2, "v")


def run_stage(comm, x, **case):
    from minipar.exercises.dualpipev_schedule.grader import run_stage as grade

    return grade(schedule, comm, x, **case)
