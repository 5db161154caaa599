"""Wrong on purpose: a correct reduce-scatter, then an all-gather whose indices are off by one.

After the reduce-scatter rank r owns the complete chunk (r + 1) % N and must pass it on
first; this all-gather starts from chunk r instead (one step behind), so the complete sums
it forwards are partly replaced by chunks that are not finished yet."""

import numpy as np


def ring_allreduce(comm, x):
    n, r = comm.Get_size(), comm.Get_rank()
    y = x.copy()
    chunks = np.array_split(y, n)
    right, left = (r + 1) % n, (r - 1) % n
    for s in range(n - 1):  # reduce-scatter: correct
        buf = np.empty_like(chunks[(r - s - 1) % n])
        comm.Sendrecv(chunks[(r - s) % n], dest=right, recvbuf=buf, source=left)
        chunks[(r - s - 1) % n] += buf
    for s in range(n - 1):  # all-gather: sends chunk (r - s), should send (r + 1 - s)
        comm.Sendrecv(chunks[(r - s) % n], dest=right, recvbuf=chunks[(r - s - 1) % n],
                      source=left)
    return y
