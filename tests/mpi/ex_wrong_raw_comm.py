"""Wrong on purpose: blocks in MPI.COMM_WORLD itself, where minipar's watchdog cannot see."""

import numpy as np
from mpi4py import MPI


def ring_allreduce(comm, x):
    world = MPI.COMM_WORLD
    buf = np.empty_like(x)
    world.Recv(buf, source=(world.Get_rank() - 1) % world.Get_size())  # nobody sends
    return x + buf
