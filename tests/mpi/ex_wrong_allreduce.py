"""Wrong on purpose: a 'ring all-reduce' that calls MPI's own Allreduce."""

import numpy as np


def ring_allreduce(comm, x):
    out = np.empty_like(x)
    comm.Allreduce(x, out)
    return out
