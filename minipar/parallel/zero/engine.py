"""ZeRO, stages 0-3: sharded data parallelism (stage 3 is PyTorch's FSDP).

EN Zero Redundancy Optimizer (ZeRO) · RU оптимизатор с нулевой избыточностью · ZH 零冗余优化器

Rajbhandari, Rasley, Ruwase & He 2019, "ZeRO: Memory Optimizations Toward
Training Trillion Parameter Models", arXiv 1910.02054.  Stage 3 is what
PyTorch calls Fully Sharded Data Parallel (Zhao et al. 2023, arXiv 2304.11277).

Data parallelism keeps the same model states on all N ranks.  ZeRO keeps one
copy in total: rank r owns the contiguous slice ``[lo_r, hi_r)`` of the flat
parameter buffer (``numpy.array_split`` rule: C_r = Ψ//N elements, one more
for the first Ψ mod N ranks) and holds for it what the stage partitions:

=========  ============================  =====================================
stage      held in full on every rank    communication per step
=========  ============================  =====================================
0  DP      params, grads, optimizer      all-reduce of the gradients (auto)
1  P_os    params, grads                 reduce-scatter grads, step own slice
                                         of fp32 master + Adam m, v;
                                         all-gather the updated params
2  P_os+g  params                        the same; grads are reduce-scattered
                                         unit by unit as backward makes them,
                                         a rank keeps only its gradient slice
3  P_os+g+p  nothing                     per unit: all-gather its params just
                                         before its forward and again before
                                         its backward, drop them after; reduce-
                                         scatter its grads after its backward
=========  ============================  =====================================

A *unit* is the embedding, one transformer block, or the head (ln_f +
lm_head): contiguous spans of the flat buffer.  A unit's part on rank r is
the overlap of its span with ``[lo_r, hi_r)``, so gathering every unit once
moves exactly one all-gather of the buffer.  The step is the units
executor's one walk over the model (:mod:`minipar.nn.executor`) with ZeRO's
hooks (:mod:`minipar.parallel.zero.hooks`): ``fetch`` = views or, stage 3,
the all-gather; ``release`` drops stage 3's gathered parameters; ``on_grads``
writes the full gradient buffer or reduce-scatters the unit's gradients.
Because ``saved`` holds activations only, nothing of a unit's parameters
lives between its forward and its backward.  The optimizer is element-wise
(``minipar.optim``), so stepping slices equals stepping the whole.  MoE
blocks work unchanged (the executor adds their auxiliary loss).

**Formulas the tests check** (tests/test_zero.py, ``minipar.plan.zero``):

* parity: on 1-4 ranks every stage's losses and final float64 parameters
  equal ``minipar.train.train``'s (``minipar.parallel.common.parity``), for
  the dense GPT and (stages 1-3) a mixture of experts, whose oracle routes
  the same groups as the ranks (``serial_reference(spec, N)``);
* model-state bytes per rank, mixed precision (2 + 2 + K, K = 12):
  (2+2+K)Ψ, 4Ψ + KΨ/N, 2Ψ + (2+K)Ψ/N, (2+2+K)Ψ/N, measured by the ledger
  (exact but for the uneven shard: C_r instead of Ψ/N) and by tracemalloc;
* bytes sent per rank per step, b bytes per element (2 for 16-bit).  The
  paper's "2Ψ" is one reduce-scatter of Ψ elements plus one all-gather of Ψ,
  each of which makes a ring rank send (N-1)/N of Ψ: 2Ψ(N-1)/N x b in all,
  exactly (2Ψ - C_r - C_{r+1}) b.  Stage 3's "3Ψ" adds the second all-gather
  (backward): (3Ψ - C_r - 2C_{r+1}) b.  (The embedding's backward reads no
  weights; following the paper's and FSDP's uniform rule we gather it anyway.)

**Which all-reduce** (``allreduce="auto"``, the default).  Stages 1-3 use the
ring's reduce-scatter and all-gather.  Stage 0's gradient all-reduce and the
one-number all-reduces (``found_inf`` under loss scaling, the loss a run
reports) go through :func:`minipar.collectives.allreduce` with the engine's
``allreduce``: ``"auto"`` picks recursive doubling below 8 MiB or on N <= 2
ranks and the ring from 8 MiB up on N >= 3
(:func:`minipar.collectives.auto.choose_allreduce`), counted under the name
of the algorithm that ran.  So stage 0 of a small model sends recursive
doubling's bytes, log2 N x S when N is a power of two (the ring's
2(N-1)/N x S on 2 ranks); the paper's 2Ψ(N-1)/N is the ring's figure,
``allreduce="ring"``.  :func:`minipar.parallel.zero.measure.exact_bytes_sent`
gives the exact figure of whichever ran.

The code: the shards in :mod:`minipar.parallel.zero.shard`, the hooks in
:mod:`minipar.parallel.zero.hooks`, the engine here, the measurements of a
run and the paper's figures for it in :mod:`minipar.parallel.zero.measure`.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from minipar.collectives import all_gather, allreduce, choose_allreduce, reduce_scatter
from minipar.comm.traced import TracedComm, traced
from minipar.memory import Ledger
from minipar.nn import executor
from minipar.nn.gpt import GPT
from minipar.parallel.zero.hooks import ZeroHooks
from minipar.parallel.zero.shard import layout_of, shard_range, unit_table
from minipar.precision import ModelStates, get

STAGES = (0, 1, 2, 3)
#: the all-reduces ZeRO can run for stage 0's gradients and the one-number reductions
#: (``minipar.collectives.allreduce``'s names; ``"auto"`` by message size and N)
ALLREDUCE_CHOICES = ("auto", "ring", "recursive_doubling", "tree")


def check_stage(stage: Any) -> int:
    """The stage as an int; ValueError unless 0, 1, 2 or 3."""
    if isinstance(stage, bool) or not isinstance(stage, (int, np.integer)) or stage not in STAGES:
        raise ValueError(f"ZeRO stage must be 0 (plain DP), 1 (optimizer states), 2 (+ gradients) "
                         f"or 3 (+ parameters); got {stage!r}")
    return int(stage)


def check_allreduce(algorithm: Any) -> str:
    """The all-reduce algorithm's name; ValueError unless one of :data:`ALLREDUCE_CHOICES`."""
    if algorithm not in ALLREDUCE_CHOICES:
        raise ValueError(f"ZeRO's all-reduce must be one of {', '.join(ALLREDUCE_CHOICES)}; "
                         f"got {algorithm!r}")
    return str(algorithm)


class ZeRO:
    """One rank's part of ZeRO-``stage`` training of a GPT.

    ``init`` is the full float64 initial parameter dict (every rank draws the
    same; partition-independent init) — kept only as the stage allows.
    Attributes: ``params`` full flat 16-bit/param-dtype buffer (stages 0-2, else
    None), ``grads`` full flat gradient buffer (stages 0-1, else None),
    ``states`` the :class:`~minipar.precision.ModelStates` of this rank's
    slice ``opt_range`` (master weights, moments; its params/grads are views
    into the full buffers where those exist), ``zero_hooks`` its executor hooks
    (:class:`~minipar.parallel.zero.hooks.ZeroHooks`), ``hooks`` those the executor
    walks (``zero_hooks``, or what ``wrap_hooks`` made of them), ``allreduce`` the
    all-reduce of stage 0 and of found_inf (keyword only: ``"auto"``, ``"ring"``,
    ``"recursive_doubling"``, ``"tree"``).  Memory options (keyword only):
    ``offload_optimizer`` ``"host"``/``"disk"`` keeps the master weights and moments
    there and steps there (ZeRO-Offload, :mod:`minipar.parallel.offload.optimizer`;
    files in ``offload_dir``), ``wrap_hooks(hooks, units) -> hooks`` wraps ZeRO's hooks
    (remat, activation offload: :class:`minipar.parallel.offload.wrap.MemoryWrap`).
    """

    def __init__(self, comm: Any, model: GPT, init: dict[str, Any], stage: int,
                 precision: str = "float64", optimizer: str = "adamw", *,
                 allreduce: str = "auto", offload_optimizer: str | None = None,
                 offload_dir: str | None = None, wrap_hooks: Any = None,
                 **opt_kwargs: Any) -> None:
        self.stage, self.policy = check_stage(stage), get(precision)
        self.allreduce = check_allreduce(allreduce)
        if str(model.cfg.dtype) != self.policy.model_dtype:
            raise ValueError(f"model dtype {model.cfg.dtype} does not match precision "
                             f"{precision!r} (expects {self.policy.model_dtype})")
        self.comm: TracedComm = traced(comm)
        self.model, self.layout = model, layout_of(model.cfg)
        self.units = tuple(u for u, *_ in unit_table(model.cfg))
        psi, n, r = self.layout.size, self.comm.size, self.comm.rank
        self.shard = shard_range(psi, n, r)  # ValueError before any message
        self.opt_range = (0, psi) if self.stage == 0 else self.shard
        self.param_range = self.shard if self.stage == 3 else (0, psi)
        self.optimizer_name, self.opt_kwargs, self.step_count = optimizer, dict(opt_kwargs), 0
        flat = self.layout.flatten(init, np.float64)
        lo, hi = self.opt_range
        self.states = ModelStates(self.policy, {"shard": flat[lo:hi]}, optimizer, **opt_kwargs)
        pd = self.policy.param_dtype
        self.params = None if self.stage == 3 else flat.astype(pd)
        self.grads = np.zeros(psi, pd) if self.stage <= 1 else None
        if self.params is not None:
            self.states.params = self.params[lo:hi]  # the slice the optimizer writes
        if self.grads is not None:
            self.states.grads = self.grads[lo:hi]
        self.zero_hooks = self.hooks = ZeroHooks(
            self.stage, self.comm, psi, self.shard, self.states, unit_table(model.cfg),
            params=self.params, grads=self.grads, dtype=self.policy.param_dtype)
        self.offload = None
        if offload_optimizer is not None:
            from minipar.parallel.offload.optimizer import OptimizerOffload

            self.offload = OptimizerOffload(self.states, offload_optimizer, offload_dir)
        if wrap_hooks is not None:
            self.hooks = wrap_hooks(self.hooks, self.units)

    # -- one training step ---------------------------------------------------
    def train_step(self, tokens: Any, targets: Any, weight: float = 1.0) -> float:
        """Forward, backward, communication and optimizer step on this rank's rows.

        ``weight`` = b_r / B (``common.loss_weight``): the gradients are those
        of weight x local mean loss, and summing over ranks gives the serial
        mean.  Returns weight x local loss (sum it over ranks for the loss).
        """
        loss = executor.loss_and_grads(self.units, self.hooks, tokens, targets,
                                       weight * self.states.loss_scale)
        if self.stage == 0:
            self.grads[...] = allreduce(self.comm, self.grads, algorithm=self.allreduce)
        elif self.stage == 1:
            self.states.grads[...] = reduce_scatter(self.comm, self.grads)
        found_inf = None
        if self.states.scaler is not None:  # every rank must agree to skip a step
            with self.comm.operation("found_inf"):
                flag = np.array([float(self.states.local_found_inf())])
                found_inf = bool(allreduce(self.comm, flag, algorithm=self.allreduce)[0] > 0)
        (self.offload or self.states).step(found_inf)
        if self.stage in (1, 2):
            self.params[...] = all_gather(self.comm, self.states.params)
        self.step_count += 1
        return weight * loss

    def grad_allreduce(self) -> str | None:
        """The algorithm stage 0's gradient all-reduce runs (``auto`` resolved by the
        gradient buffer's bytes and N); None for stages 1-3 (reduce-scatter + all-gather)."""
        if self.stage != 0:
            return None
        if self.allreduce != "auto":
            return self.allreduce
        return choose_allreduce(self.grads.nbytes, self.comm.size)

    # -- what a rank holds, and the whole model for checks -------------------
    def ledger(self) -> Ledger:
        """Model-state bytes this rank holds, by category (each buffer once)."""
        led = Ledger(self.comm.rank)
        led.add("params", "params", self.params if self.params is not None else self.states.params)
        led.add("grads", "grads", self.grads if self.grads is not None else self.states.grads)
        where = self.offload.place if self.offload is not None else "device"
        led.add("optimizer states", "moments", self.states.optimizer.state_arrays(), where)
        if self.states.master is not None:
            led.add("optimizer states", "fp32 master weights", self.states.master, where)
        return led

    def full_params(self) -> np.ndarray:
        """The whole flat parameter buffer (stage 3 all-gathers it: op ``gather_for_check``)."""
        if self.params is not None:
            return self.params.copy()
        with self.comm.operation("gather_for_check"):
            return all_gather(self.comm, self.states.params)
