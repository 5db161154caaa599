"""Wrong on purpose: rank 2 indexes past the end of its chunk list (others would wait)."""

import numpy as np


def ring_allreduce(comm, x):
    n, r = comm.Get_size(), comm.Get_rank()
    chunks = np.array_split(x.copy(), n)
    if r == 2:
        chunks[n] += 1  # IndexError on rank 2 only
    buf = np.empty_like(chunks[0])
    comm.Recv(buf, source=(r - 1) % n)
    return np.concatenate(chunks)
