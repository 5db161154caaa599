"""Every rank answers, through a polite ring exchange and a barrier: oversubscription works."""

import numpy as np
from mpi4py import MPI

from minipar.comm import TracedComm

comm = TracedComm(MPI.COMM_WORLD)
n, r = comm.size, comm.rank
got = np.zeros(1, np.int64)
for _ in range(20):
    comm.Sendrecv(np.array([r], np.int64), (r + 1) % n, 0, got, (r - 1) % n, 0)
    comm.Barrier()
assert got[0] == (r - 1) % n
# gathered to rank 0, so the test reads the lines in rank order
lines = comm.comm.gather(f"hello from rank {r} of {n}, left neighbour {got[0]}", root=0)
if r == 0:
    print("\n".join(lines), flush=True)
