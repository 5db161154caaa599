"""What every rank-side test script shares: count checks, collect failures, one summary.

    from mpi_checks import Checks
    c = Checks("TP")                 # the summary line starts with "TP-SUMMARY"
    c.check(ok, "what was checked")
    c.close(a, b, "what", tol=1e-12)
    c.summary()                      # rank 0 prints "TP-SUMMARY N=4 checks=120 failures=0"

The test side reads the line with :func:`summary_of` (tests/conftest.py).
"""

from __future__ import annotations

from typing import Any

import numpy as np
from mpi4py import MPI


class Checks:
    def __init__(self, tag: str, comm: Any = None) -> None:
        self.tag, self.comm = tag, comm or MPI.COMM_WORLD
        self.rank, self.size = self.comm.Get_rank(), self.comm.Get_size()
        self.checks, self.failures = 0, []

    def check(self, ok: bool, what: str) -> None:
        self.checks += 1
        if not ok:
            self.failures.append(f"rank {self.rank}: {what}")

    def close(self, a: Any, b: Any, what: str, tol: float = 1e-12) -> None:
        a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
        gap = float(np.abs(a - b).max()) if a.size else 0.0
        self.check(a.shape == b.shape and gap <= tol, f"{what}: max |diff| {gap:.3g} > {tol:g}")

    def summary(self) -> None:
        """Rank 0 prints the summary line and the first failures; exit 1 on any."""
        everyone = self.comm.gather((self.checks, self.failures), root=0)
        if self.rank == 0:
            checks = sum(c for c, _ in everyone)
            flat = [f for _, fs in everyone for f in fs]
            print(f"{self.tag}-SUMMARY N={self.size} checks={checks} failures={len(flat)}",
                  flush=True)
            for f in flat[:30]:
                print("  ", f, flush=True)
            if flat:
                raise SystemExit(1)
