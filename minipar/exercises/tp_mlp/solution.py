"""Reference solution: the Megatron MLP, column-parallel then row-parallel, forward and backward.

EN tensor-parallel MLP · RU тензорно-параллельный MLP · ZH 张量并行 MLP

Shoeybi et al. 2019, "Megatron-LM", arXiv 1909.08053, §3 and Fig. 3a.  The
MLP y = GELU(x W1 + b1) W2 + b2 on t = N ranks: rank r holds the columns
r·k … (r+1)·k of W1 (and of b1) and the same rows of W2, k = d_ff / N; x, b2
and dy are the same on every rank.

    forward   a_r = x W1_r + b1_r            (column-parallel: whole features, no sum)
              y   = g(GELU(a_r) W2_r) + b2   (row-parallel: g = all-reduce; b2 once)
    backward  dW2_r = GELU(a_r)ᵀ dy,  db2 = Σ dy    (g's adjoint is the identity)
              da_r  = (dy W2_rᵀ) ⊙ GELU'(a_r),  dW1_r = xᵀ da_r,  db1_r = Σ da_r
              dx    = f*(da_r W1_rᵀ)             (f = identity forward, all-reduce backward)

One all-reduce of b·s·h elements forward and one backward: each rank sends
2 × 2(N-1)/N × b·s·h × 8 bytes.  Self-contained on purpose (no
:mod:`minipar.collectives`): this is what the learner writes.  minipar's own is
:class:`~minipar.parallel.tensor_parallel.transformer.ParallelMLP` (a
``ColumnParallelLinear`` with f inside, GELU, a ``RowParallelLinear`` with g inside, in
:mod:`minipar.parallel.tensor_parallel.layers`), the same steps in the same order; its f
and g run on :mod:`minipar.collectives`, which the grader refuses in a learner's file,
so the two all-reduces are written out here with Sendrecv.  tests/test_exercises_tp.py
checks that this file and ParallelMLP give the same y and gradients.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

_C, _A = math.sqrt(2.0 / math.pi), 0.044715


def allreduce(comm: Any, a: np.ndarray) -> np.ndarray:
    """Ring all-reduce (sum) over ``comm``: a new array, ``a`` untouched."""
    n, r = comm.Get_size(), comm.Get_rank()
    y = a.copy()
    chunks = np.array_split(y.reshape(-1), n)  # views into y
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
    """GELU, tanh approximation (GPT-2)."""
    return 0.5 * a * (1.0 + np.tanh(_C * (a + _A * a**3)))


def gelu_grad(a: np.ndarray) -> np.ndarray:
    """d GELU(a) / da."""
    t = np.tanh(_C * (a + _A * a**3))
    return 0.5 * (1.0 + t) + 0.5 * a * (1.0 - t * t) * _C * (1.0 + 3.0 * _A * a * a)


def pack(*arrays: np.ndarray) -> np.ndarray:
    """The backward's results as one flat array (the grader compares one array)."""
    return np.concatenate([np.ravel(a) for a in arrays])


def forward(comm: Any, x: np.ndarray, w1: np.ndarray, b1: np.ndarray, w2: np.ndarray,
            b2: np.ndarray) -> np.ndarray:
    a = x @ w1 + b1  # column-parallel: this rank's k features, each complete
    partial = gelu(a) @ w2  # row-parallel: this rank's share of the sum over d_ff
    return allreduce(comm, partial) + b2  # g; the bias once, after the sum


def backward(comm: Any, x: np.ndarray, w1: np.ndarray, b1: np.ndarray, w2: np.ndarray,
             b2: np.ndarray, dy: np.ndarray) -> tuple[np.ndarray, ...]:
    h, k = x.shape[-1], w1.shape[1]
    a = x @ w1 + b1  # recomputed: no communication
    dy2 = dy.reshape(-1, h)
    db2 = dy2.sum(axis=0)  # b2 is replicated: the full gradient on every rank
    dw2 = gelu(a).reshape(-1, k).T @ dy2
    da = (dy @ w2.T) * gelu_grad(a)
    da2 = da.reshape(-1, k)
    dw1 = x.reshape(-1, h).T @ da2
    db1 = da2.sum(axis=0)
    dx = allreduce(comm, da @ w1.T)  # f's backward: sum the partial input gradients
    return dx, dw1, db1, dw2, db2


def tp_mlp(comm: Any, x: np.ndarray, w1: np.ndarray, b1: np.ndarray, w2: np.ndarray,
           b2: np.ndarray, dy: np.ndarray | None = None) -> np.ndarray:
    """Forward (``dy`` None): y.  Backward: pack(dx, dw1, db1, dw2, db2) of this rank."""
    if dy is None:
        return forward(comm, x, w1, b1, w2, b2)
    return pack(*backward(comm, x, w1, b1, w2, b2, dy))
