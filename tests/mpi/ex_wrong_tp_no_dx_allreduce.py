"""Wrong tp_mlp: the backward forgets the all-reduce of dx (f's backward)."""

from minipar.exercises.tp_mlp.solution import forward, gelu, gelu_grad, pack


def tp_mlp(comm, x, w1, b1, w2, b2, dy=None):
    if dy is None:
        return forward(comm, x, w1, b1, w2, b2)
    h, k = x.shape[-1], w1.shape[1]
    a = x @ w1 + b1
    dy2 = dy.reshape(-1, h)
    da = (dy @ w2.T) * gelu_grad(a)
    dx = da @ w1.T  # wrong: a partial sum over this rank's features only
    return pack(dx, x.reshape(-1, h).T @ da.reshape(-1, k), da.reshape(-1, k).sum(axis=0),
                gelu(a).reshape(-1, k).T @ dy2, dy2.sum(axis=0))
