"""Wrong on purpose: a correct ring, but the chunks are put together starting from one's own."""

import numpy as np


def ring_allreduce(comm, x):
    n, r = comm.Get_size(), comm.Get_rank()
    chunks = np.array_split(x.copy(), n)
    right, left = (r + 1) % n, (r - 1) % n
    for s in range(n - 1):
        buf = np.empty_like(chunks[(r - s - 1) % n])
        comm.Sendrecv(chunks[(r - s) % n], dest=right, recvbuf=buf, source=left)
        chunks[(r - s - 1) % n] += buf
    for s in range(n - 1):
        comm.Sendrecv(chunks[(r + 1 - s) % n], dest=right, recvbuf=chunks[(r - s) % n], source=left)
    mine = (r + 1) % n  # the chunk this rank finished first; then the ones after it
    return np.concatenate([chunks[(mine + k) % n] for k in range(n)])
