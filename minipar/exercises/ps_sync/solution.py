"""Reference solution: one synchronous parameter-server step, push then pull.

EN parameter server · RU сервер параметров · ZH 参数服务器

Li et al. 2014 ("Scaling Distributed Machine Learning with the Parameter
Server", OSDI '14): rank 0 is the server, ranks 1..N-1 the W = N-1 workers.
Each worker *pushes* its gradient to the server; the server averages the W
gradients, updates the parameters with the momentum buffer only it holds
(heavy-ball SGD: v = μ·v + g, p = p - lr·v), and each worker *pulls* the new
parameters.  Per step the server receives W x S bytes and sends W x S; a
worker sends S and receives S, and talks to nobody but the server.

Self-contained on purpose: this is what the learner writes, so it does not
use :mod:`minipar.collectives` or :mod:`minipar.parallel.data_parallel.parameter_server`.
"""

from __future__ import annotations

from typing import Any

import numpy as np

SERVER = 0


def ps_sync_step(comm: Any, x: np.ndarray, params: np.ndarray, state: dict | None,
                 lr: float = 0.1, momentum: float = 0.9) -> np.ndarray:
    """The new parameters on every rank after one synchronous server step.

    ``x``: this worker's gradient (ignored on the server); ``params``: the
    current parameters (the same on every rank); ``state``: the server's
    ``{"v": momentum buffer}``, updated in place (None on the workers)."""
    n, r = comm.Get_size(), comm.Get_rank()
    if r != SERVER:
        comm.Send(x, dest=SERVER)  # push
        new = np.empty_like(params)
        comm.Recv(new, source=SERVER)  # pull: only after the server updated
        return new
    total = np.zeros_like(params)
    buf = np.empty_like(params)
    for worker in range(1, n):
        comm.Recv(buf, source=worker)
        total += buf
    v = state["v"]
    v *= momentum
    v += total / (n - 1)  # the mean over the W = N-1 workers
    new = params - lr * v
    for worker in range(1, n):
        comm.Send(new, dest=worker)
    return new
