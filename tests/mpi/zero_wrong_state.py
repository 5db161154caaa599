"""Wrong ZeRO-1 step: rebinds m and v instead of updating the state shard in place

Used by tests/test_zero.py: the grader must catch it.
"""

from __future__ import annotations

from typing import Any

import numpy as np


def zero1_step(comm: Any, x: np.ndarray, params: np.ndarray, state: dict, lr: float = 1e-2,
               betas: tuple[float, float] = (0.9, 0.999), eps: float = 1e-8,
               weight_decay: float = 0.01) -> np.ndarray:
    """The new full parameters after one AdamW step on the mean gradient over ranks.

    ``x``: this rank's full gradient (Ψ,), left untouched; ``params``: the full
    parameters (Ψ,), the same on every rank; ``state``: this rank's optimizer
    shard {"m", "v": arrays of its slice, "t": steps taken}, updated in place.
    """
    n, r = comm.Get_size(), comm.Get_rank()
    right, left = (r + 1) % n, (r - 1) % n
    g = np.array_split(x.copy(), n)  # views of a copy: chunk i is rank i's slice
    # 1. reduce-scatter: after N-1 steps chunk r holds the sum over all ranks
    for s in range(n - 1):
        send, recv = g[(r - s - 1) % n], g[(r - s - 2) % n]
        buf = np.empty_like(recv)
        comm.Sendrecv(send, dest=right, recvbuf=buf, source=left)
        recv += buf
    grad = g[r] / n
    # 2. AdamW on the own slice only
    p = np.array_split(params.copy(), n)
    mine, m, v = p[r], state["m"], state["v"]
    b1, b2 = betas
    state["t"] += 1
    t = state["t"]
    if weight_decay:
        mine *= 1.0 - lr * weight_decay
    m = b1 * m + (1.0 - b1) * grad  # WRONG: a new array; state["m"] keeps the old moments
    v = b2 * v + (1.0 - b2) * (grad * grad)
    denom = np.sqrt(v / (1.0 - b2 ** t))
    denom += eps
    mine -= (lr / (1.0 - b1 ** t)) * m / denom
    # 3. all-gather: pass the updated slices around the same ring
    for s in range(n - 1):
        send, recv = p[(r - s) % n], p[(r - s - 1) % n]
        comm.Sendrecv(send, dest=right, recvbuf=recv, source=left)
    return np.concatenate(p)
