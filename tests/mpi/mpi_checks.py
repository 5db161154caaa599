"""What every rank-side test script shares: count checks, collect failures, one summary.

    from mpi_checks import Checks
    c = Checks("TP")                 # the summary line starts with "TP-SUMMARY"
    c.check(ok, "what was checked")
    c.close(a, b, "what", tol=1e-12)              # |a - b| <= 1e-12 everywhere
    c.close(a, b, "what", tol=1e-14, rtol=1e-11)  # |a - b| <= 1e-14 + 1e-11·|b|
    c.summary()                      # rank 0 prints "TP-SUMMARY N=4 checks=120 failures=0"
    c.summary(grids=7)               # "TOPO-SUMMARY N=4 grids=7 checks=.. failures=.."

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

    def close(self, a: Any, b: Any, what: str, tol: float = 1e-12, rtol: float = 0.0) -> None:
        """ok iff the shapes are equal and |a - b| <= tol + rtol·|b| everywhere (NumPy's
        ``allclose(a, b, rtol, atol=tol)`` without its broadcasting; NaN and inf fail)."""
        a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
        if a.shape != b.shape:
            self.check(False, f"{what}: shape {a.shape} vs {b.shape}")
            return
        gap = np.abs(a - b)
        ok = bool(np.all(gap <= tol + rtol * np.abs(b)))
        worst = float(gap.max()) if a.size else 0.0
        bound = f"{tol:g}" + (f" + {rtol:g}·|b|" if rtol else "")
        self.check(ok, f"{what}: max |diff| {worst:.3g} > {bound}")

    def summary(self, **fields: Any) -> None:
        """Rank 0 prints the summary line (``fields`` after N=) and the first failures;
        exit 1 on any."""
        everyone = self.comm.gather((self.checks, self.failures), root=0)
        if self.rank == 0:
            checks = sum(c for c, _ in everyone)
            flat = [f for _, fs in everyone for f in fs]
            extra = "".join(f" {k}={v}" for k, v in fields.items())
            print(f"{self.tag}-SUMMARY N={self.size}{extra} checks={checks} "
                  f"failures={len(flat)}", flush=True)
            for f in flat[:30]:
                print("  ", f, flush=True)
            if flat:
                raise SystemExit(1)
