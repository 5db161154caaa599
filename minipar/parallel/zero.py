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
stage      held in full on every rank    communication per step (ring)
=========  ============================  =====================================
0  DP      params, grads, optimizer      all-reduce of the gradients
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
moves exactly one all-gather of the buffer.  The optimizer is element-wise
(``minipar.optim``), so stepping slices equals stepping the whole.

**Formulas the tests check** (tests/test_zero.py, ``minipar.plan.zero``):

* parity: on 1-4 ranks every stage's losses and final float64 parameters
  equal ``minipar.train.train``'s (``minipar.parallel.common.parity``);
* model-state bytes per rank, mixed precision (2 + 2 + K, K = 12):
  (2+2+K)Ψ, 4Ψ + KΨ/N, 2Ψ + (2+K)Ψ/N, (2+2+K)Ψ/N, measured by the ledger
  (exact but for the uneven shard: C_r instead of Ψ/N) and by tracemalloc;
* bytes sent per rank per step, b bytes per element (2 for 16-bit).  The
  paper's "2Ψ" is one reduce-scatter of Ψ elements plus one all-gather of Ψ,
  each of which makes a ring rank send (N-1)/N of Ψ: 2Ψ(N-1)/N x b in all,
  exactly (2Ψ - C_r - C_{r+1}) b.  Stage 3's "3Ψ" adds the second all-gather
  (backward): (3Ψ - C_r - 2C_{r+1}) b.  (The embedding's backward reads no
  weights; following the paper's and FSDP's uniform rule we gather it anyway.)
"""

from __future__ import annotations

import argparse
import functools
import gc
from typing import Any

import numpy as np
from mpi4py import MPI

from minipar.collectives import _base as B
from minipar.collectives import all_gather, reduce_scatter, ring_allreduce
from minipar.comm.traced import TracedComm, traced
from minipar.memory import Ledger, buffers, measure
from minipar.nn.gpt import (
    GPT,
    GPTConfig,
    block_aux_loss,
    block_backward,
    block_forward,
    embed_backward,
    embed_forward,
    head_backward,
    head_forward,
)
from minipar.nn.loss import cross_entropy_backward, cross_entropy_forward
from minipar.optim import FlatParams
from minipar.plan.zero import STAGE_FORMULAS, zero_comm_bytes_per_rank, zero_model_state_bytes
from minipar.precision import ModelStates, get

STAGES = (0, 1, 2, 3)


def check_stage(stage: Any) -> int:
    if isinstance(stage, bool) or not isinstance(stage, (int, np.integer)) or stage not in STAGES:
        raise ValueError(f"ZeRO stage must be 0 (plain DP), 1 (optimizer states), 2 (+ gradients) "
                         f"or 3 (+ parameters); got {stage!r}")
    return int(stage)


def shard_range(psi: int, world: int, rank: int) -> tuple[int, int]:
    """[lo, hi) of the flat buffer of ``psi`` elements that ``rank`` owns (array_split rule)."""
    if world > psi:
        raise ValueError(f"{world} ranks but only {psi} parameters to shard: every rank must own "
                         "at least one element; use fewer ranks or a bigger model")
    counts = B.chunk_counts(psi, world)
    lo = sum(counts[:rank])
    return lo, lo + counts[rank]


@functools.lru_cache(maxsize=16)
def layout_of(cfg: GPTConfig) -> FlatParams:
    """The flat buffer's layout (cached: one table per configuration, not per engine)."""
    return FlatParams.from_shapes(GPT(cfg).param_shapes())


@functools.lru_cache(maxsize=16)
def units(cfg: GPTConfig) -> tuple[tuple[int, int, FlatParams, str], ...]:
    """(lo, hi, local layout, prefix) of embedding, blocks and head, in buffer order."""
    layout = layout_of(cfg)
    groups = [("", ("tok_emb", "pos_emb"))]
    groups += [(f"blocks.{i}.", tuple(n for n in layout.names if n.startswith(f"blocks.{i}.")))
               for i in range(cfg.n_layer)]
    groups.append(("", ("ln_f.gamma", "ln_f.beta", "lm_head")))
    out, at = [], 0
    for prefix, names in groups:
        lo, hi = layout.span(names[0])[0], layout.span(names[-1])[1]
        assert lo == at, "units must tile the flat buffer in order"
        shapes = {n[len(prefix):]: layout.shapes[layout.names.index(n)] for n in names}
        out.append((lo, hi, FlatParams.from_shapes(shapes), prefix))
        at = hi
    return tuple(out)


def reduce_scatter_counts(comm: Any, x: np.ndarray, counts: list[int]) -> np.ndarray:
    """Ring reduce-scatter (sum) where rank i gets ``counts[i]`` consecutive elements of x.

    :func:`minipar.collectives.reduce_scatter` cut at given chunk sizes (a
    unit's overlap with each rank's shard); rank r sends sum(counts) - counts[r].
    """
    return reduce_scatter(comm, x, counts=counts)


class _Slot:
    """Stands in a saved-for-backward tree for a parameter that was freed (stage 3)."""

    __slots__ = ("name",)

    def __init__(self, name: str) -> None:
        self.name = name


def _swap(tree: Any, table: dict[int, Any]) -> Any:
    if id(tree) in table:
        return table[id(tree)]
    if isinstance(tree, _Slot):
        return table[tree.name]
    if isinstance(tree, (list, tuple)):
        return type(tree)(_swap(v, table) for v in tree)
    if isinstance(tree, dict):
        return {k: _swap(v, table) for k, v in tree.items()}
    return tree


class ZeRO:
    """One rank's part of ZeRO-``stage`` training of a GPT.

    ``init`` is the full float64 initial parameter dict (every rank draws the
    same; partition-independent init) — kept only as the stage allows.
    Attributes: ``params`` full flat 16-bit/param-dtype buffer (stages 0-2, else
    None), ``grads`` full flat gradient buffer (stages 0-1, else None),
    ``states`` the :class:`~minipar.precision.ModelStates` of this rank's
    slice ``opt_range`` (master weights, moments; its params/grads are views
    into the full buffers where those exist).
    """

    def __init__(self, comm: Any, model: GPT, init: dict[str, Any], stage: int,
                 precision: str = "float64", optimizer: str = "adamw", **opt_kwargs: Any) -> None:
        self.stage, self.policy = check_stage(stage), get(precision)
        if str(model.cfg.dtype) != self.policy.model_dtype:
            raise ValueError(f"model dtype {model.cfg.dtype} does not match precision "
                             f"{precision!r} (expects {self.policy.model_dtype})")
        self.comm: TracedComm = traced(comm)
        self.model, self.units, self.layout = model, units(model.cfg), layout_of(model.cfg)
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

    # -- one training step ---------------------------------------------------
    def train_step(self, tokens: Any, targets: Any, weight: float = 1.0) -> float:
        """Forward, backward, communication and optimizer step on this rank's rows.

        ``weight`` = b_r / B (``common.loss_weight``): the gradients are those
        of weight x local mean loss, and summing over ranks gives the serial
        mean.  Returns weight x local loss (sum it over ranks for the loss).
        """
        loss = self._forward_backward(tokens, targets, weight * self.states.loss_scale)
        if self.stage == 0:
            self.grads[...] = ring_allreduce(self.comm, self.grads)
        elif self.stage == 1:
            self.states.grads[...] = reduce_scatter(self.comm, self.grads)
        found_inf = None
        if self.states.scaler is not None:  # every rank must agree to skip a step
            with self.comm.operation("found_inf"):
                flag = np.array([float(self.states.local_found_inf())])
                found_inf = bool(ring_allreduce(self.comm, flag)[0] > 0)
        self.states.step(found_inf)
        if self.stage in (1, 2):
            self.params[...] = all_gather(self.comm, self.states.params)
        self.step_count += 1
        return weight * loss

    def _fetch(self, u: int) -> dict[str, Any]:
        """Unit u's parameters by local name: views (stages 0-2) or all-gathered (3)."""
        a, b, lay, _ = self.units[u]
        if self.stage < 3:
            return lay.unflatten(self.params[a:b])
        lo, hi = self.shard
        part = self.states.params[max(a, lo) - lo: max(min(b, hi), lo) - lo]
        return lay.unflatten(all_gather(self.comm, part))

    def _deliver(self, u: int, grads: dict[str, Any]) -> None:
        """Unit u's gradients: into the full buffer (0-1) or reduce-scattered to owners (2-3)."""
        a, b, lay, _ = self.units[u]
        if self.stage <= 1:
            for name, view in lay.unflatten(self.grads[a:b]).items():
                view[...] = grads[name]
            return
        flat = lay.flatten({k: grads[k] for k in lay.names}, self.policy.param_dtype)
        counts = [max(0, min(b, h) - max(a, lo)) for lo, h in
                  (shard_range(self.layout.size, self.comm.size, q) for q in range(self.comm.size))]
        lo, hi = self.shard
        self.states.grads[max(a, lo) - lo: max(min(b, hi), lo) - lo] = \
            reduce_scatter_counts(self.comm, flat, counts)

    def _forward_backward(self, tokens: Any, targets: Any, scale: float) -> float:
        """GPT.loss_and_grads, unit by unit; under stage 3 a unit's parameters live only
        between its fetch and the end of its forward (or backward): saved activations
        refer to them by name (``_Slot``) in between."""
        cfg, last = self.model.cfg, len(self.units) - 1
        saved: list[Any] = []
        x = tokens
        for u in range(last + 1):
            p = self._fetch(u)
            if u == 0:
                x, s = embed_forward(p, x, cfg)
            elif u < last:
                x, s = block_forward(p, x, cfg)
            else:
                x, s = head_forward(p, x)
            saved.append(_swap(s, {id(v): _Slot(k) for k, v in p.items()}))
            if set(buffers(p)) & set(buffers(saved[-1])):  # the freeing is checked, not hoped
                raise RuntimeError(f"unit {u}: an activation saved for backward holds a view "
                                   "of the unit's parameters, which stage 3 must free")
            del p, s
        ce, s_ce = cross_entropy_forward(x, targets)
        loss = ce + sum(block_aux_loss(s) for s in saved[1:last])
        dx = cross_entropy_backward(s_ce, scale)
        del x, s_ce
        for u in reversed(range(last + 1)):
            p = self._fetch(u)  # the unit's second all-gather under stage 3
            s = _swap(saved.pop(), p)
            if u == last:
                dx, g = head_backward(s, dx)
            elif u > 0:
                dx, g = block_backward(p, s, dx, scale)
            else:
                g = embed_backward(s, dx)
            self._deliver(u, g)
            del p, s, g
        return float(loss)

    # -- what a rank holds, and the whole model for checks -------------------
    def ledger(self) -> Ledger:
        """Model-state bytes this rank holds, by category (each buffer once)."""
        led = Ledger(self.comm.rank)
        led.add("params", "params", self.params if self.params is not None else self.states.params)
        led.add("grads", "grads", self.grads if self.grads is not None else self.states.grads)
        led.add("optimizer states", "moments", self.states.optimizer.state_arrays())
        if self.states.master is not None:
            led.add("optimizer states", "fp32 master weights", self.states.master)
        return led

    def full_params(self) -> np.ndarray:
        """The whole flat parameter buffer (stage 3 all-gathers it: op ``gather_for_check``)."""
        if self.params is not None:
            return self.params.copy()
        with self.comm.operation("gather_for_check"):
            return all_gather(self.comm, self.states.params)


# ----------------------------------------------------------------- minipar run zero
def add_run_arguments(parser: argparse.ArgumentParser) -> None:
    """``--stage`` and the model/task options of :mod:`minipar.parallel.common`."""
    from minipar.parallel.common import add_model_arguments

    parser.add_argument("--stage", type=int, default=1, help="ZeRO stage 0-3 (default 1)")
    add_model_arguments(parser)


def measure_stage(comm: Any, spec: Any, stage: int) -> dict[str, Any]:
    """Train ``spec.steps`` steps of ZeRO-``stage`` on ``comm``; this rank's measurements.

    Returns local losses (weighted), bytes sent per step (all operations of the
    steps), the ledger by category, tracemalloc bytes held by the model states
    (net bytes of building the engine, and net bytes still held after the steps:
    a full gradient or gathered parameter buffer left behind would show here)
    and the tracemalloc peak of a step (activations and transients).
    """
    from minipar.parallel.common import loss_weight

    c = traced(comm)
    check_stage(stage)
    model, init = spec.model(), spec.initial_params()
    w = loss_weight(spec.batch, c.rank, c.size)
    warm = ZeRO(c, model, init, stage, spec.precision, spec.optimizer, **spec.opt_kwargs())
    warm.train_step(*spec.local_batch(0, c.rank, c.size), w)  # first-use caches (causal
    del warm  # masks, layout tables, NumPy's dtype caches) fill outside the measured regions
    c.stats.reset()
    gc.collect()
    losses, peak = [0.0] * spec.steps, 0
    with measure() as whole:
        with measure() as built:
            eng = ZeRO(c, model, init, stage, spec.precision, spec.optimizer, **spec.opt_kwargs())
        for s in range(spec.steps):
            with measure() as step:
                losses[s] = eng.train_step(*spec.local_batch(s, c.rank, c.size), w)
            peak = max(peak, step.peak_bytes)
        gc.collect()  # cyclic garbage of the steps is not held memory
    return {"engine": eng, "losses": losses, "bytes_sent_per_step": c.stats.bytes_sent() / spec.steps,
            "ledger": eng.ledger().bytes_by_category(), "tracemalloc_bytes": built.current_bytes,
            "held_after_steps_bytes": whole.current_bytes, "step_peak_bytes": peak,
            "shard": eng.shard}


def formulas(psi: int, n: int, stage: int, precision: str) -> dict[str, Any]:
    """The paper's per-rank figures for this run: model-state bytes and bytes sent per step."""
    pol = get(precision)
    p = pol.param_dtype.itemsize
    k = 12 if pol.master_dtype is not None else 2 * np.dtype(pol.state_dtype).itemsize
    sizes = "" if precision == "mixed" else f" with {p}-byte params and grads (2 in the paper)"
    return {"model_state": zero_model_state_bytes(psi, n, stage, k, p, p),
            "model_state_text": f"{STAGE_FORMULAS[stage]}{sizes}, K={k}",
            "bytes": zero_comm_bytes_per_rank(psi, n, stage, p),
            "bytes_text": f"{3 if stage == 3 else 2}Ψ(N-1)/N x {p} bytes"}


def run_worker(options: dict[str, Any]) -> dict[str, Any] | None:
    """``minipar run zero --stage K``: the documented summary on rank 0 (None elsewhere)."""
    from minipar.parallel.common import RunSpec, check_world, max_abs_diff, parity, serial_reference

    stage = check_stage(options.get("stage", 1))
    spec = RunSpec.from_options(options)
    comm = TracedComm(MPI.COMM_WORLD)
    spec.model()  # bad sizes: ValueError on every rank before any message
    check_world(spec.batch, comm.size)
    m = measure_stage(comm, spec, stage)
    with comm.operation("report"):
        losses = ring_allreduce(comm, np.array(m["losses"], dtype=np.float64))
    final = m["engine"].full_params()
    rows = comm.comm.gather((m["bytes_sent_per_step"], sum(m["ledger"].values()),
                             m["tracemalloc_bytes"], m["step_peak_bytes"]))
    if comm.rank != 0:
        return None
    serial = serial_reference(spec)
    psi, n = m["engine"].layout.size, comm.size
    f = formulas(psi, n, stage, spec.precision)
    notes = [f"Ψ = {psi} parameters; ZeRO stage {stage}; precision {spec.precision}",
             "model-state bytes by tracemalloc per rank: " + ", ".join(f"{r[2]:,}" for r in rows),
             "step peak (tracemalloc, activations + transients): "
             + ", ".join(f"{r[3]:,}" for r in rows)]
    if spec.precision != "mixed":
        notes.append("the paper's memory formulas assume mixed precision (2+2+12 bytes per "
                     "parameter); this run uses the same partitioning with this precision's "
                     "sizes. Run with --precision mixed for the paper's numbers.")
    if spec.precision != "float64":
        notes.append("16-bit gradients are summed across ranks in 16 bits, in another order "
                     "than the serial run: parity is defined for float64 only.")
    return {"strategy": "zero", "stage": stage, "ranks": n, "steps": spec.steps,
            "losses": [float(v) for v in losses], "serial_losses": serial["losses"],
            "parity": parity(losses, serial["losses"], final, serial["params"]),
            "max_param_diff": max_abs_diff(final, serial["params"]),
            "bytes_sent_per_rank": [r[0] for r in rows], "bytes_formula": f["bytes"],
            "bytes_formula_text": f["bytes_text"],
            "model_state_bytes_per_rank": [r[1] for r in rows],
            "model_state_tracemalloc_per_rank": [r[2] for r in rows],
            "model_state_formula": f["model_state"],
            "model_state_formula_text": f["model_state_text"], "psi": psi, "notes": notes}
