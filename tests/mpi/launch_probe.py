"""Rank side of tests/test_launch.py: note what a launch might leave behind, then misbehave.

``launch_probe.py MODE OUT``: every rank writes into OUT the MPICH hardware-map
files its process manager holds open (``/tmp/hydra_hwloc_xmlfile_*``, read
from ``/proc/PPID/fd``) and the temporary file it creates itself
(``tempfile.mkstemp``), waits for the others, then MODE decides: ``ok``
(prints this rank's environment variable MINIPAR_PROBE), ``raise`` (rank 1
raises), ``kill`` (rank 1 sends itself SIGKILL, as the kernel's OOM killer
would), ``exit`` (rank 1 calls ``sys.exit(3)``), ``sleep`` (every rank sleeps:
for the timeout).
"""

import os
import signal
import sys
import tempfile
import time
from pathlib import Path

from mpi4py import MPI

mode, out = sys.argv[1], Path(sys.argv[2])
world = MPI.COMM_WORLD
rank = world.Get_rank()
try:
    fds = Path(f"/proc/{os.getppid()}/fd")
    held = [os.readlink(f) for f in fds.iterdir()]
except OSError:
    held = []
fd, mine = tempfile.mkstemp(prefix="rank-file-")
os.close(fd)
lines = [f for f in held if f.startswith("/tmp/hydra_hwloc_xmlfile_")] + [mine]
(out / f"left.{rank}").write_text("\n".join(lines) + "\n")
world.Barrier()
if mode == "ok":
    print(f"rank {rank} MINIPAR_PROBE={os.environ.get('MINIPAR_PROBE')}", flush=True)
elif mode == "sleep":
    time.sleep(120)
elif rank == 1 and mode == "raise":
    raise RuntimeError("deliberate failure on rank 1")
elif rank == 1 and mode == "kill":
    os.kill(os.getpid(), signal.SIGKILL)
elif rank == 1 and mode == "exit":
    sys.exit(3)
else:
    time.sleep(30)  # the others wait until the job is ended for them
