"""Wrong tp_mlp: adds b2 on every rank before the all-reduce (so the sum holds N x b2)."""

from minipar.exercises.tp_mlp.solution import allreduce, backward, gelu, pack


def tp_mlp(comm, x, w1, b1, w2, b2, dy=None):
    if dy is not None:
        return pack(*backward(comm, x, w1, b1, w2, b2, dy))
    return allreduce(comm, gelu(x @ w1 + b1) @ w2 + b2)  # wrong: b2 inside the sum
