"""Wrong on purpose: causal by chunk, not by position (a query sees its whole chunk)."""

import numpy as np


def causal_mask(s, P, r):
    c = s // (2 * P)
    mine = np.concatenate([np.arange(r * c, (r + 1) * c),
                           np.arange((2 * P - 1 - r) * c, (2 * P - r) * c)])
    return (np.arange(s)[None, :] // c) <= (mine[:, None] // c)


def mask_step(comm, x, **case):
    from minipar.exercises.allgather_mask.grader import mask_step as grade

    return grade(causal_mask, comm, x, **case)
