"""Wrong on purpose: the second chunk is 2P-2-r, one before rank r's (2P-1-r)."""

import numpy as np


def causal_mask(s, P, r):
    c = s // (2 * P)
    mine = np.concatenate([np.arange(r * c, (r + 1) * c),
                           np.arange((2 * P - 2 - r) * c, (2 * P - 1 - r) * c)])
    return np.arange(s)[None, :] <= mine[:, None]


def mask_step(comm, x, **case):
    from minipar.exercises.allgather_mask.grader import mask_step as grade

    return grade(causal_mask, comm, x, **case)
