"""Every strategy behind one interface: tests/mpi/strategies_check.py, one launch per world
size (a matrix of cases inside each launch: a launch costs 0.7-2.9 s here)."""

from __future__ import annotations

import pytest
from conftest import MPI_DIR, summary_of

from minipar import launch
from minipar.parallel import strategies


@pytest.mark.parametrize("n", [1, 2, 4, 8])
def test_every_strategy_steps_saves_loads_and_equals_the_serial_run(n: int) -> None:
    proc = launch.run(n, str(MPI_DIR / "strategies_check.py"), timeout=600,
                      env={"MINIPAR_WATCHDOG_S": "120"})
    fields = summary_of(proc, "STRATEGIES")
    assert fields["failures"] == "0" and int(fields["checks"]) > 0


def _digests(backend: str) -> dict[str, str]:
    proc = launch.run(4, str(MPI_DIR / "strategies_check.py"), timeout=600,
                      env={"MINIPAR_WATCHDOG_S": "120", "MINIPAR_CASES": "first",
                           "MINIPAR_BACKEND": backend})
    fields = summary_of(proc, "STRATEGIES")
    assert fields["failures"] == "0" and int(fields["checks"]) > 0
    return dict(line.split(" ", 2)[1:] for line in proc.stdout.splitlines()
                if line.startswith("DIGEST "))


def test_every_strategy_on_the_device_stand_in_equals_numpy_to_the_bit() -> None:
    """One case per strategy on 4 ranks under ``MINIPAR_BACKEND=strict`` (CuPy's rules on
    NumPy: no NumPy call on a device array, messages staged through host memory and
    counted): it passes every check of the engine interface, and its final parameters
    are those of the same case on NumPy, to the bit (float64)."""
    strict, numpy = _digests("strict"), _digests("numpy")
    assert set(k.split("{")[0] for k in numpy) == set(strategies.STRATEGIES)
    assert strict == numpy


def test_an_unknown_strategy_is_named() -> None:
    with pytest.raises(ValueError, match="strategy must be one of serial, dp, .*; got 'nope'"):
        strategies.build("nope", None)
