"""What a pipeline engine is given: its stage model and its gradient sync (and the wire, :mod:`.p2p`).

EN pipeline stage model and gradient synchronisation · RU модель стадии и синхронизация
градиентов конвейера · ZH 流水线阶段模型与梯度同步

:class:`~.engine.PipelineParallel` runs the schedule (GPipe, Huang et al. 2018, arXiv
1811.06965; 1F1B and interleaved 1F1B, Narayanan et al. 2021, arXiv 2104.04473) with
the stage loop and keeps the books; three objects it is handed decide what runs inside:

* a **stage model** — the model's units (the engine cuts them into its chunks), the
  stage's initial parameters, this rank's part of the batch, the loss itself, and where
  each local tensor sits in the serial one (its :class:`~minipar.parallel.engine.Shard`).
  The pipeline's own is :class:`SerialStage`: the serial GPT's units, whole tensors, the
  replica's rows;
* a **wire** — what travels between stages (:class:`~.p2p.Whole` here);
* a **gradient sync** — the stage's model states and what happens to the gradients
  after the flush (and, where it needs them, the hooks each step runs the units with).
  The pipeline's own is :class:`AllReduceSync` with :func:`all_reduce`: one all-reduce
  over the replicas.

The hybrid engine (:mod:`minipar.parallel.hybrid`) hands the same engine tensor-,
context- or expert-parallel stage models, PTD-P's scatter/gather and ZeRO (and, as
values, what differs in the loss's weight and report and in a tensor's replica: the
engine's ``loss_weight``, ``reports_loss``, ``replica_of``).  Every weight is
w_i = b_i/B (micro-batch i's rows over the global batch), so Σ_replicas Σ_i w_i ∇ℓ_i
is the serial gradient, and each replica stepping after the all-reduce is the serial step.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

from minipar.backend import to_device, to_host
from minipar.nn import executor
from minipar.nn.loss import cross_entropy_backward, cross_entropy_forward
from minipar.parallel.common import found_inf, local_rows
from minipar.parallel.engine import (
    Shard,
    State,
    load_model_states,
    memory_of,
    model_states,
    whole,
)
from minipar.precision import ModelStates

__all__ = ["AllReduceSync", "SerialStage", "all_reduce", "replica_rows"]


def replica_rows(batch: Any, replica: int, dp: int) -> tuple[Any, Any]:
    """Replica ``replica`` of ``dp``'s rows of the global batch, (tokens, targets), copied:
    the stage holds its own rows (the activation ledger would count a view's whole buffer)."""
    lo, hi = local_rows(batch.size, replica, dp)
    return batch.tokens[lo:hi].copy(), batch.targets[lo:hi].copy()


class SerialStage:
    """The pipeline's stage model: the serial GPT of ``spec`` cut into stages on a dp x pp
    ``grid``; replica ``grid.coord("dp")`` holds its rows of the batch, every tensor whole."""

    axes = ("dp", "pp")  #: the grid axes it handles (the others must be 1)

    def __init__(self, grid: Any, spec: Any) -> None:
        self.spec, self.model = spec, spec.model()
        self.d, self.dp = grid.coord("dp"), grid.size("dp")  # my replica of dp

    def units(self) -> Any:
        """The whole model's units (embed, blocks, head), to be cut into stages."""
        return self.model.units()

    def params(self, names: list[str]) -> dict[str, Any]:
        """The initial tensors ``names`` (the stage's, in its units' order)."""
        init = self.spec.initial_params()
        return {n: init[n] for n in names}

    def local_batch(self, batch: Any) -> tuple[Any, Any]:
        """My replica's rows of the global batch (:func:`replica_rows`)."""
        return replica_rows(batch, self.d, self.dp)

    def loss_forward(self, logits: Any, targets: Any) -> tuple[float, Any]:
        return cross_entropy_forward(logits, targets)

    def loss_backward(self, saved: Any, scale: float) -> Any:
        return cross_entropy_backward(saved, scale)

    def placements(self, names: Iterable[str]) -> dict[str, Shard]:
        """Each local tensor is the serial one, whole."""
        shapes = self.model.param_shapes()
        return {n: whole(n, shapes[n]) for n in names}

    def gather(self, world: Any, mine: dict[str, Any]) -> dict[str, Any]:
        """The whole model from every stage's ``mine`` (replica 0's), serial order, on every
        rank (a report: the pickled all-gather on the world's own communicator, not counted)."""
        mine = {k: to_host(v) for k, v in mine.items()} if self.d == 0 else {}
        everyone = world.comm.allgather(mine)
        merged = {k: v for d in everyone for k, v in d.items()}
        return {n: to_device(merged[n]) for n in self.model.param_shapes()}


def all_reduce(comm: Any, op: str, algorithm: str = "auto") -> Callable[[Any, Any], None]:
    """The pipeline's gradient reduction: the stage's flat gradient buffer summed over
    ``comm`` in place (the replicas: dp), counted under ``op``, by ``algorithm``
    (:func:`minipar.collectives.allreduce`); nothing on one rank."""

    def reduce(grads: Any, layout: Any) -> None:
        if comm.size > 1:  # imported only then
            from minipar.collectives import allreduce

            with comm.operation(op):
                grads[...] = allreduce(comm, grads, "sum", algorithm)

    return reduce


class AllReduceSync:
    """The gradient sync of whole stage replicas: ``AllReduceSync(world, reduce)``; after the
    flush ``reduce(grads, layout)`` sums the stage's flat gradient buffer in place over the
    ranks that hold the same stage (:func:`all_reduce`; the hybrid's: over dp·cp, or dense
    and expert tensors apart), then every rank steps its copy; ``world`` decides a 16-bit
    overflow's skip together."""

    def __init__(self, world: Any, reduce: Callable[[Any, Any], None]) -> None:
        self.world, self.reduce = world, reduce

    def build(self, spec: Any, params: dict[str, Any], units: list[Any]) -> ModelStates:
        """The stage's model states over ``params`` (whole: every rank holds all of them)."""
        self.states = ModelStates(spec.precision, params, spec.optimizer, **spec.opt_kwargs())
        self.layout = self.states.layout  # the stage's parameters, flat
        return self.states

    def step_hooks(self) -> Any:
        """None: the stage's own hooks (views of the flat buffers, gradients added)."""
        return None

    def eval_hooks(self) -> Any:
        """The hooks a forward-only pass runs the units with: views of the parameters."""
        return executor.Hooks(self.states.param_views())

    def step(self) -> bool:
        """After the flush: sum the gradients (``reduce``), step; False when a 16-bit
        overflow skipped the update (on every rank alike)."""
        st = self.states
        self.reduce(st.grads, self.layout)
        return st.step(found_inf=found_inf(self.world, st))  # every stage skips alike

    def state(self, placements: dict[str, Shard]) -> State:
        """The states, tensor by tensor (replicas: the engine's to fill in)."""
        return model_states(self.states, placements)

    def load(self, sources: list[State], placements: dict[str, Shard]) -> None:
        """Read the states from the overlapping pieces of ``sources``."""
        load_model_states(self.states, sources, placements)

    def stage_params(self) -> dict[str, Any]:
        """My stage's parameters, tensor by tensor (views)."""
        return self.layout.unflatten(self.states.params)

    def model_state_bytes(self) -> dict[str, int]:
        """Params, grads and optimizer states this rank holds (bytes, by kind)."""
        return memory_of(self.states)
