"""Rank 2 raises while the others wait for it: the whole job must end at once."""

import numpy as np
from mpi4py import MPI

from minipar.comm import TracedComm

comm = TracedComm(MPI.COMM_WORLD)
if comm.rank == 2:
    raise RuntimeError("deliberate failure on one rank")
comm.Recv(np.zeros(1), source=2)  # would wait for the watchdog (60 s) without the abort
