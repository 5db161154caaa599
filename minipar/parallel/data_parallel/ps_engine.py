"""The parameter server's engine: the shell around
:mod:`~minipar.parallel.data_parallel.parameter_server` — оболочка сервера параметров — 参数服务器的外壳.

:class:`ParameterServer` is an :class:`~minipar.parallel.engine.Engine`: it
checks its options, gives each rank its role (a core
:class:`~minipar.parallel.data_parallel.parameter_server.Server` or
:class:`~minipar.parallel.data_parallel.parameter_server.Worker`) and calls it
once per step.  Around a worker's compute it keeps the measured seconds
(``timings``: computing, the straggler's sleep included, and waiting for the
pull) and makes worker 0 the notebook's straggler (``straggler_s``); the bytes
pushed and pulled are the traced communicator's counts (:meth:`bytes_per_step`).

Every rank calls ``step(batch)`` once per step: a worker cuts its rows of the
global batch, pushes and pulls; a server receives one step's pushes (W of
them), updates and answers.  Synchronous: every rank's ``StepResult.loss`` is
the global loss (server 0 sends it with the parameters).  Asynchronous: a
step's loss is only complete once every worker has pushed it, long after a
fast worker's step returned, so ``StepResult.loss`` is NaN on every rank and
:meth:`ParameterServer.pushed_losses` gives the per-step losses on the servers
(complete after the run); the run is ``spec.steps`` steps long (the last
pushes are answered with the final parameters).  Who holds what
(:meth:`ParameterServer.state_dict`): server k its flat range of the
parameters and optimizer states, one :class:`~minipar.parallel.engine.Shard`
per tensor it overlaps (replica 0: what a checkpoint saves); a worker the
whole parameters, replica = 1 + its index (never saved), no optimizer state.
``full_params()`` broadcasts worker 0's copy (equal to the servers' after the
pull) to every rank.
"""

from __future__ import annotations

import time
from typing import Any

import numpy as np

from minipar import checks
from minipar.backend import xp
from minipar.collectives import allreduce, broadcast
from minipar.comm.topology import Grid, require_grid
from minipar.comm.traced import TracedComm
from minipar.nn import GPT
from minipar.optim import FlatParams
from minipar.parallel.common import RunSpec, check_world
from minipar.parallel.data_parallel.ddp import local_batch
from minipar.parallel.data_parallel.parameter_server import (
    OP_PULL,
    OP_PUSH,
    Server,
    Worker,
    shard_span,
)
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
#: the keyword options of :class:`ParameterServer`
#: (``strategies.build("ps", spec, grid, **options)``)
OPTIONS = ("servers", "mode", "staleness", "straggler_s")
OP_EVAL = "ps_eval_allreduce"  # evaluate: the workers' weighted losses summed


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
        self.spec, self.servers = spec, int(servers)
        self.mode, self.staleness = mode, int(staleness)
        self.straggler_s = float(straggler_s)
        self.rank = self.comm.rank
        self.is_server = self.rank < servers
        init = spec.initial_params()
        self.layout = FlatParams.like(init)
        flat = self.layout.flatten(init)
        self.spans = [shard_span(self.layout.size, servers, k) for k in range(servers)]
        self.steps_done = 0
        #: a worker's measured seconds (perf_counter): computing its gradient (the straggler's
        #: sleep included) and waiting for the pull, and the steps it ran (``minipar run ps``)
        self.timings = {"computing_s": 0.0, "waiting_s": 0.0, "steps": 0}
        self._traffic = AxisTraffic(grid)
        self.server: Server | None = None
        self.client: Worker | None = None
        if self.is_server:
            self.lo, self.hi = self.spans[self.rank]
            # the server's model states: its shard of params, grads and optimizer states
            self.states = ModelStates(spec.precision, {"shard": flat[self.lo:self.hi]},
                                      spec.optimizer, **spec.opt_kwargs())
            self.server = Server(self.comm, self.states, self.servers, self.workers,
                                 mode == "sync", self.staleness, spec.steps)
        else:
            self.worker = self.rank - servers
            self.model: GPT = spec.model()
            self.params = flat.astype(self.model.cfg.dtype)
            self.client = Worker(self.comm, self.model, self.layout, self.params, self.spans,
                                 mode == "sync")

    @property
    def max_delay(self) -> int:
        """Async: the most updates applied between a pull and the push it led to (0 on a
        worker: the servers count it)."""
        return self.server.max_delay if self.server is not None else 0

    # -- one step ------------------------------------------------------------------------
    def local_batch(self, batch: Batch) -> tuple[Any, Any, float]:
        """This worker's rows of the global ``batch`` over the W workers and their weight
        b_w / B (:func:`~minipar.parallel.data_parallel.ddp.local_batch`)."""
        return local_batch(batch, self.worker, self.workers)

    def _worker_step(self, client: Worker, batch: Batch) -> float:
        x, y, weight = self.local_batch(batch)
        t0 = time.perf_counter()
        loss = client.compute(x, y, weight)
        if self.straggler_s and self.worker == 0:
            time.sleep(self.straggler_s)  # a slow worker (the notebook's straggler)
        t1 = time.perf_counter()
        total = client.push_pull(loss, batch.step)
        t2 = time.perf_counter()
        self.timings["computing_s"] += t1 - t0
        self.timings["waiting_s"] += t2 - t1  # the push and the pull: mostly the server's answer
        self.timings["steps"] += 1
        return total

    def step(self, batch: Batch) -> StepResult:
        """One step on this rank (the module text): the global loss (sync), NaN (async)."""
        if self.mode == "async" and self.steps_done >= self.spec.steps:
            raise ValueError(f"the asynchronous parameter server runs spec.steps = "
                             f"{self.spec.steps} steps; this would be step {self.steps_done}")
        if self.client is not None:
            loss = self._worker_step(self.client, batch)
        elif self.mode == "sync":
            loss = self.server.sync_step()
        else:
            self.server.async_step(last=self.steps_done + 1 == self.spec.steps)
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
        if self.server is None:
            return None
        return [self.server.loss_at[k] for k in sorted(self.server.loss_at)]

    # -- the engine's state ----------------------------------------------------------------
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
        if self.server is not None:
            load_scalars(self.states, sources)
            self.server.restart(self.steps_done)

    def full_params(self) -> dict[str, Any]:
        """Collective: worker 0's parameters (the servers' after the last pull) broadcast
        to every rank, under the serial names."""
        dtype = self.states.params.dtype if self.is_server else self.params.dtype
        mine = self.params if not self.is_server else xp.empty(self.layout.size, dtype)
        return self.layout.unflatten(broadcast(self.comm, mine, root=self.servers))

    def memory(self) -> dict[str, int]:
        """Bytes this rank holds: a server its range's params, grads and optimizer states;
        a worker the whole params and grads (no optimizer states)."""
        if self.client is None:
            return memory_of(self.states)
        return {"params": int(self.params.nbytes), "grads": int(self.client.grads.nbytes)}

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
