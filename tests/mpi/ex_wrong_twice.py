"""Wrong on purpose: the ring all-reduce applied twice (a sum summed again: N x the sum)."""

import numpy as np


def _ring(comm, y):
    n, r = comm.Get_size(), comm.Get_rank()
    chunks = np.array_split(y, n)
    right, left = (r + 1) % n, (r - 1) % n
    for s in range(n - 1):
        buf = np.empty_like(chunks[(r - s - 1) % n])
        comm.Sendrecv(chunks[(r - s) % n], dest=right, recvbuf=buf, source=left)
        chunks[(r - s - 1) % n] += buf
    for s in range(n - 1):
        comm.Sendrecv(chunks[(r + 1 - s) % n], dest=right, recvbuf=chunks[(r - s) % n], source=left)
    return y


def ring_allreduce(comm, x):
    return _ring(comm, _ring(comm, x.copy()))
