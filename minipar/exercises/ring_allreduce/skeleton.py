"""Exercise: ring all-reduce, written by you from point-to-point messages.

EN ring all-reduce · RU кольцевой all-reduce · ZH 环形全归约

Grade it (4 ranks by default):

    minipar exercise check ring_allreduce ring_allreduce.py -n 4

THE GOAL
    Every rank r holds an array x_r (same length L and dtype everywhere).
    Return, on every rank, a NEW array with the elementwise sum
    x_0 + x_1 + ... + x_{N-1}.  Do not modify x.

THE ALGORITHM (Patarasuk & Yuan 2009; Baidu 2017; Horovod, arXiv 1802.05799)
    The ranks form a ring: rank r sends only to its right neighbour
    right = (r + 1) % N and receives only from its left neighbour
    left = (r - 1) % N.  Split a COPY of x into N chunks, in
    numpy.array_split order (any L works, even L < N):

        y = x.copy()
        chunks = np.array_split(y, N)     # views into y

    1. Reduce-scatter, N-1 steps: each step, every rank sends one chunk to
       the right and adds the chunk arriving from the left into its own.
       Afterwards every rank holds the complete sum of one chunk.
    2. All-gather, N-1 steps: the completed chunks travel the same ring
       until every rank has all of them.  Return y.

    Which chunk goes where at each step is the exercise.  Stuck?

        minipar exercise hint ring_allreduce     # level 1, then 2, then 3

WHAT THE GRADER MEASURES
    * The result, against MPI's own Allreduce, for lengths 0, 1, N-1, N, N+1,
      1000 and 1001 and dtypes float64, float32, int64, int32 (random floats
      and rank-valued integers).  Your input must be left untouched.
    * The traffic of every rank, counted by minipar's TracedComm:
        - bytes sent = bytes received = 2(N-1)/N x S, where S = x.nbytes
          (exactly, when N divides L; otherwise 2(N-1) chunks of
          floor(L/N) or ceil(L/N) elements, and 2(N-1) x S over all ranks);
        - sends only to (r + 1) % N, receives only from (r - 1) % N.
    * No MPI collectives: calling comm.Allreduce / allreduce / Reduce /
      Gather / Bcast ... fails the exercise (they are the grader's oracle).

WHICH MPI CALLS TO USE (mpi4py's upper-case buffer API, numpy arrays)
    comm.Get_rank(), comm.Get_size()
    comm.Sendrecv(sendbuf, dest=right, recvbuf=buf, source=left)
        sends and receives in one call: no deadlock when every rank does it.
    comm.Send(buf, dest=...) / comm.Recv(buf, source=...)
        careful: if every rank calls Recv first, all of them wait for ever.
    Buffers must be contiguous numpy arrays (1-D chunks of y are);
    np.empty_like(chunk) makes a receive buffer of the right size and dtype.
"""

# ruff: noqa: F841  (the names set up below are yours to use)
from __future__ import annotations

import numpy as np


def ring_allreduce(comm, x: np.ndarray) -> np.ndarray:
    """Elementwise sum of ``x`` over all ranks, as a new array on every rank."""
    n, r = comm.Get_size(), comm.Get_rank()
    right, left = (r + 1) % n, (r - 1) % n
    y = x.copy()
    chunks = np.array_split(y, n)

    # TODO 1: reduce-scatter (N-1 steps of Sendrecv to the right)

    # TODO 2: all-gather (N-1 steps on the same ring)

    raise NotImplementedError("TODO: write the reduce-scatter and the all-gather")
