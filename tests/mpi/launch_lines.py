"""Rank side of tests/test_launch.py: many lines from every rank, each printed in pieces.

``launch_lines.py COUNT MODE``: every rank prints COUNT lines
``rank R of N line I payload ... end``, each ``print`` given several arguments
(unbuffered, that is several ``write`` calls: the pieces of different ranks
would mix mid-line).  MODE ``ok`` ends there; ``crash``: rank 1 then prints
``last words of rank 1`` with no newline and raises while the others wait, so
MPI ends the job (``MPI_Abort``) with that text still in rank 1's buffer.
"""

import sys

from mpi4py import MPI

count, mode = int(sys.argv[1]), sys.argv[2]
world = MPI.COMM_WORLD
r, n = world.Get_rank(), world.Get_size()
world.Barrier()  # all ranks print at the same time
for i in range(count):
    print("rank", r, "of", n, "line", i, "payload", "abcdefghij" * (i % 7), "end")
if mode == "crash":
    if r == 1:
        print("last words of rank", r, end="")
        raise RuntimeError("deliberate failure after printing")
    world.Barrier()  # never passes: rank 1 raised; the abort ends the wait
