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

**The engine** (:class:`~minipar.parallel.engine.Engine`).  Every rank calls
``step(batch)`` once per step: a worker cuts its rows of the global batch,
pushes and pulls; a server receives one step's pushes (W of them), updates
and answers.  Synchronous: server 0 also sends each worker the step's global
loss (one float64 under ``ps_header``: the pull's header), so every rank's
``StepResult.loss`` is the global loss.  Asynchronous: a step's loss is only
complete once every worker has pushed it, long after a fast worker's step
returned, so ``StepResult.loss`` is NaN on every rank and
:meth:`ParameterServer.pushed_losses` gives the per-step losses on the servers
(complete after the run); the run is ``spec.steps`` steps long (the last
pushes are answered with the final parameters).  Who holds what
(:meth:`ParameterServer.state_dict`): server k its flat range of the
parameters and optimizer states, one :class:`~minipar.parallel.engine.Shard`
per tensor it overlaps (replica 0: what a checkpoint saves); a worker the
whole parameters, replica = 1 + its index (never saved), no optimizer state.
``full_params()`` broadcasts worker 0's copy (equal to the servers' after the
pull) to every rank.

Formula the tests check, S = bytes of the (shard of the) parameters: per
step the server receives W x S (gradients) and sends W x S (parameters)
— ``minipar.plan.parameter_server_bytes_at_server(S, W)`` — while a worker
sends and receives S; a ring all-reduce rank sends 2(W-1)/W x S.  The
server's link carries W/2 times a ring rank's traffic: it is the bottleneck
that the ring (and sharded servers) remove.
"""

from __future__ import annotations

import time
from collections import defaultdict
from typing import Any

import numpy as np

from minipar import checks, spans
from minipar.backend import xp
from minipar.collectives import allreduce, broadcast
from minipar.comm.tags import PS_GRAD, PS_HEADER, PS_PARAM
from minipar.comm.topology import Grid, require_grid
from minipar.comm.traced import ANY_SOURCE, TracedComm
from minipar.nn import GPT
from minipar.optim import FlatParams
from minipar.parallel.common import RunSpec, check_world, local_rows
from minipar.parallel.engine import (
    AxisTraffic,
    Batch,
    Shard,
    State,
    StepResult,
    flat_pieces,
    load_pieces,
    load_scalars,
    memory_of,
    model_states,
    saved_step,
    sources_of,
    whole,
)
from minipar.precision import ModelStates

MODES = ("sync", "async")
#: the keyword options of :class:`ParameterServer` (``strategies.build("ps", spec, grid, **options)``)
OPTIONS = ("servers", "mode", "staleness", "straggler_s")
OP_PUSH, OP_PULL, OP_HEADER = "ps_push", "ps_pull", "ps_header"
OP_EVAL = "ps_eval_allreduce"  # evaluate: the workers' weighted losses summed
TAG_HEADER, TAG_GRAD, TAG_PARAM = PS_HEADER, PS_GRAD, PS_PARAM  # minipar.comm.tags


def shard_span(size: int, servers: int, k: int) -> tuple[int, int]:
    """[lo, hi) of the flat buffer owned by server k of ``servers`` (array_split order,
    :func:`minipar.spans.span`)."""
    return spans.span(size, servers, k)


class ParameterServer:
    """One rank of a parameter-server job: a server (rank < ``servers``) or a worker, an
    :class:`~minipar.parallel.engine.Engine` (the module text says who holds what).

    ``grid``: a :class:`~minipar.comm.topology.Grid` of dp ranks only, the messages on
    ``grid.comm("dp")``; ``servers``: server ranks (each owns a flat range);
    ``mode``: ``"sync"`` or ``"async"``; ``staleness``: async only, steps a worker may
    run ahead of the slowest; ``straggler_s``: worker 0 sleeps this long per step.
    Every argument is checked on every rank before any message.
    """

    def __init__(self, grid: Grid, spec: RunSpec, servers: int = 1, mode: str = "sync",
                 staleness: int = 0, straggler_s: float = 0.0) -> None:
        require_grid(grid, "the parameter server", ("dp",))
        self.grid = grid
        self.comm: TracedComm = grid.comm("dp")
        world = self.comm.size
        checks.one_of("the parameter-server mode", mode, MODES)
        checks.integer("servers", servers, 1)
        if world < servers + 1:
            raise ValueError(f"a parameter server needs {servers} server rank(s) and at least one "
                             f"worker: {servers + 1} ranks or more, got {world}")
        checks.integer("staleness", staleness, 0)
        if spec.precision == "mixed-fp16":
            raise ValueError("the parameter server supports float64, float32 and mixed (bf16); "
                             "mixed-fp16's dynamic loss scaling would need every shard to agree "
                             "on overflow")
        if straggler_s < 0:
            raise ValueError(f"straggler delay must be >= 0 seconds, got {straggler_s}")
        self.workers = world - servers
        check_world(spec.batch, self.workers)
        if spec.experts and spec.routing not in ((), (self.workers,)):
            raise ValueError(f"the parameter server routes each of its {self.workers} workers' "
                             f"rows as one MoE group: routing must be () or ({self.workers},), "
                             f"got {spec.routing}")
        self.spec, self.servers, self.mode, self.staleness = spec, int(servers), mode, int(staleness)
        self.straggler_s = float(straggler_s)
        self.rank = self.comm.rank
        self.is_server = self.rank < servers
        init = spec.initial_params()
        self.layout = FlatParams.like(init)
        flat = self.layout.flatten(init)
        self.spans = [shard_span(self.layout.size, servers, k) for k in range(servers)]
        self.max_delay = 0  # async: most updates applied between a pull and the push it led to
        self.steps_done = 0
        #: a worker's measured seconds (perf_counter): computing its gradient (the straggler's
        #: sleep included) and waiting for the pull, and the steps it ran (``minipar run ps``)
        self.timings = {"computing_s": 0.0, "waiting_s": 0.0, "steps": 0}
        self._traffic = AxisTraffic(grid)
        if self.is_server:
            self.lo, self.hi = self.spans[self.rank]
            # the server's model states: its shard of params, grads and optimizer states
            self.states = ModelStates(spec.precision, {"shard": flat[self.lo:self.hi]},
                                      spec.optimizer, **spec.opt_kwargs())
            self.loss_at: dict[int, float] = defaultdict(float)  # step -> pushed losses summed
            self._restart(0)
        else:
            self.worker = self.rank - servers
            self.model: GPT = spec.model()
            dt = self.model.cfg.dtype
            self.params = flat.astype(dt)
            self.grads = xp.zeros_like(self.params)

    # -- worker ------------------------------------------------------------------------
    def local_batch(self, batch: Batch) -> tuple[Any, Any, float]:
        """This worker's rows of the global ``batch`` (:func:`~minipar.parallel.common.local_rows`
        over the W workers) and their weight b_w / B."""
        lo, hi = local_rows(batch.size, self.worker, self.workers)
        # copies: a view would hold the whole batch (and remat's ledger counts what is held)
        return batch.tokens[lo:hi].copy(), batch.targets[lo:hi].copy(), (hi - lo) / batch.size

    def _worker_step(self, batch: Batch) -> float:
        c = self.comm
        x, y, weight = self.local_batch(batch)
        t0 = time.perf_counter()
        loss, grads = self.model.loss_and_grads(self.layout.unflatten(self.params), x, y,
                                                loss_scale=weight)
        if self.straggler_s and self.worker == 0:
            time.sleep(self.straggler_s)  # a slow worker (the notebook's straggler)
        self.grads[...] = self.layout.flatten(grads)
        t1 = time.perf_counter()
        header = np.array([weight * loss, float(batch.step)])
        reqs = []
        for k, (lo, hi) in enumerate(self.spans):
            with c.operation(OP_HEADER):
                reqs.append(c.Isend(header, k, TAG_HEADER))
            with c.operation(OP_PUSH):
                reqs.append(c.Isend(self.grads[lo:hi], k, TAG_GRAD))
        total = np.array([np.nan])
        if self.mode == "sync":  # the pull's header: the step's global loss, from server 0
            with c.operation(OP_HEADER):
                reqs.append(c.Irecv(total, 0, TAG_HEADER))
        with c.operation(OP_PULL):
            reqs += [c.Irecv(self.params[lo:hi], k, TAG_PARAM) for k, (lo, hi) in enumerate(self.spans)]
            c.waitall(reqs)
        t2 = time.perf_counter()
        self.timings["computing_s"] += t1 - t0
        self.timings["waiting_s"] += t2 - t1  # the push and the pull: mostly the server's answer
        self.timings["steps"] += 1
        return float(total[0])

    # -- server ------------------------------------------------------------------------
    def _receive_push(self, source: int, into: np.ndarray) -> tuple[float, int]:
        header = np.empty(2)
        with self.comm.operation(OP_HEADER):
            self.comm.Recv(header, source, TAG_HEADER)
        with self.comm.operation(OP_PUSH):
            self.comm.Recv(into, source, TAG_GRAD)
        return float(header[0]), int(header[1])

    def _send_params(self, workers: list[int], loss: float | None = None) -> None:
        """The shard to ``workers``; with ``loss`` (sync, server 0) the step's loss first."""
        c, shard = self.comm, self.states.params
        reqs = []
        if loss is not None:
            total = np.array([loss])
            with c.operation(OP_HEADER):
                reqs += [c.Isend(total, self.servers + w, TAG_HEADER) for w in workers]
        with c.operation(OP_PULL):
            reqs += [c.Isend(shard, self.servers + w, TAG_PARAM) for w in workers]
            c.waitall(reqs)

    def _apply(self, summed: np.ndarray) -> None:
        self.states.grads[...] = summed
        self.states.step()

    def _server_sync(self) -> float:
        """One step: every worker's push in a fixed order (a deterministic sum), the update,
        the answers."""
        bufs = self._bufs
        step_loss = 0.0
        for w in range(self.workers):
            loss, clock = self._receive_push(self.servers + w, bufs[w])
            step_loss += loss
            self.loss_at[clock] += loss
        total = bufs[0].copy()
        for b in bufs[1:]:
            total += b
        self._apply(total)
        self._send_params(list(range(self.workers)), step_loss if self.rank == 0 else None)
        return step_loss

    def _restart(self, done: int) -> None:
        """The server's buffers and bookkeeping after ``done`` complete steps (every worker
        has pushed ``done`` gradients and holds the parameters of ``done`` updates)."""
        W = self.workers
        self._bufs = [xp.empty_like(self.states.grads) for _ in range(W if self.mode == "sync" else 1)]
        self.pushed = [done] * W  # gradients received from each worker
        self.version_sent = [done] * W  # updates applied when each worker last got parameters
        self.updates = done
        self.acc = xp.zeros_like(self.states.grads)
        self.in_acc, self.waiting = 0, set()

    def _server_async(self) -> None:
        """W pushes, from whoever pushes first (one step's worth of gradients): each joins
        the update being built; the update is applied at the W-th; a worker is answered as
        soon as it is at most ``staleness`` steps ahead of the slowest."""
        W, steps, s = self.workers, self.spec.steps, self.staleness
        buf = self._bufs[0]
        for _ in range(W):
            status = self.comm.Probe(ANY_SOURCE, TAG_HEADER)  # whoever pushes first
            w = status.Get_source() - self.servers
            loss, clock = self._receive_push(w + self.servers, buf)
            self.max_delay = max(self.max_delay, self.updates - self.version_sent[w])
            self.loss_at[clock] += loss
            self.acc += buf  # the gradient joins the update being built, as it arrives
            self.in_acc += 1
            self.pushed[w] += 1
            self.waiting.add(w)
            if self.in_acc == W:  # one step's worth of gradients: apply the update
                self._apply(self.acc)
                self.acc[...] = 0
                self.in_acc, self.updates = 0, self.updates + 1
            slowest = min(self.pushed)
            ready = sorted(v for v in self.waiting
                           if self.pushed[v] < steps and self.pushed[v] - slowest <= s)
            for v in ready:
                self.version_sent[v] = self.updates
            self._send_params(ready)
            self.waiting.difference_update(ready)
        if self.steps_done + 1 == steps:
            self._send_params(sorted(self.waiting))  # the final parameters
            self.waiting.clear()

    # -- the engine ----------------------------------------------------------------------
    def step(self, batch: Batch) -> StepResult:
        """One step on this rank (the module text): the global loss (sync), NaN (async)."""
        if self.mode == "async" and self.steps_done >= self.spec.steps:
            raise ValueError(f"the asynchronous parameter server runs spec.steps = "
                             f"{self.spec.steps} steps; this would be step {self.steps_done}")
        if not self.is_server:
            loss = self._worker_step(batch)
        elif self.mode == "sync":
            loss = self._server_sync()
        else:
            self._server_async()
            loss = float("nan")
        self.steps_done += 1
        return StepResult(loss)

    def evaluate(self, batch: Batch) -> float:
        """Forward only on the workers' current parameters: the weighted losses summed over
        the ranks (a server adds 0)."""
        mine = 0.0
        if not self.is_server:
            x, y, weight = self.local_batch(batch)
            mine = weight * self.model.loss(self.layout.unflatten(self.params), x, y)
        with self.comm.operation(OP_EVAL):
            return float(allreduce(self.comm, np.array([mine]))[0])

    def pushed_losses(self) -> list[float] | None:
        """On a server: per step, the sum of the workers' weighted losses it received (the
        global loss; async: complete once every worker has pushed that step); None on a
        worker."""
        if not self.is_server:
            return None
        return [self.loss_at[k] for k in sorted(self.loss_at)]

    def state_dict(self) -> State:
        """A server: its flat range of params, master and moments, one Shard per tensor it
        overlaps, replica 0; a worker: the whole params, replica 1 + its index."""
        st = State()
        if self.is_server:
            flat = model_states(self.states)  # the range as one tensor "shard"
            for (kind, _), (_, arr) in flat.arrays.items():
                for n, shape in zip(self.layout.names, self.layout.shapes):
                    t0, t1 = self.layout.span(n)
                    a, b = max(t0, self.lo), min(t1, self.hi)
                    if a < b:
                        pieces = flat_pieces(whole(n, shape), shape, a - t0, b - t0)
                        st.arrays[(kind, n)] = (Shard(n, shape, pieces, 0),
                                                arr[a - self.lo:b - self.lo])
            st.scalars.update(flat.scalars)
        else:
            for n, v in self.layout.unflatten(self.params).items():
                st.arrays[("param", n)] = (whole(n, v.shape, 1 + self.worker), v)
        st.scalars["step"] = self.steps_done
        return st

    def load_state_dict(self, state: State | list[State]) -> None:
        """The overlapping pieces of any layout's states: a server its range (params,
        master, moments, the optimizer's t), a worker its parameters."""
        sources = sources_of(state)
        load_pieces(self.state_dict(), sources)
        self.steps_done = saved_step(sources)
        if self.is_server:
            load_scalars(self.states, sources)
            self._restart(self.steps_done)

    def full_params(self) -> dict[str, Any]:
        """Collective: worker 0's parameters (the servers' after the last pull) broadcast
        to every rank, under the serial names."""
        dtype = self.states.params.dtype if self.is_server else self.params.dtype
        mine = self.params if not self.is_server else xp.empty(self.layout.size, dtype)
        return self.layout.unflatten(broadcast(self.comm, mine, root=self.servers))

    def memory(self) -> dict[str, int]:
        """Bytes this rank holds: a server its range's params, grads and optimizer states;
        a worker the whole params and grads (no optimizer states)."""
        if self.is_server:
            return memory_of(self.states)
        return {"params": int(self.params.nbytes), "grads": int(self.grads.nbytes)}

    def traffic(self) -> dict[str, int]:
        """Bytes this rank sent since the last call, by grid axis (and ``"world"``)."""
        return self._traffic()

    def close(self) -> None:
        """Nothing to free: the communicators are the grid's."""

    # -- evidence ------------------------------------------------------------------------
    def model_state_bytes(self) -> int:
        """Bytes this rank holds (:meth:`memory`, summed)."""
        return sum(self.memory().values())

    def bytes_per_step(self, steps: int | None = None) -> tuple[float, float]:
        """(sent, received) per step by this rank: gradients pushed and parameters pulled,
        over ``steps`` (default: every step taken; a resumed run gives the ones it ran)."""
        st, n = self.comm.stats, max(1, self.steps_done if steps is None else steps)
        return ((st.bytes_sent(OP_PUSH) + st.bytes_sent(OP_PULL)) / n,
                (st.bytes_recv(OP_PUSH) + st.bytes_recv(OP_PULL)) / n)


def build(spec: RunSpec, grid: Grid, **options: Any) -> ParameterServer:
    """The ``"ps"`` row of :mod:`minipar.parallel.strategies`: ``ParameterServer(grid, spec,
    **options)`` (``servers``, ``mode``, ``staleness``, ``straggler_s``); ValueError naming
    any other option."""
    checks.known("the parameter server", options, OPTIONS)
    return ParameterServer(grid, spec, **options)
