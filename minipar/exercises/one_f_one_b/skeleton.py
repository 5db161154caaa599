"""Exercise: the 1F1B (one forward, one backward) schedule of one pipeline stage, written by you.

EN 1F1B (PipeDream-Flush) · RU 1F1B (один прямой, один обратный) · ZH 1F1B（一次前向一次反向）

Grade it (4 ranks: 4 stages):

    minipar exercise check one_f_one_b one_f_one_b.py -n 4

THE GOAL
    GPipe (the gpipe_schedule exercise) runs all m forwards before any
    backward, so every stage keeps m micro-batches' activations.  1F1B
    (PipeDream-Flush; Narayanan et al. 2021, arXiv 2104.04473, §2.2.1)
    starts each micro-batch's backward as early as possible, so stage s of p
    never keeps more than p - s:

    1. WARM-UP: stage s runs w = min(p - s - 1, m) forwards (the last stage
       none: it can start micro-batch 0's backward right after its forward);
    2. STEADY STATE: m - w times, one forward (the next micro-batch) and one
       backward (the oldest one still held);
    3. COOL-DOWN: the w backwards left; then OptimizerStep().

    Same bubble as GPipe — (p - 1)/m of the ideal time, i.e. (p - 1)/(m + p - 1)
    of the step — for p activations held instead of m.  Write

        schedule(stage, p, m) -> list of instructions

THE INSTRUCTIONS (from minipar.parallel.pipeline.stage_loop; i is the micro-batch)
    RecvAct(i), Forward(i), SendAct(i)      a forward: receive the input (not on stage
                                            0), compute, send the output (not on the last)
    RecvGrad(i), Backward(i), SendGrad(i)   a backward: receive the output's gradient (not
                                            on the last stage), compute, send the input's
                                            gradient (not on stage 0)
    OptimizerStep()                         once, last
    The executor turns each send into a non-blocking comm.Isend (a blocking
    comm.Send could wait for its receiver) and each receive into a wait for
    its message: a receive before the compute that needs it, a send after
    the compute that produced it.

WHAT THE GRADER MEASURES
    * Correct for p = 1..4 stages, m = 1..8 (m < p too: the warm-up is cut
      short): every forward and backward once, every message matched, no
      deadlock (replayed; a stuck replay names the stages waiting).
    * 1F1B's memory rule: at most p - s micro-batches in flight on stage s.
    * The bubble: replayed with forward 1, backward 2, exactly (p - 1)/m of
      the ideal time (too few warm-up forwards leave the pipeline emptier).
      What it should look like: minipar bubble --schedule 1f1b --stages 4
      --micro-batches 8
    * Real ranks: each rank runs ITS stage's list through minipar's MPI
      pipeline executor (two training steps of a small GPT); the weights
      must equal the serial run's.

    Stuck?  minipar exercise hint one_f_one_b   (level 1, 2, 3)
"""

# ruff: noqa: F401, F841  (the names imported below are yours to use)
from __future__ import annotations

from minipar.parallel.pipeline.stage_loop import (
    Backward,
    Forward,
    OptimizerStep,
    RecvAct,
    RecvGrad,
    SendAct,
    SendGrad,
)


def schedule(stage: int, p: int, m: int) -> list:
    """The instructions stage ``stage`` (0 .. p-1) runs for one step of ``m`` micro-batches."""
    first, last = stage == 0, stage == p - 1
    warmup = min(p - stage - 1, m)
    out: list = []

    # TODO 1: the warm-up forwards, micro-batches 0 .. warmup-1

    # TODO 2: the steady state: m - warmup times, forward warmup + i, then backward i

    # TODO 3: the cool-down backwards, then OptimizerStep(); return the list

    raise NotImplementedError("TODO: warm-up, one forward one backward, cool-down")


# -- the grader calls this on every rank: leave it as it is -----------------------------------
def run_stage(comm, x, **case):
    """Grade ``schedule`` on this rank: checker and simulator, then the MPI executor."""
    from minipar.exercises.one_f_one_b.grader import run_stage as grade

    return grade(schedule, comm, x, **case)
