"""Exercise: DeepSeek-V3's DualPipe-V schedule of one pipeline rank, written by you.

EN DualPipe-V · RU DualPipe-V · ZH DualPipe-V

Grade it (2 ranks: 4 stages in a V):

    minipar exercise check dualpipev_schedule dualpipev_schedule.py -n 2

THE GOAL
    1F1B (the one_f_one_b exercise) gives rank s one stage; a forward and a
    backward each run alone.  DeepSeek-V3 (arXiv 2412.19437, §3.2.1) trains on
    DualPipe; DualPipe-V is DualPipe cut in half on ZB-V's V: rank s of p holds
    TWO chunks,

      chunk 0 = virtual stage s           (the way DOWN the V: ranks 0 -> p-1)
      chunk 1 = virtual stage 2p - 1 - s  (the way back UP: ranks p-1 -> 0)

    so PP = 2p stages, rank p - 1 hands chunk 0's output to its own chunk 1,
    and rank 0's chunk 1 computes the loss.  Two things make it fast:

      * the overlapped pair, ForwardBackward(Forward(j, c), Backward(i, 1 - c)):
        the forward of one micro-batch and the whole backward of an OLDER one,
        of the other chunk, run together: one's messages (with experts, its
        all-to-all) travel while the other computes;
      * the B/W split of the zero-bubble schedules: BackwardInput(i, c) (B, the
        gradient the previous stage waits for), BackwardWeight(i, c) (W, which
        nobody waits for) moved to fill the gaps.

    The table (DeepSeek's README): bubble (PP/2 - 1)(F&B + B - 3W), PP + 1
    chunk-activations in flight, m >= PP = 2p micro-batches.  Write

        schedule(stage, p, m) -> list of instructions

    as the ORDER of the computations; the given last line adds the messages
    (each receive right before its compute, each send right after: with_comm).

THE INSTRUCTIONS (from minipar.parallel.pipeline.stage_loop; i the micro-batch, c the chunk)
    Forward(i, c)                    F: chunk c forward on micro-batch i
    Backward(i, c)                   the whole backward (B and W in one)
    BackwardInput(i, c)              B alone ...
    BackwardWeight(i, c)             ... and its W, any time after its own B
    ForwardBackward(Forward(j, c), Backward(i, c'))
                                     an overlapped pair (two different micro-batches)
    with_comm adds RecvAct / SendAct / RecvGrad / SendGrad (a pair receives both its
    inputs first, sends both outputs after) and the OptimizerStep().  The executor turns
    each send into a non-blocking comm.Isend (a blocking comm.Send could wait for its
    receiver) and each receive into a wait for its message.

WHAT THE GRADER MEASURES
    * Correct for p = 1..4 ranks, m = 2p, 2p + 1, 3p + 2: every F, B, W of
      both chunks once, each W after its own B, every message matched, no
      deadlock (replayed: a stuck replay names the ranks waiting for each
      other); a pair of one micro-batch (its halves depend on each other) and
      the wrong chunk on the way back are named.
    * DualPipe-V's memory and pairs: at most 2p + 1 chunk-activations in flight
      per rank, and as many overlapped pairs as DeepSeek's steady state.
    * The bubble: replayed with F 1, B 2, W 1, F&B = F + B, every rank idles at
      most (PP/2 - 1)(F&B + B - 3W) = 2(p - 1).  What it should look like:
      minipar bubble --schedule dualpipev --stages 4 --micro-batches 8
    * Real ranks: each rank runs ITS list through minipar's MPI pipeline
      executor (two training steps of a small GPT, the pairs overlapped); the
      weights must equal the serial run's.

    Stuck?  minipar exercise hint dualpipev_schedule   (level 1, 2, 3)
"""

# ruff: noqa: F401, F841  (the names imported below are yours to use)
from __future__ import annotations

from minipar.parallel.pipeline.schedule import with_comm
from minipar.parallel.pipeline.stage_loop import (
    Backward,
    BackwardInput,
    BackwardWeight,
    Forward,
    ForwardBackward,
)


def one_f_one_b(stage: int, p: int, m: int) -> list:
    """GIVEN, for comparison: 1F1B's compute order on one chunk (p - s - 1 warm-up forwards,
    then one forward one backward, then the cool-down backwards)."""
    warmup = min(p - stage - 1, m)
    order = [Forward(i) for i in range(warmup)]
    for i in range(m - warmup):
        order += [Forward(warmup + i), Backward(i)]
    return order + [Backward(i) for i in range(m - warmup, m)]


def schedule(stage: int, p: int, m: int) -> list:
    """The instructions rank ``stage`` (0 .. p-1) runs for one step of ``m`` >= 2p micro-batches."""
    order: list = []

    # TODO 1: the warm-up: forwards of chunk 0 (the way down the V), then forwards of both
    #         chunks; how many depends on the rank's distance from the V's turn (rank p - 1)

    # TODO 2: the steady state: overlapped pairs, ForwardBackward(Forward(j, 0), Backward(i, 1))
    #         and ForwardBackward(Forward(j', 1), Backward(i', 0)), i and i' older micro-batches

    # TODO 3: the cool-down: the last backwards, split into B and W where a rank would idle;
    #         every W after its own B

    raise NotImplementedError("TODO: DeepSeek's eight steps on rank `stage`")
    return with_comm(order, stage, p, 2, "v")  # given: each receive before, each send after


# -- the grader calls this on every rank: leave it as it is -----------------------------------
def run_stage(comm, x, **case):
    """Grade ``schedule`` on this rank: checker and simulator, then the MPI executor."""
    from minipar.exercises.dualpipev_schedule.grader import run_stage as grade

    return grade(schedule, comm, x, **case)
