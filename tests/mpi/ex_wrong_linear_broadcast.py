"""Wrong on purpose: the root sends to every other rank itself (a linear broadcast)."""

import numpy as np


def tree_broadcast(comm, x, root=0):
    n, r = comm.Get_size(), comm.Get_rank()
    if r == root:
        for dst in range(n):
            if dst != root:
                comm.Send(x, dest=dst)
        return x.copy()
    y = np.empty_like(x)
    comm.Recv(y, source=root)
    return y
