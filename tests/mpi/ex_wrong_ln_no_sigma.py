"""Wrong on purpose: the layer norm's backward without σ's path, and dγ, dβ never summed
over the ranks (each rank returns the sums over its own rows)."""

import numpy as np


def layernorm_backward(comm, x, gamma, dy):
    d = x.shape[-1]
    mu = x.mean(axis=-1, keepdims=True)
    rstd = 1.0 / np.sqrt(((x - mu) ** 2).mean(axis=-1, keepdims=True) + 1e-5)
    xhat = (x - mu) * rstd
    dxhat = dy * gamma
    dx = rstd * (dxhat - dxhat.mean(axis=-1, keepdims=True))  # lacks - x̂ · mean(dx̂ ⊙ x̂)
    return np.concatenate([dx.ravel(), (dy * xhat).reshape(-1, d).sum(axis=0),
                           dy.reshape(-1, d).sum(axis=0)])
