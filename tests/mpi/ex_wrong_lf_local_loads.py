"""Wrong loss_free_balancing: the new bias from this rank's loads only (no all-reduce)."""

import numpy as np


def loss_free_step(comm, x, bias, top_k, rate):
    order = np.argsort(-(x + bias), axis=1, kind="stable")[:, :top_k]
    chosen = np.take_along_axis(x, order, axis=1)
    gates = chosen / chosen.sum(axis=1, keepdims=True)
    loads = np.bincount(order.reshape(-1), minlength=x.shape[1]).astype(np.float64)
    new = bias + rate * np.sign(loads.mean() - loads)
    return np.concatenate([order.ravel().astype(np.float64), gates.ravel(), new])
