"""Communication: the traced communicator and (later) the rank grid.

``from minipar.comm import TracedComm, traced, DeadlockError``
"""

from minipar.comm.traced import (
    CommUsageError,
    DeadlockError,
    OpStats,
    Stats,
    TracedComm,
    TracedRequest,
    traced,
)

__all__ = [
    "CommUsageError",
    "DeadlockError",
    "OpStats",
    "Stats",
    "TracedComm",
    "TracedRequest",
    "traced",
]
