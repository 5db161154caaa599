"""Communication: the traced communicator, its counters, the tag registry, the rank grid.

``from minipar.comm import TracedComm, DeadlockError, install_excepthook``; the function
``minipar.comm.traced.traced`` (wrap a plain communicator once) lives in its module
only, so ``minipar.comm.traced`` is the module.

* :mod:`minipar.comm.traced`: the communicator wrapper (counts, waits, names);
* :mod:`minipar.comm.stats`: the counters it keeps (by operation, communicator, peer);
* :mod:`minipar.comm.staging`: the device boundary (device buffers staged through host memory);
* :mod:`minipar.comm.waiting`: polite waiting, the watchdog, the mismatch guard;
* :mod:`minipar.comm.tags`: which MPI tags each part of minipar uses;
* :mod:`minipar.comm.errors`: the errors, said in words a learner can act on;
* :mod:`minipar.comm.topology`: the rank grid (one communicator per axis).
"""

from minipar.comm.errors import (
    CollectiveMismatchError,
    CommUsageError,
    DeadlockError,
    install_excepthook,
)
from minipar.comm.stats import OpStats, Stats
from minipar.comm.traced import TracedComm
from minipar.comm.waiting import TracedRequest

__all__ = [
    "CollectiveMismatchError",
    "CommUsageError",
    "DeadlockError",
    "OpStats",
    "Stats",
    "TracedComm",
    "TracedRequest",
    "install_excepthook",
]
