"""Exercise: a ZeRO-1 optimizer step, written by you from point-to-point messages.

EN ZeRO stage 1 · RU ZeRO-1: шардирование состояний оптимизатора · ZH ZeRO-1：优化器状态分片

Grade it (4 ranks by default):

    minipar exercise check zero1_step zero1_step.py -n 4

THE GOAL
    Data parallelism keeps Adam's moments m and v (and, in mixed precision,
    fp32 master weights) for ALL Ψ parameters on every rank.  ZeRO stage 1
    (Rajbhandari et al. 2019, arXiv 1910.02054) shards them: rank r keeps
    them only for its slice of the flat parameter buffer,

        slice r = np.array_split(np.arange(Ψ), N)[r]
                  (the first Ψ % N ranks get one element more)

    and each step goes:

    1. REDUCE-SCATTER the gradients: every rank holds x, the full gradient
       of its own micro-batch.  Sum them over ranks so that rank r ends with
       the sum of slice r only, then divide by N: the mean gradient g_r.
    2. STEP ITS OWN SHARD: AdamW on slice r of the parameters, with the m, v
       it holds (state["m"], state["v"], arrays of the slice's length), and
       t = state["t"] + 1 (decoupled weight decay, bias correction):

           state["t"] += 1;  t = state["t"]
           p_r *= 1 - lr * weight_decay
           m = b1 * m + (1 - b1) * g_r        (in place: m *= b1; m += ...)
           v = b2 * v + (1 - b2) * g_r**2     (in place)
           p_r -= (lr / (1 - b1**t)) * m / (sqrt(v / (1 - b2**t)) + eps)

       Update state["m"], state["v"] IN PLACE and increment state["t"]: the
       next step starts from them (the grader calls you twice in a row).
    3. ALL-GATHER the updated slices so every rank has the full new
       parameters, and return them as a NEW array.

    Do not write into x.  params is the same on every rank; you may copy it.

WHY IT WORKS
    AdamW is element-wise: stepping N slices is stepping the whole buffer.
    You only have m and v for your own slice, so you cannot update anything
    else: the all-gather is how the other slices reach you.

WHAT THE GRADER MEASURES
    * The result, against the serial AdamW step (minipar.optim.AdamW on the
      full buffer and the mean gradient), for lengths 1, N+1, 1000, 1001,
      two steps each (the second continues from the state your first left).
    * The traffic of every rank, counted by minipar's TracedComm: one
      reduce-scatter + one all-gather of S = Ψ x 8 bytes, i.e. 2(N-1)/N x S
      per rank (between 2(N-1) floor(Ψ/N) and 2(N-1) ceil(Ψ/N) elements),
      2(N-1) x S over all ranks.  An all-reduce of the gradients (another
      (N-1)/N x S) is exactly what ZeRO-1 avoids.
    * No MPI collectives (comm.Allreduce, Reduce_scatter, Allgather ...):
      they are the grader's oracle.  Build the ring from comm.Sendrecv.

WHICH MPI CALLS TO USE (mpi4py's upper-case buffer API, numpy arrays)
    comm.Get_rank(), comm.Get_size()
    comm.Sendrecv(sendbuf, dest=(r + 1) % N, recvbuf=buf, source=(r - 1) % N)
    comm.Send(buf, dest=...) / comm.Recv(buf, source=...)
    Stuck?  minipar exercise hint zero1_step   (level 1, 2, 3)
"""

# ruff: noqa: F841, RUF059  (the names set up below are yours to use)
from __future__ import annotations

import numpy as np


def zero1_step(comm, x: np.ndarray, params: np.ndarray, state: dict, lr: float = 1e-2,
               betas: tuple = (0.9, 0.999), eps: float = 1e-8,
               weight_decay: float = 0.01) -> np.ndarray:
    """New full parameters after one ZeRO-1 AdamW step on the mean gradient over ranks."""
    n, r = comm.Get_size(), comm.Get_rank()
    right, left = (r + 1) % n, (r - 1) % n
    g = np.array_split(x.copy(), n)  # g[r] will be your slice of the gradient
    p = np.array_split(params.copy(), n)  # p[r] is the slice you update
    m, v = state["m"], state["v"]  # the moments of slice r only
    b1, b2 = betas

    # TODO 1: reduce-scatter g (N-1 Sendrecv steps), then mean = g[r] / n

    # TODO 2: AdamW on p[r] with m, v in place; state["t"] += 1

    # TODO 3: all-gather the slices p (N-1 Sendrecv steps); return np.concatenate(p)

    raise NotImplementedError("TODO: reduce-scatter, step your shard, all-gather")
