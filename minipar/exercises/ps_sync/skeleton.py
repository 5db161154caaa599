"""Exercise: one step of a synchronous parameter server, written by you from Send/Recv.

EN parameter server · RU сервер параметров · ZH 参数服务器

Grade it (4 ranks by default; at least 2: a server and a worker):

    minipar exercise check ps_sync ps_sync.py -n 4

THE SETTING (Li et al. 2014, "Scaling Distributed Machine Learning with the
Parameter Server", OSDI '14)
    Rank 0 is the SERVER; ranks 1 .. N-1 are the W = N-1 WORKERS.  Every
    rank holds the current parameters ``params`` (the same everywhere).  A
    worker has computed x, the gradient of its mini-batch; on the server x
    is only a template (zeros, unused).  The server alone holds the
    optimizer's state: ``state = {"v": momentum buffer}`` on rank 0, None
    on the workers.

THE GOAL
    One synchronous step, returned as a NEW array on every rank:

        g = (x_1 + ... + x_W) / W          the mean of the workers' gradients
        v = momentum * v + g               (state["v"], updated IN PLACE)
        params_new = params - lr * v       (heavy-ball SGD)

    PUSH: every worker sends its gradient to the server.
    PULL: every worker receives params_new from the server, once the
    server has updated.  Leave x and params untouched.

WHAT THE GRADER MEASURES
    * The result, against this step computed serially, for lengths 1, N+1,
      1000, 1001, two steps each (the second continues from the momentum
      your first step left in state["v"]).
    * The traffic, counted by minipar's TracedComm, S = params.nbytes: the
      server receives W x S and sends W x S; each worker sends S and
      receives S; messages only between the server and the workers.
    * No MPI collectives (comm.Bcast, comm.Reduce, comm.gather ...).
    Stuck?  minipar exercise hint ps_sync   (level 1, 2, 3)

WHICH MPI CALLS TO USE (mpi4py's upper-case buffer API, numpy arrays)
    comm.Get_rank(), comm.Get_size()
    comm.Send(buf, dest=...)      comm.Recv(buf, source=...)
    np.empty_like(params) makes a receive buffer of the right size and dtype.
"""

# ruff: noqa: F841  (the names set up below are yours to use)
from __future__ import annotations

import numpy as np


def ps_sync_step(comm, x: np.ndarray, params: np.ndarray, state: dict | None,
                 lr: float = 0.1, momentum: float = 0.9) -> np.ndarray:
    """The new parameters on every rank after one synchronous parameter-server step."""
    n, r = comm.Get_size(), comm.Get_rank()
    server, workers = 0, range(1, n)

    # TODO 1 (a worker): push x to the server, then pull the new parameters

    # TODO 2 (the server): gather the W gradients, average, update v and params, send

    raise NotImplementedError("TODO: push the gradient, update on the server, pull")
