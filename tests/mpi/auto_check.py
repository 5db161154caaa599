"""allreduce(algorithm="auto") on N ranks: MPI's answer, the chosen algorithm, its exact bytes.

Lengths straddle the size where auto switches from recursive doubling to
the ring (where the α–β–γ model with the committed constants has the ring
faster: ``ring_threshold(N)``) and the tiny lengths 0, 1, N-1, N+1.  For each: the result
equals MPI's own Allreduce (int64 data: exact), the bytes are counted under
the name of the algorithm ``choose_allreduce`` names and equal
``cost.allreduce_bytes(..., "auto")``, and ``allreduce`` without an
algorithm does the same.  Prints ``AUTO-SUMMARY N=.. checks=.. failures=..``.
"""

import math
import sys
from pathlib import Path

import numpy as np
from mpi4py import MPI

sys.path.insert(0, str(Path(__file__).parent))
from mpi_checks import Checks

from minipar import collectives as C
from minipar.collectives.auto import choose_allreduce, ring_threshold
from minipar.comm import TracedComm

comm = TracedComm(MPI.COMM_WORLD)
N, R = comm.size, comm.rank
c = Checks("AUTO")


item = 8
lengths = [0, 1, max(N - 1, 0), N + 1, 1000]
threshold = ring_threshold(N)
if math.isfinite(threshold):  # the last length below the threshold and the first above
    first_ring = math.ceil(threshold / item)
    lengths += [first_ring - 1, first_ring]
seen = set()
for n in lengths:
    x = (np.arange(n, dtype=np.int64) * (R + 3)) % 1000 - 7 * R
    for op in ("sum", "max") if n < 10**5 else ("sum",):
        want = C.allreduce(comm, x, op, algorithm="mpi")
        for how in ("auto", "default"):
            comm.stats.reset()
            got = (C.allreduce(comm, x, op, algorithm="auto") if how == "auto"
                   else C.allreduce(comm, x, op))
            chosen = choose_allreduce(n * item, N)
            seen.add(chosen)
            what = f"{how} n={n} {op} ({chosen})"
            c.check(np.array_equal(got, want), what + ": result differs from MPI's Allreduce")
            name = f"{chosen}_allreduce"
            sent, recv = C.allreduce_bytes(n, item, N, R, "auto")
            c.check(set(comm.stats.ops) <= {name}, what + f": counted under {set(comm.stats.ops)}")
            c.check((comm.stats.bytes_sent(name), comm.stats.bytes_recv(name)) == (sent, recv),
                    what + f": counted {comm.stats.bytes_sent(name)}/{comm.stats.bytes_recv(name)}"
                    f", formula {sent}/{recv}")
            c.check(C.allreduce_bytes_sent(n, item, N, R) == sent, what + ": _sent")
if math.isfinite(threshold):
    c.check(seen == {"recursive_doubling", "ring"}, f"both algorithms used: {seen}")
else:
    c.check(seen == {"recursive_doubling"}, f"only recursive doubling on {N} rank(s): {seen}")

c.summary()
