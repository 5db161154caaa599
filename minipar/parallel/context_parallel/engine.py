"""Context parallelism — контекстный параллелизм — 上下文并行.

EN context parallelism (CP) · RU контекстный параллелизм · ZH 上下文并行

The whole sequence — every layer's activations, attention included — is cut
over the P ranks of the grid's ``cp`` axis (:class:`minipar.comm.topology.Grid`),
for contexts too long for one device.  Everything in a GPT but attention
works token by token, so on a sequence shard it runs unchanged (embedding,
LayerNorms, projections, MLP, head, the loss); attention needs the other
ranks' keys and values, by one of two routes:

* **DeepSpeed-Ulysses** (Jacobs et al. 2023, arXiv 2309.14509;
  :mod:`minipar.parallel.context_parallel.ulysses`): all-to-all from sequence-sharded to
  head-sharded, full-sequence attention of H/P heads, all-to-all back.
  4·b·s·d·(P−1)/P² elements per rank per layer each way (paper: 4Nh/P per
  link); attention activations 1/P of the serial layer's, s² term included.
* **Ring attention** (Liu et al. 2023, arXiv 2310.01889;
  :mod:`minipar.parallel.context_parallel.ring_attention`): K/V blocks travel around the ring,
  each rank folds them into its queries' output with the online softmax
  (:mod:`minipar.nn.blockwise_attention`); zigzag chunks balance causal work.
  2(P−1)·b·s·d/P elements per rank per layer forward; attention activations
  (4·b·s·d + b·H·s)/P: no s² term at all.

**The loss over shards.**  Rank r holds t_r = s/P of every row's tokens.
Its mean cross-entropy ℓ_r over its b·t_r tokens, weighted by w_r = t_r / s,
sums over ranks to the serial mean:  ℓ = Σ_r w_r·ℓ_r  (an all-reduce of one
number).  Gradients: each rank's backward gives the gradient of w_r·ℓ_r with
respect to every (replicated) parameter — through its own tokens and, via the
attention exchange's backward, through the keys and values it lent the others —
so the full gradient is their sum: one all-reduce over ``cp`` (the ring,
2(P−1)/P·Ψ elements per rank), then every rank takes the same AdamW step.
The embedding looks up each rank's own positions in ``pos_emb``.

The CP GPT is the serial model's units with the attention core swapped
(:func:`~minipar.parallel.context_parallel.model.cp_units`):
:mod:`minipar.nn.executor` walks them unchanged.
**The engine** (:class:`ContextParallel`, the :class:`~minipar.parallel.engine.Engine`
interface): ``step(batch)`` takes my positions of every row of the GLOBAL batch;
``state_dict()`` holds whole tensors under their serial names (every rank has
the whole model), the copy of cp rank r is replica r (only cp rank 0's is saved).

Parity with the serial GPT (float64: outputs, loss, gradients, AdamW steps)
is tested for both kinds on 2 and 4 ranks (tests/test_context_parallel.py);
the measurements and the formulas they are checked against are in
:mod:`minipar.parallel.context_parallel.measure`.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import numpy as np

from minipar import checks
from minipar.backend import to_device
from minipar.collectives import allreduce
from minipar.comm.topology import Grid, require_grid
from minipar.nn import cross_entropy_forward, executor
from minipar.parallel.common import RunSpec, fp8_rows
from minipar.parallel.context_parallel.model import cp_units
from minipar.parallel.context_parallel.options import check, sharding
from minipar.parallel.engine import (
    AxisTraffic,
    Batch,
    State,
    StepResult,
    load_model_states,
    memory_of,
    model_states,
    sources_of,
)
from minipar.precision import ModelStates
from minipar.precision import get as get_policy

__all__ = ["OPTIONS", "OP_GRADS", "OP_LOSS", "ContextParallel", "build"]

OP_GRADS, OP_LOSS = "cp_grad_allreduce", "cp_loss_allreduce"

#: the engine's options: which route attention takes, and the ring's chunk order
OPTIONS = ("kind", "zigzag", "ulysses", "ring")


class ContextParallel:
    """One rank of a context-parallel run of ``spec``'s GPT over the ``cp`` axis of ``grid``.

    ``kind``: "ulysses", "ring", "allgather" or "usp" (``ulysses`` × ``ring`` ranks);
    ``zigzag`` (ring, all-gather, USP's ring; default on).
    The grid must be all cp (no other axis larger than 1).  Bad sizes raise ValueError
    on every rank before any message."""

    def __init__(self, grid: Grid, spec: RunSpec, kind: str = "ring",
                 zigzag: bool | None = None, ulysses: int | None = None,
                 ring: int | None = None) -> None:
        require_grid(grid, "context parallelism", ("cp",))
        zigzag = (kind != "ulysses") if zigzag is None else zigzag
        if not isinstance(zigzag, (bool, np.bool_)):
            raise ValueError(f"zigzag must be True, False or None, got {zigzag!r}")  # noqa: TRY004
        zigzag = bool(zigzag)
        P = grid.size("cp")
        check(spec.seq, spec.heads, P, kind, zigzag, spec.experts,
              spec.kv_heads, ulysses, ring)  # before any message
        self.spec, self.kind, self.zigzag = spec, kind, zigzag
        self.grid = grid
        self.comm = grid.comm("cp")
        self.rank, self.world = self.comm.rank, P
        self.layout = sharding(spec.seq, P, kind, zigzag, ulysses, ring)
        self.positions = self.layout.positions(self.rank)
        self.index = to_device(self.positions)  # to index device arrays with, moved once
        self.cfg = spec.config()
        self.units = cp_units(self.cfg, self.comm, kind, self.layout)
        self.states = ModelStates(get_policy(spec.precision), spec.initial_params(),
                                  spec.optimizer, **spec.opt_kwargs())
        self.weight = len(self.positions) / spec.seq  # w_r = t_r / s
        self.steps_done = 0
        self._traffic = AxisTraffic(grid)

    def shard(self, a: Any) -> Any:
        """My columns (positions) of a (batch, seq) array."""
        return a[:, self.index]

    def forward(self, params: dict[str, Any], tokens: Any) -> tuple[Any, list[Any]]:
        """Local logits (b, t_r, V) of the full ``tokens`` and the units' saved activations."""
        return executor.forward(self.units, executor.Hooks(params), self.shard(tokens))

    def global_loss(self, local: float) -> float:
        """ℓ = Σ_r w_r·ℓ_r: my mean loss weighted by my share of positions, summed over cp."""
        with self.comm.operation(OP_LOSS):
            loss = allreduce(self.comm, np.array([self.weight * local]), "sum", "ring")
        return float(loss[0])

    def loss_and_grads(self, params: dict[str, Any], tokens: Any, targets: Any,
                       loss_scale: float = 1.0) -> tuple[float, dict[str, Any]]:
        """The serial (loss, grads) of the full batch, computed over the cp shards: the
        loss and the gradients all-reduced over ``cp`` (the same on every rank)."""
        hooks = executor.Hooks(params)
        with fp8_rows(self.spec, self.comm):  # per-tensor FP8: the amax over every shard
            local = executor.loss_and_grads(self.units, hooks, self.shard(tokens),
                                            self.shard(targets), self.weight * loss_scale)
        loss = self.global_loss(local)
        layout = self.states.layout
        flat = layout.flatten({k: hooks.grads[k] for k in params}, self.states.grads.dtype)
        with self.comm.operation(OP_GRADS):
            flat = allreduce(self.comm, flat, "sum", "ring")
        return loss, layout.unflatten(flat)

    # -- the engine interface (minipar.parallel.engine.Engine) -----------------------------
    def step(self, batch: Batch) -> StepResult:
        """One AdamW (or SGD) step on the GLOBAL ``batch`` (I take my positions of every row)."""
        loss, grads = self.loss_and_grads(self.states.param_views(), batch.tokens,
                                          batch.targets, self.states.loss_scale)
        self.states.set_grads(grads)
        done = self.states.step()
        self.steps_done += 1
        return StepResult(loss, skipped=not done)

    def evaluate(self, batch: Batch) -> float:
        """The global mean loss of ``batch``, forward only (the same on every rank)."""
        with fp8_rows(self.spec, self.comm):
            logits, kept = self.forward(self.states.param_views(), batch.tokens)
        del kept
        return self.global_loss(cross_entropy_forward(logits, self.shard(batch.targets))[0])

    def state_dict(self) -> State:
        """Whole tensors under their serial names; cp rank r's copy is replica r."""
        st = model_states(self.states, replica=self.rank)
        st.scalars["step"] = self.steps_done
        return st

    def load_state_dict(self, state: State | Iterable[State]) -> None:
        self.steps_done = load_model_states(self.states, sources_of(state))

    def full_params(self) -> dict[str, Any]:
        """The whole model, serial names and order: every rank holds it (no message)."""
        return {n: v.copy() for n, v in self.states.param_views().items()}

    def memory(self) -> dict[str, int]:
        return memory_of(self.states)

    def traffic(self) -> dict[str, int]:
        """Bytes this rank sent since the last call, by grid axis (and ``"world"``)."""
        return self._traffic()

    def close(self) -> None:
        """Nothing to free: the grid (and its communicators) belongs to the caller."""


def build(spec: RunSpec, grid: Grid, **options: Any) -> ContextParallel:
    """The context-parallel engine (:mod:`minipar.parallel.strategies`' row "cp"):
    ``kind`` ("ring", "ulysses", "allgather" or "usp"), ``zigzag``, USP's ``ulysses``, ``ring``."""
    checks.known("context parallelism", options, OPTIONS)
    return ContextParallel(grid, spec, **options)
