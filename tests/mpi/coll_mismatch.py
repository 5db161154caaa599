"""A collective called inconsistently across ranks must fail loudly, never hang.

``coll_mismatch.py CASE``: rank 1 deviates from the others in one way; the
receiving rank raises CollectiveMismatchError, which (under ``python -m
mpi4py``) aborts the job.  The pytest side checks the exit code and message.
"""

from __future__ import annotations

import sys

import numpy as np
from mpi4py import MPI

import minipar.collectives as C
from minipar.comm import TracedComm

comm = TracedComm(MPI.COMM_WORLD)
odd = comm.rank == 1
case = sys.argv[1]
n = 12 + (1 if odd and case.endswith("length") else 0)
x = np.arange(n, dtype=np.int32 if odd and case == "ring-dtype" else np.float32)
if case == "ring-length" or case == "ring-dtype":
    C.ring_allreduce(comm, x)
elif case == "recursive-doubling-length":
    C.recursive_doubling_allreduce(comm, x)
elif case == "broadcast-length":
    C.broadcast(comm, x, root=0)
elif case == "tree-op":
    C.tree_allreduce(comm, x, op="max" if odd else "sum")
elif case == "all-gather-shape":
    C.all_gather(comm, np.zeros((2, 4) if odd else (4, 2)))  # same bytes, other rows
elif case == "collective":
    (C.naive_allreduce if odd else C.ring_allreduce)(comm, x)
else:
    raise SystemExit(f"unknown case {case}")
print(f"rank {comm.rank}: returned")  # the root of a broadcast cannot notice
