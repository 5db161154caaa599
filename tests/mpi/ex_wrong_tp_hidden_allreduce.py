"""Wrong tp_mlp: all-reduces the hidden activation after the first (column-parallel) linear."""

from minipar.exercises.tp_mlp.solution import allreduce, backward, gelu, pack


def tp_mlp(comm, x, w1, b1, w2, b2, dy=None):
    if dy is not None:
        return pack(*backward(comm, x, w1, b1, w2, b2, dy))
    a = allreduce(comm, x @ w1 + b1)  # wrong: a_r holds whole features, not partial sums
    return allreduce(comm, gelu(a) @ w2) + b2
