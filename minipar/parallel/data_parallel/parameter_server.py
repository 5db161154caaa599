"""Parameter server — сервер параметров — 参数服务器.

Li, Andersen, Park, Smola, Ahmed, Josifovski, Long, Shekita & Su 2014,
"Scaling Distributed Machine Learning with the Parameter Server", OSDI '14.
The five steps of data parallelism with a server:

1. the workers compute gradients on their rows of the global batch;
2. they *push* them to the server;
3. the server aggregates them (sums the b_r/B-weighted gradients:
   :mod:`minipar.parallel.common`);
4. the server updates the parameters (it alone holds the optimizer states);
5. the workers *pull* the new parameters.

(Some texts — the seed text of this module among them — let the server send
the *aggregated gradient* back and every worker update its own copy; the
bytes are the same, S each way per worker, but then every worker also holds
the optimizer states.  Here the server updates, as in Li et al. 2014.)

Ranks: ranks ``0 .. servers-1`` are servers, the other W = world - servers
ranks are workers (worker w is rank ``servers + w``).  With several servers,
server k owns shard k of the flat parameter buffer (``numpy.array_split``
order) and each worker pushes shard k of its gradients to server k and pulls
shard k of the parameters from it.  All ranks start from the same
``init(seed)``, so nothing is sent before the first step.

**Synchronous** (``mode="sync"``): the server waits for all W gradients of a
step, then updates: equal to the serial run (up to the order of the additions).

**Asynchronous with bounded staleness s** (``mode="async"``; Li et al. 2014
§3.3 "bounded delay", Ho et al. 2013 "stale synchronous parallel"): workers
do not wait for each other.  The server takes each gradient *as it arrives*,
from whichever worker, adds it to the update being built and applies the
update once it holds W gradients (one step's worth); it answers a worker's
push with the current parameters as soon as that worker is at most s steps
ahead of the slowest one (a worker that has pushed k gradients may compute
step k only when every worker has pushed at least k - s).  Then a gradient
is applied at most 2s updates after the parameters it was computed on
(``max_delay``): they were at least version k - s, and no worker can be past
step k + s when it arrives.  s = 0 is the
synchronous run exactly; s > 0 lets fast workers run ahead on stale
parameters: it still converges, but no longer equals the serial run.

Formula the tests check, S = bytes of the (shard of the) parameters: per
step the server receives W x S (gradients) and sends W x S (parameters)
— ``minipar.plan.parameter_server_bytes_at_server(S, W)`` — while a worker
sends and receives S; a ring all-reduce rank sends 2(W-1)/W x S.  The
server's link carries W/2 times a ring rank's traffic: it is the bottleneck
that the ring (and sharded servers) remove.
"""

from __future__ import annotations

from collections import defaultdict
from typing import Any

import numpy as np

from minipar import spans
from minipar.comm.tags import PS_GRAD, PS_HEADER, PS_PARAM
from minipar.comm.traced import ANY_SOURCE, TracedComm, traced
from minipar.nn import GPT
from minipar.optim import FlatParams
from minipar.parallel.common import RunSpec, check_world, local_rows, loss_weight
from minipar.precision import ModelStates

MODES = ("sync", "async")
OP_PUSH, OP_PULL, OP_HEADER = "ps_push", "ps_pull", "ps_header"
TAG_HEADER, TAG_GRAD, TAG_PARAM = PS_HEADER, PS_GRAD, PS_PARAM  # minipar.comm.tags


def shard_span(size: int, servers: int, k: int) -> tuple[int, int]:
    """[lo, hi) of the flat buffer owned by server k of ``servers`` (array_split order,
    :func:`minipar.spans.span`)."""
    return spans.span(size, servers, k)


class ParameterServer:
    """One rank of a parameter-server job: a server (rank < ``servers``) or a worker.

    ``train()`` runs ``spec.steps`` steps and returns the losses per step on
    the servers (the sum of the workers' weighted losses) and ``None`` on workers.
    """

    def __init__(self, comm: Any, spec: RunSpec, servers: int = 1, mode: str = "sync",
                 staleness: int = 0, straggler_s: float = 0.0) -> None:
        self.comm: TracedComm = traced(comm)
        world = self.comm.size
        if mode not in MODES:
            raise ValueError(f"unknown parameter-server mode {mode!r}; one of {', '.join(MODES)}")
        if not isinstance(servers, (int, np.integer)) or servers < 1:
            raise ValueError(f"need at least one server rank, got servers={servers!r}")
        if world < servers + 1:
            raise ValueError(f"a parameter server needs {servers} server rank(s) and at least one "
                             f"worker: {servers + 1} ranks or more, got {world}")
        if not isinstance(staleness, (int, np.integer)) or staleness < 0:
            raise ValueError(f"staleness must be an integer >= 0, got {staleness!r}")
        if spec.precision == "mixed-fp16":
            raise ValueError("the parameter server supports float64, float32 and mixed (bf16); "
                             "mixed-fp16's dynamic loss scaling would need every shard to agree "
                             "on overflow")
        if straggler_s < 0:
            raise ValueError(f"straggler delay must be >= 0 seconds, got {straggler_s}")
        self.workers = world - servers
        check_world(spec.batch, self.workers)
        self.spec, self.servers, self.mode, self.staleness = spec, int(servers), mode, int(staleness)
        self.straggler_s = float(straggler_s)
        self.rank = self.comm.rank
        self.is_server = self.rank < servers
        init = spec.initial_params()
        self.layout = FlatParams.like(init)
        flat = self.layout.flatten(init)
        self.spans = [shard_span(self.layout.size, servers, k) for k in range(servers)]
        self.max_delay = 0  # async: most updates applied between a pull and the push it led to
        if self.is_server:
            self.lo, self.hi = self.spans[self.rank]
            # the server's model states: its shard of params, grads and optimizer states
            self.states = ModelStates(spec.precision, {"shard": flat[self.lo:self.hi]},
                                      spec.optimizer, **spec.opt_kwargs())
        else:
            self.worker = self.rank - servers
            self.model: GPT = spec.model()
            dt = self.model.cfg.dtype
            self.params = flat.astype(dt)
            self.grads = np.zeros_like(self.params)
            self.weight = loss_weight(spec.batch, self.worker, self.workers)
            self.rows = local_rows(spec.batch, self.worker, self.workers)

    # -- worker ------------------------------------------------------------------------
    def _worker_step(self, step: int) -> None:
        import time

        c = self.comm
        x, y = self.spec.local_batch(step, self.worker, self.workers)
        loss, grads = self.model.loss_and_grads(self.layout.unflatten(self.params), x, y,
                                                loss_scale=self.weight)
        if self.straggler_s and self.worker == 0:
            time.sleep(self.straggler_s)  # a slow worker (the notebook's straggler)
        self.grads[...] = self.layout.flatten(grads)
        header = np.array([self.weight * loss, float(step)])
        reqs = []
        for k, (lo, hi) in enumerate(self.spans):
            with c.operation(OP_HEADER):
                reqs.append(c.Isend(header, k, TAG_HEADER))
            with c.operation(OP_PUSH):
                reqs.append(c.Isend(self.grads[lo:hi], k, TAG_GRAD))
        with c.operation(OP_PULL):
            reqs += [c.Irecv(self.params[lo:hi], k, TAG_PARAM) for k, (lo, hi) in enumerate(self.spans)]
            c.waitall(reqs)

    # -- server ------------------------------------------------------------------------
    def _receive_push(self, source: int, into: np.ndarray) -> tuple[float, int]:
        header = np.empty(2)
        with self.comm.operation(OP_HEADER):
            self.comm.Recv(header, source, TAG_HEADER)
        with self.comm.operation(OP_PUSH):
            self.comm.Recv(into, source, TAG_GRAD)
        return float(header[0]), int(header[1])

    def _send_params(self, workers: list[int]) -> None:
        shard = self.states.params
        with self.comm.operation(OP_PULL):
            self.comm.waitall([self.comm.Isend(shard, self.servers + w, TAG_PARAM) for w in workers])

    def _apply(self, summed: np.ndarray) -> None:
        self.states.grads[...] = summed
        self.states.step()

    def _server_sync(self) -> list[float]:
        losses = []
        bufs = [np.empty_like(self.states.grads) for _ in range(self.workers)]
        for _ in range(self.spec.steps):
            step_loss = 0.0
            for w in range(self.workers):  # fixed worker order: a deterministic sum
                step_loss += self._receive_push(self.servers + w, bufs[w])[0]
            total = bufs[0].copy()
            for b in bufs[1:]:
                total += b
            self._apply(total)
            self._send_params(list(range(self.workers)))
            losses.append(step_loss)
        return losses

    def _server_async(self) -> list[float]:
        W, steps, s = self.workers, self.spec.steps, self.staleness
        pushed = [0] * W  # gradients received from each worker
        version_sent = [0] * W  # updates applied when each worker last got parameters
        loss_at = defaultdict(float)
        acc = np.zeros_like(self.states.grads)
        in_acc, updates, waiting = 0, 0, set()
        buf = np.empty_like(acc)
        for _ in range(steps * W):
            status = self.comm.Probe(ANY_SOURCE, TAG_HEADER)  # whoever pushes first
            w = status.Get_source() - self.servers
            loss, clock = self._receive_push(w + self.servers, buf)
            self.max_delay = max(self.max_delay, updates - version_sent[w])
            loss_at[clock] += loss
            acc += buf  # the gradient joins the update being built, as it arrives
            in_acc += 1
            pushed[w] += 1
            waiting.add(w)
            if in_acc == W:  # one step's worth of gradients: apply the update
                self._apply(acc)
                acc[...] = 0
                in_acc, updates = 0, updates + 1
            slowest = min(pushed)
            ready = sorted(v for v in waiting if pushed[v] < steps and pushed[v] - slowest <= s)
            for v in ready:
                version_sent[v] = updates
            self._send_params(ready)
            waiting.difference_update(ready)
        self._send_params(sorted(waiting))  # the final parameters
        return [loss_at[k] for k in range(steps)]

    # -- both --------------------------------------------------------------------------
    def train(self) -> list[float] | None:
        """Run ``spec.steps`` steps; the per-step losses on servers, None on workers."""
        if self.is_server:
            return self._server_sync() if self.mode == "sync" else self._server_async()
        for step in range(self.spec.steps):
            self._worker_step(step)
        return None

    def model_state_bytes(self) -> int:
        """Bytes this rank holds: a server its shard's params, grads and optimizer states;
        a worker the full params and grads (no optimizer states)."""
        if self.is_server:
            return sum(self.states.bytes_by_category().values())
        return int(self.params.nbytes + self.grads.nbytes)

    def bytes_per_step(self) -> tuple[float, float]:
        """(sent, received) per step by this rank: gradients pushed and parameters pulled."""
        st, n = self.comm.stats, self.spec.steps
        return ((st.bytes_sent(OP_PUSH) + st.bytes_sent(OP_PULL)) / n,
                (st.bytes_recv(OP_PUSH) + st.bytes_recv(OP_PULL)) / n)
