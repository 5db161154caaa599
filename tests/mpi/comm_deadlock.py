"""A deliberate deadlock: both ranks receive first.  The watchdog must name it."""

import numpy as np
from mpi4py import MPI

from minipar.comm import TracedComm

comm = TracedComm(MPI.COMM_WORLD)
peer = 1 - comm.rank
buf = np.zeros(4)
with comm.operation("exchange"):
    comm.Recv(buf, source=peer, tag=7)  # both ranks wait here: nobody sends
    comm.Send(buf, dest=peer, tag=7)
print("unreachable")
