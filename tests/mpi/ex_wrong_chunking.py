"""Wrong on purpose: the reduce-scatter adds into the chunk one off from the one received."""

import numpy as np


def ring_allreduce(comm, x):
    n, r = comm.Get_size(), comm.Get_rank()
    y = x.copy()
    chunks = np.array_split(y, n)
    right, left = (r + 1) % n, (r - 1) % n
    for s in range(n - 1):
        send = chunks[(r - s) % n]
        buf = np.empty_like(chunks[(r - s - 1) % n])
        comm.Sendrecv(send, dest=right, recvbuf=buf, source=left)
        target = chunks[(r - s - 2) % n]  # off by one: should be (r - s - 1) % n
        target[: min(buf.size, target.size)] += buf[: target.size]
    for s in range(n - 1):
        comm.Sendrecv(chunks[(r + 1 - s) % n], dest=right, recvbuf=chunks[(r - s) % n], source=left)
    return y
