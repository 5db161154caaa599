"""Wrong 1F1B: right, but not written: it asks minipar's own schedule for the list."""

from minipar.parallel.pipeline.schedule import stage_schedule as reference


def schedule(stage, p, m):
    return reference("1f1b", stage, p, m)


# -- the grader calls this on every rank: leave it as it is -----------------------------------
def run_stage(comm, x, **case):
    from minipar.exercises.one_f_one_b.grader import run_stage as grade

    return grade(schedule, comm, x, **case)
