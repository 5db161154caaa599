"""Exercise: the layer norm's backward, written by you (ends notebook 02).

EN layer-norm backward · RU обратный проход LayerNorm · ZH 层归一化反向传播

Grade it (2 ranks by default; 1 rank is the plain serial layer):

    minipar exercise check layernorm_backward layernorm_backward.py -n 2

THE SETTING (Ba, Kiros & Hinton 2016, "Layer Normalization", arXiv 1607.06450)
    y = γ ⊙ x̂ + β,   x̂ = (x - μ) / σ,   μ = mean(x),  σ = sqrt(var(x) + ε)
    over the LAST axis (d features) of every row, ε = 1e-5, as the serial model's
    minipar.nn.layers.layernorm_forward.  The rows (tokens) are split over the N
    ranks (numpy.array_split): rank r holds its rows of x and of dy = ∂L/∂y; γ
    is the same on every rank.

THE GOAL
    layernorm_backward(comm, x, gamma, dy) returns pack(dx, dgamma, dbeta):
    * dx: ∂L/∂x of YOUR rows (shape of x);
    * dgamma, dbeta: ∂L/∂γ and ∂L/∂β of the WHOLE batch (d each), the same on
      every rank.
    All must equal minipar.nn.layers.layernorm_backward on all rows (float64)
    to rounding.  Leave x untouched.

WHY IT WORKS
    Every row is normalised on its own: μ and σ of a row need no other row, so
    dx needs no message.  Differentiate through x̂ (three paths: x directly, μ,
    and σ, both of which depend on every entry of the row).  γ and β are shared
    by all rows: their gradients are sums over every row, and each rank holds
    only some rows, so those two sums are finished with one all-reduce (this is
    why sequence parallelism all-reduces the layer norm's weight gradients,
    Korthikanti et al. 2022, arXiv 2205.05198).

WHAT THE GRADER MEASURES
    * The result against the serial layer on all rows, three shapes, and the
      serial layer itself against central differences of the forward (the
      gradient check: the oracle is right).  A wrong result is named when it
      matches a known mistake (the σ path or the μ path left out, γ not
      applied, dγ and dβ not summed over the ranks).
    * The traffic: one all-reduce of 2·d elements (dγ and dβ), measured as
      the bytes all ranks sent, 2(N-1) x S for S = 2·d x 8 bytes.
    * No MPI collectives (comm.Allreduce ...): use allreduce() below, a ring of
      comm.Sendrecv calls (comm.Send and comm.Recv would do as well).
    Stuck?  minipar exercise hint layernorm_backward   (level 1, 2, 3)
"""

# ruff: noqa: F841  (the names set up below are yours to use)
from __future__ import annotations

import numpy as np

EPS = 1e-5  #: the serial layer's ε (minipar.nn.layers.LN_EPS)


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


def pack(*arrays: np.ndarray) -> np.ndarray:
    """GIVEN: the results as one flat array (the grader compares one array)."""
    return np.concatenate([np.ravel(a) for a in arrays])


def layernorm_backward(comm, x: np.ndarray, gamma: np.ndarray, dy: np.ndarray) -> np.ndarray:
    """pack(dx, dgamma, dbeta): dx of this rank's rows, dγ and dβ of the whole batch."""
    d = x.shape[-1]
    # TODO 1: the forward's x̂ and 1/σ of each row (no message)
    # TODO 2: dx of your rows, through x̂, μ and σ (no message)
    # TODO 3: dγ and dβ of your rows, then summed over the ranks (one allreduce)
    raise NotImplementedError("TODO: the layer norm's backward")
