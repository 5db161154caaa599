"""Exercise: the GPipe schedule of one pipeline stage, written by you as a list of instructions.

EN GPipe · RU GPipe (конвейер с микро-батчами) · ZH GPipe（微批次流水线）

Grade it (3 ranks: 3 stages):

    minipar exercise check gpipe_schedule gpipe_schedule.py -n 3

THE GOAL
    Pipeline parallelism cuts the model into p stages, one per rank, and the
    mini-batch into m micro-batches.  Stage s receives micro-batch i's
    activation from stage s - 1, runs its layers forward, and passes the
    output to stage s + 1; backward goes the other way with the gradients.
    A schedule says, for ONE stage, in which order it does all that.  Write

        schedule(stage, p, m) -> list of instructions

    for GPipe (Huang et al. 2018, arXiv 1811.06965): ALL m forwards, then
    ALL m backwards, then one optimizer step (the "flush").

THE INSTRUCTIONS (from minipar.parallel.pipeline.stage_loop; i is the micro-batch)
    RecvAct(i)     receive micro-batch i's input activation from stage s - 1
    Forward(i)     run this stage's layers forward on it (keep the activations)
    SendAct(i)     send its output activation to stage s + 1
    RecvGrad(i)    receive the gradient of that output from stage s + 1
    Backward(i)    run this stage's layers backward (free the activations)
    SendGrad(i)    send the gradient of this stage's input to stage s - 1
    OptimizerStep()  update this stage's weights: once, last

    The first stage has no one to receive activations from (it reads the
    data) and the last stage no one to send them to (it computes the loss):
    leave those messages out, or they talk past the end of the pipeline.
    A receive must come before the compute that needs it, a send after the
    compute that produced it.  The executor turns each SendAct/SendGrad into
    a non-blocking comm.Isend (so a send never waits; a blocking comm.Send
    could) and each RecvAct/RecvGrad into a receive that waits for its message.

WHAT THE GRADER MEASURES
    * Correct for p = 1..4 stages, m = 1..8 micro-batches: every forward and
      backward once, every message sent and received once, in an order that
      cannot deadlock (replayed: a stuck replay names the stages waiting for
      each other).
    * GPipe's rule: all m forwards before any backward, so every stage
      holds m micro-batches' activations at once.
    * The bubble: replayed with forward 1, backward 2 per stage, the idle
      share of the step must be exactly (p - 1)/(m + p - 1).  (What it should
      look like: minipar bubble --schedule gpipe --stages 4 --micro-batches 8.)
    * Real ranks: each rank runs ITS stage's list through minipar's MPI
      pipeline executor, training a small GPT two steps; the weights must
      equal the serial run's.

    Stuck?  minipar exercise hint gpipe_schedule   (level 1, 2, 3)
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
    out: list = []

    # TODO 1: the forwards, micro-batch 0 .. m-1 (receive? compute, send?)

    # TODO 2: the backwards, in reverse (receive? compute, send?)

    # TODO 3: one OptimizerStep() at the end; return the list

    raise NotImplementedError("TODO: all forwards, then all backwards, then OptimizerStep()")


# -- the grader calls this on every rank: leave it as it is -----------------------------------
def run_stage(comm, x, **case):
    """Grade ``schedule`` on this rank: checker and simulator, then the MPI executor."""
    from minipar.exercises.gpipe_schedule.grader import run_stage as grade

    return grade(schedule, comm, x, **case)
