"""Communication: the traced communicator and (later) the rank grid.

``from minipar.comm import TracedComm, traced, DeadlockError, install_excepthook``
"""

from minipar.comm.traced import (
    CommUsageError,
    DeadlockError,
    OpStats,
    Stats,
    TracedComm,
    TracedRequest,
    install_excepthook,
    traced,
)

__all__ = [
    "CommUsageError",
    "DeadlockError",
    "OpStats",
    "Stats",
    "TracedComm",
    "TracedRequest",
    "install_excepthook",
    "traced",
]
