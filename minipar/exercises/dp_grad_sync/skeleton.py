"""Exercise: synchronise the gradients of data parallelism, as DDP does.

EN gradient synchronisation · RU синхронизация градиентов · ZH 梯度同步

Grade it (4 ranks by default):

    minipar exercise check dp_grad_sync dp_grad_sync.py -n 4

THE SETTING (Li et al. 2020, PyTorch DDP, arXiv 2006.15704)
    Every rank holds the same model.  The global batch has ``batch`` rows;
    rank r took ``rows`` of them (numpy.array_split order: with 10 rows on 3
    ranks, 4, 3 and 3) and computed x = g_r, the gradient of the MEAN loss
    over ITS rows (a flat float64 array, one entry per parameter).

THE GOAL
    Return, on every rank, a NEW array: the gradient of the mean loss over
    the WHOLE global batch — what the serial model computes on all rows:

        g = Σ_r (rows_r / batch) · g_r

    Careful: that is not the sum of the g_r, and it is not their plain
    average either (1/N) when the slices are uneven.  Leave x untouched.

THE ALGORITHM
    1. Weight this rank's gradient by its share of the global batch (a new
       array: x stays as it was).
    2. Sum the weighted gradients over all ranks with a RING all-reduce,
       written by you: reduce-scatter, then all-gather (the exercise
       ring_allreduce explains the ring).
    Stuck?  minipar exercise hint dp_grad_sync   (level 1, 2, 3)

WHAT THE GRADER MEASURES
    * The result, against the serial gradient of the whole global batch
      (GPT.loss_and_grads on all rows), for batches that split evenly and
      unevenly over the ranks, within 1e-10 of the gradient's scale.
    * The traffic of every rank: bytes sent = bytes received = 2(N-1)/N x S
      (S = x.nbytes), only to (r + 1) % N and only from (r - 1) % N — no
      gathering everything on one rank (that is a parameter server).
    * No MPI collectives (comm.Allreduce, comm.allreduce, Reduce, Bcast ...):
      they are the grader's tools, not the answer; and not
      minipar.collectives either: write the ring yourself.

WHICH MPI CALLS TO USE (mpi4py's upper-case buffer API, numpy arrays)
    comm.Get_rank(), comm.Get_size()
    comm.Sendrecv(sendbuf, dest=right, recvbuf=buf, source=left)
    comm.Send(buf, dest=...) / comm.Recv(buf, source=...)
        careful: if every rank calls Recv first, all of them wait for ever.
"""

# ruff: noqa: F841  (the names set up below are yours to use)
from __future__ import annotations

import numpy as np


def sync_gradients(comm, x: np.ndarray, rows: int, batch: int) -> np.ndarray:
    """The gradient of the global batch's mean loss, as a new array on every rank."""
    n, r = comm.Get_size(), comm.Get_rank()
    right, left = (r + 1) % n, (r - 1) % n

    # TODO 1: weight this rank's gradient by its share of the batch (a new array)

    # TODO 2: ring all-reduce of y: reduce-scatter, then all-gather

    raise NotImplementedError("TODO: weight the gradient, then ring all-reduce it")
