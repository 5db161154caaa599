"""Wrong on purpose: a while loop whose counter never advances (every rank loops for ever)."""

import numpy as np


def ring_allreduce(comm, x):
    n, r = comm.Get_size(), comm.Get_rank()
    chunks = np.array_split(x.copy(), n)
    start, c = 0, 0
    while c <= r:  # where does my chunk start? (forgot c += 1)
        start += 0 * len(chunks[c])
    return np.concatenate(chunks)
