"""Parameter server — сервер параметров — 参数服务器.

Li, Andersen, Park, Smola, Ahmed, Josifovski, Long, Shekita & Su 2014,
"Scaling Distributed Machine Learning with the Parameter Server", OSDI '14.
The five steps of data parallelism with a server:

1. the workers compute gradients on their rows of the global batch
   (:meth:`Worker.compute`);
2. they *push* them to the server (:meth:`Worker.push_pull`);
3. the server aggregates them (sums the b_r/B-weighted gradients:
   :func:`~minipar.parallel.data_parallel.ddp.local_batch`);
4. the server updates the parameters (:meth:`Server.update`: it alone holds
   the optimizer states);
5. the workers *pull* the new parameters (:meth:`Server.send_params`, received
   in :meth:`Worker.push_pull`).

(Some texts let the server send the *aggregated gradient* back and every
worker update its own copy; the bytes are the same, S each way per worker,
but then every worker also holds the optimizer states.  Here the server
updates, as in Li et al. 2014.)

Ranks: ranks ``0 .. servers-1`` are servers, the other W = world - servers
ranks are workers (worker w is rank ``servers + w``).  With several servers,
server k owns shard k of the flat parameter buffer (:func:`shard_span`,
``numpy.array_split`` order) and each worker pushes shard k of its gradients
to server k and pulls shard k of the parameters from it.  All ranks start
from the same ``init(seed)``, so nothing is sent before the first step.

**Synchronous** (:meth:`Server.sync_step`): the server waits for all W
gradients of a step, then updates: equal to the serial run (up to the order
of the additions).  Server 0 also sends each worker the step's global loss
(the pull's header).

**Asynchronous with bounded staleness s** (:meth:`Server.async_step`; Li et
al. 2014 §3.3 "bounded delay", Ho et al. 2013 "stale synchronous parallel"):
workers do not wait for each other.  The server takes each gradient *as it
arrives*, from whichever worker, adds it to the update being built and
applies the update once it holds W gradients (one step's worth); it answers
a worker's push with the current parameters as soon as that worker is at
most s steps ahead of the slowest one (a worker that has pushed k gradients
may compute step k only when every worker has pushed at least k - s).  Then
a gradient is applied at most 2s updates after the parameters it was
computed on (``max_delay``): they were at least version k - s, and no worker
can be past step k + s when it arrives.  s = 0 is the synchronous run
exactly; s > 0 lets fast workers run ahead on stale parameters: it still
converges, but no longer equals the serial run.

Formula the tests check, S = bytes of the (shard of the) parameters: per
step the server receives W x S (gradients) and sends W x S (parameters)
— ``minipar.plan.parameter_server_bytes_at_server(S, W)`` — while a worker
sends and receives S; a ring all-reduce rank sends 2(W-1)/W x S.  The
server's link carries W/2 times a ring rank's traffic: it is the bottleneck
that the ring (and sharded servers) remove.

The engine around it (options, the straggler, timings, state) is
:mod:`minipar.parallel.data_parallel.ps_engine`.
"""

from __future__ import annotations

from collections import defaultdict
from typing import Any

import numpy as np

from minipar import spans
from minipar.backend import xp
from minipar.comm.tags import PS_GRAD, PS_HEADER, PS_PARAM
from minipar.comm.traced import ANY_SOURCE
from minipar.optim import FlatParams
from minipar.precision import ModelStates

OP_PUSH, OP_PULL, OP_HEADER = "ps_push", "ps_pull", "ps_header"


def shard_span(size: int, servers: int, k: int) -> tuple[int, int]:
    """[lo, hi) of the flat buffer owned by server k of ``servers`` (array_split order,
    :func:`minipar.spans.span`)."""
    return spans.span(size, servers, k)


class Worker:
    """A worker: the whole flat ``params`` (pulled every step) and its gradient; no optimizer
    state.  ``spans[k]``: server k's range of the flat buffer; ``sync``: server 0 sends the
    step's global loss with the parameters."""

    def __init__(self, comm: Any, model: Any, layout: FlatParams, params: Any,
                 spans: list[tuple[int, int]], sync: bool) -> None:
        self.comm, self.model, self.layout, self.spans, self.sync = comm, model, layout, spans, sync
        self.params = params
        self.grads = xp.zeros_like(params)

    def compute(self, x: Any, y: Any, weight: float) -> float:
        """1. The gradient of b_w / B x the mean loss of its rows; returns b_w / B x loss."""
        loss, grads = self.model.loss_and_grads(self.layout.unflatten(self.params), x, y,
                                                loss_scale=weight)
        self.grads[...] = self.layout.flatten(grads)
        return weight * loss

    def push_pull(self, loss: float, clock: int) -> float:
        """2. Push shard k of the gradient to server k, after a header (``loss``, step
        ``clock``); 5. pull the new parameters.  The step's global loss (sync), NaN (async)."""
        c, header = self.comm, np.array([loss, float(clock)])
        reqs = []
        for k, (lo, hi) in enumerate(self.spans):
            with c.operation(OP_HEADER):
                reqs.append(c.Isend(header, k, PS_HEADER))
            with c.operation(OP_PUSH):
                reqs.append(c.Isend(self.grads[lo:hi], k, PS_GRAD))
        total = np.array([np.nan])
        if self.sync:  # the pull's header: the step's global loss, from server 0
            with c.operation(OP_HEADER):
                reqs.append(c.Irecv(total, 0, PS_HEADER))
        with c.operation(OP_PULL):
            reqs += [c.Irecv(self.params[lo:hi], k, PS_PARAM)
                     for k, (lo, hi) in enumerate(self.spans)]
            c.waitall(reqs)
        return float(total[0])


class Server:
    """Server ``comm.rank``: ``states``, the model states of its range of the flat buffer
    (params, grads, optimizer states), for W = ``workers`` workers (ranks ``servers`` ..);
    ``staleness`` s and ``steps`` (the run's length) for the asynchronous mode.
    ``loss_at[step]``: the workers' pushed losses summed (the step's global loss)."""

    def __init__(self, comm: Any, states: ModelStates, servers: int, workers: int, sync: bool,
                 staleness: int = 0, steps: int = 0) -> None:
        self.comm, self.states, self.servers, self.workers = comm, states, servers, workers
        self.sync, self.staleness, self.steps = sync, staleness, steps
        self.loss_at: dict[int, float] = defaultdict(float)
        self.max_delay = 0  # async: most updates applied between a pull and the push it led to
        self.restart(0)

    def restart(self, done: int) -> None:
        """Buffers and bookkeeping after ``done`` complete steps (every worker has pushed
        ``done`` gradients and holds the parameters of ``done`` updates)."""
        W = self.workers
        self.bufs = [xp.empty_like(self.states.grads) for _ in range(W if self.sync else 1)]
        self.pushed = [done] * W  # gradients received from each worker
        self.version_sent = [done] * W  # updates applied when each worker last got parameters
        self.updates = done
        self.acc = xp.zeros_like(self.states.grads)
        self.in_acc, self.waiting = 0, set()

    def receive_push(self, w: int, into: Any) -> float:
        """2. Worker ``w``'s header and shard of its gradient, into ``into``; its loss."""
        header = np.empty(2)
        with self.comm.operation(OP_HEADER):
            self.comm.Recv(header, self.servers + w, PS_HEADER)
        with self.comm.operation(OP_PUSH):
            self.comm.Recv(into, self.servers + w, PS_GRAD)
        self.loss_at[int(header[1])] += float(header[0])
        return float(header[0])

    def update(self, summed: Any) -> None:
        """3-4. The aggregated gradient, then the optimizer step on the server's range."""
        self.states.grads[...] = summed
        self.states.step()

    def send_params(self, workers: list[int], loss: float | None = None) -> None:
        """5. The range to ``workers``; with ``loss`` (sync, server 0) the step's loss first."""
        c, shard = self.comm, self.states.params
        reqs = []
        if loss is not None:
            total = np.array([loss])
            with c.operation(OP_HEADER):
                reqs += [c.Isend(total, self.servers + w, PS_HEADER) for w in workers]
        with c.operation(OP_PULL):
            reqs += [c.Isend(shard, self.servers + w, PS_PARAM) for w in workers]
            c.waitall(reqs)

    def sync_step(self) -> float:
        """One step: every worker's push in a fixed order (a deterministic sum), the update,
        the answers; the step's global loss."""
        bufs, step_loss = self.bufs, 0.0
        for w in range(self.workers):
            step_loss += self.receive_push(w, bufs[w])
        total = bufs[0].copy()
        for b in bufs[1:]:
            total += b
        self.update(total)
        self.send_params(list(range(self.workers)), step_loss if self.comm.rank == 0 else None)
        return step_loss

    def async_step(self, last: bool) -> None:
        """W pushes, from whoever pushes first (one step's worth of gradients): each joins
        the update being built; the update is applied at the W-th; a worker is answered as
        soon as it is at most ``staleness`` steps ahead of the slowest.  ``last``: then the
        workers still waiting get the final parameters."""
        W, s, buf = self.workers, self.staleness, self.bufs[0]
        for _ in range(W):
            status = self.comm.Probe(ANY_SOURCE, PS_HEADER)  # whoever pushes first
            w = status.Get_source() - self.servers
            self.receive_push(w, buf)
            self.max_delay = max(self.max_delay, self.updates - self.version_sent[w])
            self.acc += buf  # the gradient joins the update being built, as it arrives
            self.in_acc += 1
            self.pushed[w] += 1
            self.waiting.add(w)
            if self.in_acc == W:  # one step's worth of gradients: apply the update
                self.update(self.acc)
                self.acc[...] = 0
                self.in_acc, self.updates = 0, self.updates + 1
            slowest = min(self.pushed)
            ready = sorted(v for v in self.waiting
                           if self.pushed[v] < self.steps and self.pushed[v] - slowest <= s)
            for v in ready:
                self.version_sent[v] = self.updates
            self.send_params(ready)
            self.waiting.difference_update(ready)
        if last:
            self.send_params(sorted(self.waiting))  # the final parameters
            self.waiting.clear()
