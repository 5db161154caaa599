"""Exercise: the zero-bubble ZB-H1 schedule of one pipeline stage, written by you.

EN ZB-H1 (zero bubble) · RU ZB-H1 (нулевой пузырь) · ZH ZB-H1（零气泡）

Grade it (4 ranks: 4 stages):

    minipar exercise check zb_h1_schedule zb_h1_schedule.py -n 4

THE GOAL
    1F1B (the one_f_one_b exercise) runs each backward whole.  But a layer
    y = x W has two gradients, and only one of them is waited for (Qi et al.
    2023, "Zero Bubble Pipeline Parallelism", arXiv 2401.10241):

      B  the gradient of the stage's INPUT, dx = dy Wᵀ: the previous stage
         waits for it to start its own backward;
      W  the gradient of the stage's WEIGHTS, dW = xᵀ dy: only the optimizer
         step needs it.

    So B can go first and W later, anywhere after its own B.  ZB-H1 keeps
    1F1B's forwards and memory (at most p - s micro-batches between F and B
    on stage s) and puts the W's where 1F1B's stages idle.  With equal costs
    T_F = T_B = T_W the bubble falls from 1F1B's (p - 1)(T_F + T_B + T_W) to
    (p - 1)(T_F + T_B - T_W): a third.  Write

        schedule(stage, p, m) -> list of instructions

THE INSTRUCTIONS (from minipar.parallel.pipeline.stage_loop; i is the micro-batch)
    RecvAct(i), Forward(i), SendAct(i)       F: receive the input (not on stage 0),
                                             compute, send the output (not on the last)
    RecvGrad(i), BackwardInput(i), SendGrad(i)
                                             B: receive the output's gradient (not on
                                             the last stage), compute the input's
                                             gradient, send it (not on stage 0)
    BackwardWeight(i)                        W: the weights' gradient, from what B
                                             kept (x and dy); no message
    OptimizerStep()                          once, last
    The executor turns each send into a non-blocking comm.Isend (a blocking
    comm.Send could wait for its receiver) and each receive into a wait for
    its message: a receive before the compute that needs it, a send after
    the compute that produced it.

WHAT THE GRADER MEASURES
    * Correct for p = 1..4 stages, m = 1..8 (m < p too): every F, B and W
      once, each W after its own B, every message matched, no deadlock
      (replayed; a stuck replay names the stages waiting for each other).
    * 1F1B's memory: at most p - s micro-batches between F and B on stage s.
    * The bubble, measured as the paper does: replayed with T_F = T_B = T_W
      = 1, iteration time = the longest stage's span (first instruction to
      last), bubble = that - m(T_F + T_B + T_W): at most
      (p - 1)(T_F + T_B - T_W) for m >= p; below m = p, at most what
      minipar's own zb-h1 reaches.  What it should look like:
      minipar bubble --schedule zb-h1 --stages 4 --micro-batches 8
    * Real ranks: each rank runs ITS stage's list through minipar's MPI
      pipeline executor (two training steps of a small GPT, B and W as two
      instructions); the weights must equal the serial run's.

    Stuck?  minipar exercise hint zb_h1_schedule   (level 1, 2, 3)
"""

# ruff: noqa: F401, F841  (the names imported below are yours to use)
from __future__ import annotations

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


def schedule(stage: int, p: int, m: int) -> list:
    """The instructions stage ``stage`` (0 .. p-1) runs for one step of ``m`` micro-batches."""
    first, last = stage == 0, stage == p - 1
    warmup = min(p - stage - 1, m)  # 1F1B's warm-up forwards
    out: list = []

    # TODO 1: 1F1B's shape: the warm-up forwards, then m - warmup times one F and one B,
    #         then the cool-down B's; each B sends its gradient on at once

    # TODO 2: the W's: each after its own B, none in the way of an F or a B that another
    #         stage waits for; where does this stage idle?

    # TODO 3: OptimizerStep() last; return the list

    raise NotImplementedError("TODO: 1F1B's F's and B's, then place the W's")


# -- the grader calls this on every rank: leave it as it is -----------------------------------
def run_stage(comm, x, **case):
    """Grade ``schedule`` on this rank: checker and simulator, then the MPI executor."""
    from minipar.exercises.zb_h1_schedule.grader import run_stage as grade

    return grade(schedule, comm, x, **case)
