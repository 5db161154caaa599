"""Zero-bubble pipelines (Qi et al. 2023, arXiv 2401.10241) run for real on MPI ranks.

Each world size is ONE launch of tests/mpi/zb_check.py: ZB-H1, ZB-H2 and ZB-V on p = N
stages (N = 2, 3, 4) for m = 1..8 equal the serial run (float64, the shared parity verdict), with
remat, a mixture of experts and (4 ranks) dp 2 x pp 2; the bytes kept only for W are
counted; and (N = 2, 4) every tensor-, context- and expert-parallel unit's B then W is
its backward, bit for bit.  (Tensor parallelism inside the stages, sequence parallelism
and ZeRO-1 with zb-h1, zb-h2, zb-v on 8 ranks: tests/mpi/hybrid_check.py.)
"""

from __future__ import annotations

from pathlib import Path

import pytest

from minipar import launch

MPI_DIR = Path(__file__).parent / "mpi"


@pytest.mark.parametrize("n", [2, 3, 4])
def test_zero_bubble_parity_and_the_split_units_on_n_ranks(n: int) -> None:
    proc = launch.run(n, str(MPI_DIR / "zb_check.py"), timeout=300,
                      env={"MINIPAR_WATCHDOG_S": "90"})
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    line = [ln for ln in proc.stdout.splitlines() if ln.startswith("ZB-SUMMARY")]
    assert line, proc.stdout
    fields = dict(kv.split("=") for kv in line[0].split()[1:])
    assert fields["N"] == str(n) and fields["failures"] == "0"
    assert int(fields["runs"]) >= (29 if n < 4 else 32)
