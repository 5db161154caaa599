"""Reference solution of allgather_mask: rank r's two chunks, each query against the keys up
to its own position."""

from __future__ import annotations

import numpy as np


def causal_mask(s: int, P: int, r: int) -> np.ndarray:
    c = s // (2 * P)
    mine = np.concatenate([np.arange(r * c, (r + 1) * c),
                           np.arange((2 * P - 1 - r) * c, (2 * P - r) * c)])
    return np.arange(s)[None, :] <= mine[:, None]


def mask_step(comm, x, **case):
    from minipar.exercises.allgather_mask.grader import mask_step as grade

    return grade(causal_mask, comm, x, **case)
