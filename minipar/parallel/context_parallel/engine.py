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
Parity with the serial GPT (float64: outputs, loss, gradients, AdamW steps)
is tested for both kinds on 2 and 4 ranks (tests/test_context_parallel.py);
the measurements and the formulas they are checked against are in
:mod:`minipar.parallel.context_parallel.measure`.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from minipar.collectives import allreduce
from minipar.comm.topology import Grid
from minipar.nn import executor
from minipar.parallel.common import RunSpec
from minipar.parallel.context_parallel.layout import check, sharding
from minipar.parallel.context_parallel.model import cp_units
from minipar.precision import ModelStates
from minipar.precision import get as get_policy

__all__ = ["OP_GRADS", "OP_LOSS", "ContextParallel"]

OP_GRADS, OP_LOSS = "cp_grad_allreduce", "cp_loss_allreduce"


class ContextParallel:
    """One rank of a context-parallel run of ``spec``'s GPT over all of ``comm``'s ranks.

    ``kind``: "ulysses" or "ring"; ``zigzag`` (ring only; default on for the ring).
    Bad sizes raise ValueError on every rank before any message."""

    def __init__(self, comm: Any, spec: RunSpec, kind: str = "ring",
                 zigzag: bool | None = None) -> None:
        zigzag = (kind == "ring") if zigzag is None else bool(zigzag)
        P = comm.Get_size()
        check(spec.seq, spec.heads, P, kind, zigzag, spec.experts)  # before Grid's Split
        self.spec, self.kind, self.zigzag = spec, kind, zigzag
        self.grid = Grid(comm, cp=P)
        self.comm = self.grid.comm("cp")
        self.rank, self.world = self.comm.rank, P
        self.layout = sharding(spec.seq, P, kind, zigzag)
        self.positions = self.layout.positions(self.rank)
        self.cfg = spec.config()
        self.units = cp_units(self.cfg, self.comm, kind, self.layout)
        self.states = ModelStates(get_policy(spec.precision), spec.initial_params(),
                                  spec.optimizer, **spec.opt_kwargs())
        self.weight = len(self.positions) / spec.seq  # w_r = t_r / s

    def shard(self, a: Any) -> Any:
        """My columns (positions) of a (batch, seq) array."""
        return a[:, self.positions]

    def forward(self, params: dict[str, Any], tokens: Any) -> tuple[Any, list[Any]]:
        """Local logits (b, t_r, V) of the full ``tokens`` and the units' saved activations."""
        return executor.forward(self.units, executor.Hooks(params), self.shard(tokens))

    def loss_and_grads(self, params: dict[str, Any], tokens: Any, targets: Any,
                       loss_scale: float = 1.0) -> tuple[float, dict[str, Any]]:
        """The serial (loss, grads) of the full batch, computed over the cp shards: the
        loss and the gradients all-reduced over ``cp`` (the same on every rank)."""
        hooks = executor.Hooks(params)
        local = executor.loss_and_grads(self.units, hooks, self.shard(tokens),
                                        self.shard(targets), self.weight * loss_scale)
        with self.comm.operation(OP_LOSS):
            loss = allreduce(self.comm, np.array([self.weight * local]), "sum", "ring")
        layout = self.states.layout
        flat = layout.flatten({k: hooks.grads[k] for k in params}, self.states.grads.dtype)
        with self.comm.operation(OP_GRADS):
            flat = allreduce(self.comm, flat, "sum", "ring")
        return float(loss[0]), layout.unflatten(flat)

    def step(self, step: int) -> float:
        """One AdamW (or SGD) step on the global batch of ``step``; its loss."""
        tokens, targets = self.spec.global_batch(step)
        loss, grads = self.loss_and_grads(self.states.param_views(), tokens, targets,
                                          self.states.loss_scale)
        self.states.set_grads(grads)
        self.states.step()
        return loss

    def train(self) -> list[float]:
        """``spec.steps`` steps; the losses (the same on every rank)."""
        return [self.step(s) for s in range(self.spec.steps)]
