"""Exercise: the Megatron tensor-parallel MLP, forward and backward, written by you.

EN tensor-parallel MLP · RU тензорно-параллельный MLP · ZH 张量并行 MLP

Grade it (4 ranks by default):

    minipar exercise check tp_mlp tp_mlp.py -n 4

THE SETTING (Shoeybi et al. 2019, Megatron-LM, arXiv 1909.08053, Fig. 3a)
    The transformer MLP  y = GELU(x W1 + b1) W2 + b2  (d -> d_ff -> d) on N
    ranks.  Each rank holds a SLICE of the weights, cut from the full ones:

        w1 = W1[:, r·k:(r+1)·k]   b1 = b1[r·k:(r+1)·k]   (COLUMNS, k = d_ff / N)
        w2 = W2[r·k:(r+1)·k, :]                          (the same ROWS)
        b2, x and dy: the full arrays, the same on every rank

THE GOAL
    tp_mlp(comm, x, w1, b1, w2, b2, dy) is called twice per shape:
    * dy is None (FORWARD): return y, the full output, on every rank;
    * dy given (BACKWARD): return pack(dx, dw1, db1, dw2, db2): the full
      input gradient dx and the gradients of YOUR slices (and of b2).
    Both must equal the serial MLP (float64) to rounding.  Leave x untouched.

WHY IT WORKS (and where the two all-reduces go)
    Column-parallel first linear: a_r = x w1 + b1 is k COMPLETE features of
    the hidden layer; GELU is element-wise, so GELU(a_r) needs nothing from
    the other ranks.  Row-parallel second linear: GELU(a_r) w2 is this
    rank's share of the sum over d_ff, so the N shares are summed once:

        forward:  y  = g( GELU(a_r) w2 ) + b2        g = all-reduce (sum)
        backward: dx = f*( da_r w1ᵀ )                f* = all-reduce (sum)

    f (before the MLP) is the identity forward and an all-reduce backward;
    g (after it) is an all-reduce forward and the identity backward: dy is
    already the same on every rank.  b2 is added ONCE, after the sum.  The
    weight gradients stay on their rank: each rank owns a different slice.

        dw2 = GELU(a_r)ᵀ dy      db2 = Σ dy          (sums over all tokens)
        da_r = (dy w2ᵀ) ⊙ GELU'(a_r)
        dw1 = xᵀ da_r            db1 = Σ da_r

WHAT THE GRADER MEASURES
    * The result against minipar.nn.mlp on the full weights, two shapes,
      forward and backward.  A wrong result is named when it matches a
      known mistake (the bias added on every rank, an all-reduce after the
      first linear, no all-reduce of dx, ...).
    * The traffic: EXACTLY ONE all-reduce of b·s·h elements in the forward
      and one in the backward, measured as the bytes all ranks sent,
      2(N-1) x S for one ring all-reduce of S = b·s·h x 8 bytes.
    * No MPI collectives (comm.Allreduce ...): use allreduce() below, a ring
      of comm.Sendrecv calls (the exercise ring_allreduce writes it).
    Stuck?  minipar exercise hint tp_mlp   (level 1, 2, 3)
"""

# ruff: noqa: F841  (the names set up below are yours to use)
from __future__ import annotations

import math

import numpy as np

_C, _A = math.sqrt(2.0 / math.pi), 0.044715


def allreduce(comm, a: np.ndarray) -> np.ndarray:
    """GIVEN: ring all-reduce (sum) of ``a`` over the ranks; a new array, ``a`` untouched."""
    n, r = comm.Get_size(), comm.Get_rank()
    y = a.copy()
    chunks = np.array_split(y.reshape(-1), n)
    right, left = (r + 1) % n, (r - 1) % n
    for s in range(n - 1):  # reduce-scatter
        send, recv = chunks[(r - s) % n], chunks[(r - s - 1) % n]
        buf = np.empty_like(recv)
        comm.Sendrecv(send, dest=right, recvbuf=buf, source=left)
        recv += buf
    for s in range(n - 1):  # all-gather
        send, recv = chunks[(r + 1 - s) % n], chunks[(r - s) % n]
        comm.Sendrecv(send, dest=right, recvbuf=recv, source=left)
    return y


def gelu(a: np.ndarray) -> np.ndarray:
    """GIVEN: GELU, tanh approximation (GPT-2)."""
    return 0.5 * a * (1.0 + np.tanh(_C * (a + _A * a**3)))


def gelu_grad(a: np.ndarray) -> np.ndarray:
    """GIVEN: d GELU(a) / da."""
    t = np.tanh(_C * (a + _A * a**3))
    return 0.5 * (1.0 + t) + 0.5 * a * (1.0 - t * t) * _C * (1.0 + 3.0 * _A * a * a)


def pack(*arrays: np.ndarray) -> np.ndarray:
    """GIVEN: the backward's results as one flat array (the grader compares one array)."""
    return np.concatenate([np.ravel(a) for a in arrays])


def forward(comm, x, w1, b1, w2, b2) -> np.ndarray:
    """y = GELU(x W1 + b1) W2 + b2 on every rank, from this rank's slices."""
    # TODO 1: a = your k hidden features; partial = your share of y; one all-reduce; b2 once
    raise NotImplementedError("TODO: the column-parallel, then row-parallel forward")


def backward(comm, x, w1, b1, w2, b2, dy) -> tuple:
    """(dx, dw1, db1, dw2, db2): dx full, the weight gradients of this rank's slices."""
    h, k = x.shape[-1], w1.shape[1]
    # TODO 2: recompute a (no message), then the gradients; one all-reduce, of dx
    raise NotImplementedError("TODO: the backward, with f's all-reduce on dx")


def tp_mlp(comm, x: np.ndarray, w1: np.ndarray, b1: np.ndarray, w2: np.ndarray,
           b2: np.ndarray, dy: np.ndarray | None = None) -> np.ndarray:
    """Forward (dy None): y.  Backward: pack(dx, dw1, db1, dw2, db2) of this rank."""
    if dy is None:
        return forward(comm, x, w1, b1, w2, b2)
    return pack(*backward(comm, x, w1, b1, w2, b2, dy))
