"""What goes wrong between ranks, said in words a learner can act on.

EN communication errors · RU ошибки обмена сообщениями · ZH 通信错误

* :class:`DeadlockError`: a wait outlived the watchdog (no matching message).
* :class:`CollectiveMismatchError`: ranks called different collectives, or
  the same one with another length, dtype or op.
* :class:`CommUsageError`: a buffer or argument that cannot be communicated.
* :func:`install_excepthook`: an unhandled exception on one rank first says
  ``[minipar] rank R of N failed``, then ``python -m mpi4py`` aborts the job.
"""

from __future__ import annotations

import sys
from typing import Any

from mpi4py import MPI


class DeadlockError(RuntimeError):
    """A wait exceeded the watchdog timeout: no matching message arrived."""


class CommUsageError(ValueError):
    """A buffer or argument that cannot be communicated (e.g. non-contiguous)."""


class CollectiveMismatchError(ValueError):
    """Ranks called a collective with different lengths, dtypes, ops or collectives."""


def failed_line(value: BaseException) -> str:
    """``[minipar] rank R of N failed: Type: message``, the line the launcher reports."""
    world = MPI.COMM_WORLD
    return (f"[minipar] rank {world.Get_rank()} of {world.Get_size()} failed: "
            f"{type(value).__name__}: {value}")


def install_excepthook() -> None:
    """Make an unhandled exception on a rank say which rank failed, then abort.

    Under ``python -m mpi4py`` an unhandled exception aborts the whole job
    (MPICH then prints ``rank R in comm 0``); this hook first prints
    ``[minipar] rank R of N failed: Type: message`` on stderr, above the
    traceback, so a learner sees at once which rank broke and why the others
    stopped.  Idempotent; TracedComm installs it when the world has > 1 rank.
    """
    previous = sys.excepthook
    if getattr(previous, "_minipar", False):
        return

    def hook(kind: type[BaseException], value: BaseException, tb: Any) -> None:
        sys.stderr.write(
            f"{failed_line(value)}\n[minipar] the whole job is aborted "
            "(python -m mpi4py calls MPI_Abort); the traceback of that rank follows.\n"
        )
        previous(kind, value, tb)

    hook._minipar = True  # type: ignore[attr-defined]
    sys.excepthook = hook
