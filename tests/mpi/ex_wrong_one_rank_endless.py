"""Wrong on purpose: a correct ring, except that rank 1 loops for ever before its exchange."""

import numpy as np


def ring_allreduce(comm, x):
    n, r = comm.Get_size(), comm.Get_rank()
    y = x.copy()
    chunks = np.array_split(y, n)
    right, left = (r + 1) % n, (r - 1) % n
    if r == 1:  # a debugging leftover: rank 1 never gets to the exchange
        while True: pass
    for s in range(n - 1):
        buf = np.empty_like(chunks[(r - s - 1) % n])
        comm.Sendrecv(chunks[(r - s) % n], dest=right, recvbuf=buf, source=left)
        chunks[(r - s - 1) % n] += buf
    for s in range(n - 1):
        comm.Sendrecv(chunks[(r + 1 - s) % n], dest=right, recvbuf=chunks[(r - s) % n], source=left)
    return y
