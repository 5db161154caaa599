"""Wrong on purpose: every rank receives from the left before sending to the right."""

import numpy as np


def ring_allreduce(comm, x):
    n, r = comm.Get_size(), comm.Get_rank()
    y = x.copy()
    chunks = np.array_split(y, n)
    right, left = (r + 1) % n, (r - 1) % n
    for s in range(n - 1):
        buf = np.empty_like(chunks[(r - s - 1) % n])
        comm.Recv(buf, source=left)  # everyone waits here: nobody has sent yet
        comm.Send(chunks[(r - s) % n], dest=right)
        chunks[(r - s - 1) % n] += buf
    for s in range(n - 1):
        comm.Recv(chunks[(r - s) % n], source=left)
        comm.Send(chunks[(r + 1 - s) % n], dest=right)
    return y
