"""Measuring tensor and sequence parallelism: bytes sent and activations kept — измерение
тензорного параллелизма и параллелизма по последовательности — 张量并行与序列并行的测量.

EN tensor / sequence parallelism, measured · RU тензорный параллелизм и параллелизм по
последовательности: измерения · ZH 张量并行与序列并行：测量

The formulas the tests check against the counters, and the activation ledger
(Shoeybi et al. 2019, arXiv 1909.08053; Korthikanti et al. 2022, arXiv 2205.05198).
Bytes per rank per step (ring, b = my rows, s = sequence, h = d_model, L blocks,
e = bytes per element):

    tp axis, blocks:  L × 4 all-reduces of b·s·h elements  ≈ 4L × 2(t−1)/t × b·s·h·e
                      (exact: :func:`tp_block_bytes_formula`; a MoE block's MLP f and g
                      carry its E·C·h expert buffers instead: :func:`block_bytes_formula`)
    tp axis, whole:   the blocks, the embedding's g and the head's f (b·s·h each), the
                      vocab-parallel loss's b·s and 2·b·s numbers (:func:`tp_axis_bytes_formula`)
    dp axis:          one all-reduce of my slice's Ψ/t gradients ≈ 2(d−1)/d × (Ψ/t)·e

(SP moves the blocks' same bytes as all-gathers and reduce-scatters, plus the re-gather
of the saved shard in backward and the small all-reduce of the sequence-split parameters'
gradients.)

Activation memory per block, 16-bit (Korthikanti et al., Table 2, with dropout) against
minipar's own formula (no dropout; :func:`minipar.plan.activations.minipar_activation_formula`,
which lists which saved array is which term):

    mode     paper                   minipar
    none     sbh(34 + 5as/h)         sbh(40 + 2as/h) + 8sb
    tp       sbh(10 + 24/t + 5as/(ht))   sbh(8 + 32/t + 2as/(ht)) + 8sb
    tp+sp    sbh(34/t + 5as/(ht))    sbh(40/t + 2as/(ht)) + 8sb/t

:func:`activation_bytes_per_block` measures one block on each rank two ways: a *ledger*
(the bytes of the distinct arrays its ``saved`` keeps alive, a view counted as its base)
and *tracemalloc* (memory still allocated after the forward, its output dropped);
tests/test_sequence_parallel.py checks both against minipar's formula within 2%.

:class:`BlockLedger` takes the same ledger of every block during a training step (hand
it to :class:`~minipar.parallel.tensor_parallel.engine.TensorParallel` as its ``hooks``).
"""

from __future__ import annotations

import gc
import tracemalloc
from typing import Any

import numpy as np

from minipar import checks
from minipar.backend import to_device
from minipar.collectives.cost import allreduce_bytes_sent
from minipar.comm.traced import traced
from minipar.nn import GPT, executor
from minipar.nn.dtypes import compute_dtype
from minipar.nn.gpt import BlockUnit
from minipar.nn.gpt_config import GPTConfig
from minipar.nn.moe_steps import expert_capacity
from minipar.parallel.tensor_parallel.model import TPBlockUnit
from minipar.parallel.tensor_parallel.shards import shard_params, split_sequence
from minipar.plan.activations import activation_bytes_per_layer, minipar_activation_formula
from minipar.trees import arrays, owner

__all__ = ["BLOCK_OPS", "MODES", "BlockLedger", "CommClock", "activation_bytes_per_block",
           "block_bytes_formula", "bytes_by_op", "fp8_amax_bytes_formula", "calls_by_op", "ledger", "saved_arrays",
           "tp_axis_bytes_formula", "tp_block_bytes_formula"]

#: the blocks' collectives: TP's f and g, SP's all-gather and reduce-scatter
BLOCK_OPS = ("tp_f", "tp_g", "sp_f", "sp_g")
#: what :func:`activation_bytes_per_block` measures
MODES = ("none", "tp", "tp+sp")


# ----------------------------------------------------------------------------- bytes sent
def tp_block_bytes_formula(n_layer: int, b: int, s: int, h: int, t: int, rank: int,
                           itemsize: int) -> int:
    """Exact bytes rank ``rank`` of ``t`` sends per step in the blocks' f and g:
    n_layer × 4 ring all-reduces of b·s·h elements (the SP pairs send the same)."""
    return 4 * n_layer * allreduce_bytes_sent(b * s * h, itemsize, t, rank, "ring")


def block_bytes_formula(cfg: GPTConfig, b: int, s: int, t: int, rank: int,
                        itemsize: int) -> int:
    """Exact ring figure of the blocks' f and g for rank ``rank`` of ``t`` (b rows, s
    positions): b·s·h elements each, but a MoE block's MLP f and g carry its expert
    buffers, E·C·h elements (C = :func:`~minipar.nn.moe_steps.expert_capacity` of the
    replica's b·s·k assignments)."""
    h = cfg.d_model
    moe = sum(cfg.is_moe_block(i) for i in range(cfg.n_layer))
    dense = tp_block_bytes_formula(cfg.n_layer - moe, b, s, h, t, rank, itemsize)
    if not moe:
        return dense
    buffers = cfg.n_experts * expert_capacity(b * s * cfg.top_k, cfg.n_experts,
                                              cfg.capacity_factor) * h
    ring = allreduce_bytes_sent  # 2 on b·s·h (attention) + 2 on the buffers (experts)
    return dense + moe * 2 * (ring(b * s * h, itemsize, t, rank, "ring")
                              + ring(buffers, itemsize, t, rank, "ring"))


def fp8_amax_bytes_formula(cfg: GPTConfig, b: int, s: int, t: int, rank: int) -> int:
    """Exact bytes rank ``rank`` of ``t`` sends per step in FP8's amax all-reduces (op
    ``fp8_amax``, MAX, FP32; :func:`~minipar.parallel.tensor_parallel.model.fp8_splits`):
    per dense block and linear layer, three ring all-reduces of a grid of ⌈n/B⌉ global
    blocks along the cut axis by the other axis' blocks or tokens — the weight's in the
    forward and again in the input gradient, and the cut activation's (the row-parallel
    input x, the column-parallel dy) over its b·s tokens; one number each per tensor
    under ``--fp8-scaling tensor``, and a fourth: the same cut activation again in the
    weight gradient (its per-tensor amax; block tiles there run along the tokens, uncut).
    The dp (or dp·cp) ranks' per-tensor all-reduces travel on their own axis."""
    if not cfg.fp8:
        return 0
    c, m, h, f = cfg.fp8_block, b * s, cfg.d_model, cfg.d_ff
    width = (cfg.n_head + 2 * cfg.n_kv_head) * (h // cfg.n_head)
    up = lambda n: 1 if cfg.fp8 == "tensor" else -(-n // c)  # noqa: E731
    tokens = 1 if cfg.fp8 == "tensor" else m
    # (cut axis, other axis): W_qkv and the MLP's W_in by columns, W_out by rows
    attn, mlp = [(width, h), (h, h)], [(f, h), (f, h)]
    ring = allreduce_bytes_sent
    per = [sum(2 * ring(up(cut) * up(other), 4, t, rank, "ring")
               + ring(up(cut) * tokens, 4, t, rank, "ring")
               + (cfg.fp8 == "tensor") * ring(1, 4, t, rank, "ring") for cut, other in layers)
           for layers in (attn, mlp)]
    moe = sum(cfg.is_moe_block(i) for i in range(cfg.n_layer))
    return cfg.n_layer * per[0] + (cfg.n_layer - moe) * per[1]


def tp_axis_bytes_formula(cfg: GPTConfig, b: int, s: int, t: int, rank: int,
                          itemsize: int) -> int:
    """Exact bytes rank ``rank`` of ``t`` sends per step over ``tp`` under TP (not SP):
    the blocks' f and g, the embedding's g and the head's f (one ring all-reduce of
    b·s·h each), and the vocab-parallel loss's all-reduces of b·s and 2·b·s numbers in
    the compute dtype; with fewer key/value heads K than t (GQA, each replicated on
    g = t/K ranks) per block the all-reduces over g ranks of their W_qkv (h, 2·d_h) and
    b_qkv (2·d_h) gradient columns (op ``tp_kv_grads``)."""
    h, ic = cfg.d_model, compute_dtype(cfg.dtype).itemsize
    ring = allreduce_bytes_sent
    g, dh = max(t // cfg.n_kv_head, 1), h // cfg.n_head
    kv = 0 if g == 1 else cfg.n_layer * sum(
        ring(n * 2 * dh, itemsize, g, rank % g, "ring") for n in (h, 1))
    return (block_bytes_formula(cfg, b, s, t, rank, itemsize)
            + 2 * ring(b * s * h, itemsize, t, rank, "ring")
            + ring(b * s, ic, t, rank, "ring") + ring(2 * b * s, ic, t, rank, "ring") + kv
            + fp8_amax_bytes_formula(cfg, b, s, t, rank))


def bytes_by_op(stats: Any, steps: int) -> dict[str, float]:
    """Bytes sent per step, by operation, from a communicator's counters (``stats``)."""
    n = max(1, steps)
    return {op: s.bytes_sent / n for op, s in stats.ops.items() if s.bytes_sent}


def calls_by_op(stats: Any, steps: int) -> dict[str, float]:
    """Calls per step, by operation (an all-reduce, all-gather, ... is one call)."""
    n = max(1, steps)
    return {op: s.calls / n for op, s in stats.ops.items() if s.calls}


# ----------------------------------------------------------------------- activations kept
def saved_arrays(saved: Any) -> list[np.ndarray]:
    """The distinct arrays ``saved`` keeps alive: every array in it (:func:`minipar.trees.arrays`),
    each replaced by the array that owns its memory (:func:`minipar.trees.owner`), each counted
    once; object arrays (no activation bytes of their own) left out."""
    out = {id(r): r for r in map(owner, arrays(saved)) if r.dtype != object}
    return list(out.values())


def ledger(saved: Any) -> int:
    """Bytes of the arrays a block's ``saved`` keeps for its backward (views counted once)."""
    return sum(int(a.nbytes) for a in saved_arrays(saved))


class _LedgerHooks(executor.Hooks):
    """The serial hooks, and the bytes each block's ``saved`` holds (its activations)."""

    def __init__(self, params: dict[str, Any], book: list[int]) -> None:
        super().__init__(params)
        self.book = book

    def on_saved(self, unit: Any, saved: Any, x: Any) -> Any:
        if unit.name.startswith("block"):
            self.book.append(ledger(saved))
        return saved


class BlockLedger:
    """The bytes each block's ``saved`` held in the last step, in block order (``blocks``).

    ``TensorParallel(grid, spec, hooks=book)``: every step builds its executor hooks
    by calling the ledger, which starts a new list."""

    def __init__(self) -> None:
        self.blocks: list[int] = []

    def __call__(self, params: dict[str, Any]) -> executor.Hooks:
        """The serial hooks on ``params`` that also note each block's saved bytes."""
        self.blocks = []
        return _LedgerHooks(params, self.blocks)


def activation_bytes_per_block(comm: Any, cfg: GPTConfig, batch: int,
                               mode: str = "tp+sp", seed: int = 0) -> dict[str, Any]:
    """Measure the activations one block keeps on this rank (t = the size of ``comm``).

    Runs block 0 of ``GPT(cfg)`` (its parameters sliced for this rank) on a random
    input of ``batch`` x ``cfg.block_size`` positions (this rank's shard under SP), once
    to warm caches, then once measured.  Returns ``{"ledger", "tracemalloc", "formula",
    "paper", "s", "b", "h", "a", "t", "mode"}``, bytes on this rank.  ``mode`` "none" is
    the serial block (t must be 1).  Collective for "tp" and "tp+sp": every rank calls it.
    """
    checks.one_of("mode", mode, MODES)
    c = traced(comm)
    t, r = c.size, c.rank
    if mode == "none" and t != 1:
        raise ValueError(f"mode 'none' is the serial block: run it on 1 rank, not {t}")
    if cfg.n_experts:
        raise ValueError("activation_bytes_per_block measures a dense block (n_experts = 0)")
    s, h, a = cfg.block_size, cfg.d_model, cfg.n_head
    one = GPTConfig(**{**cfg.__dict__, "n_layer": 1})
    full = GPT(GPTConfig(**{**one.__dict__, "dtype": "float64"})).init(seed)
    if mode == "none":
        unit: Any = BlockUnit(one, 0)
        p = {k: v.astype(one.dtype) for k, v in unit.params(full).items()}
    else:
        unit = TPBlockUnit(one, c, 0, sequence_parallel=mode == "tp+sp")
        p = {k: v.astype(one.dtype) for k, v in
             unit.params(shard_params(full, one, t, r)).items()}
    x = to_device(np.random.default_rng(seed).standard_normal((batch, s, h)).astype(one.dtype))
    if mode == "tp+sp":
        x = split_sequence(x, t, r)
    y, saved = unit.forward(p, x)  # warm-up: the causal mask cache, first-call allocations
    del y, saved
    gc.collect()
    started = not tracemalloc.is_tracing()
    if started:
        tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        y, saved = unit.forward(p, x)
        del y
        gc.collect()
        held = tracemalloc.get_traced_memory()[0] - before
        book = ledger(saved)
        del saved
    finally:
        if started:
            tracemalloc.stop()
    tt = 1 if mode == "none" else t
    return {"ledger": book, "tracemalloc": int(held),
            "formula": minipar_activation_formula(s, batch, h, a, tt, mode,
                                                  np.dtype(one.dtype).itemsize),
            "paper": activation_bytes_per_layer(s, batch, h, a, tt, mode),
            "s": s, "b": batch, "h": h, "a": a, "t": tt, "mode": mode}


class CommClock:
    """When one rank communicates, recorded on its :class:`~minipar.comm.TracedComm` from
    outside (the layers know nothing of it; ``minipar bench tp`` and ``TensorParallel(...,
    timeline=True)`` install it): every operation scope (a blocking collective, or the
    posting of a non-blocking one) is a wait and a communication interval; every receive
    posted is communication from its posting until the first wait or scope that finds it
    complete; every ``waitall`` is a wait.  The compute intervals of a step are the step
    minus its waits, so :func:`minipar.overlap.hidden_fraction` of the two is the share of
    the messages' time the rank spent computing (0 for the blocking form, by construction).
    ``comm_named`` keeps each communication interval with its operation's name."""

    def __init__(self, comm: Any) -> None:
        import time
        from contextlib import contextmanager

        self.comm_named: list[tuple[str, float, float]] = []
        self.waits: list[tuple[float, float]] = []
        self._open: list[Any] = []
        now, irecv, waitall, operation = time.perf_counter, comm.Irecv, comm.waitall, \
            comm.operation

        def _seen(t: float) -> None:
            self.comm_named += [(str(getattr(r, "op", None) or "recv"), r.posted, t)
                                for r in self._open if r.done]
            self._open = [r for r in self._open if not r.done]

        def recorded_irecv(*args: Any, **kwargs: Any) -> Any:
            req = irecv(*args, **kwargs)
            req.posted = now()
            self._open.append(req)
            return req

        def recorded_waitall(requests: Any) -> None:
            t0 = now()
            waitall(requests)
            t1 = now()
            self.waits.append((t0, t1))
            _seen(t1)

        @contextmanager
        def recorded_operation(name: str) -> Any:
            t0 = now()
            _seen(t0)
            with operation(name) as c:
                yield c
            t1 = now()
            _seen(t1)
            self.waits.append((t0, t1))
            self.comm_named.append((name, t0, t1))

        comm.Irecv, comm.waitall, comm.operation = (recorded_irecv, recorded_waitall,
                                                    recorded_operation)

    @property
    def comm_intervals(self) -> list[tuple[float, float]]:
        return [(a, b) for _, a, b in self.comm_named]

    def timeline(self, t0: float, t1: float) -> dict[str, list[tuple[str, float, float]]]:
        """What was recorded since the step [t0, t1) began: ``compute`` (the step minus
        its waits) and ``comm`` (named intervals)."""
        from minipar.overlap import merge

        compute, at = [], t0
        for a, b in merge(w for w in self.waits if w[0] >= t0):
            compute.append(("compute", at, a))
            at = b
        compute.append(("compute", at, t1))
        return {"compute": compute, "comm": [c for c in self.comm_named if c[1] >= t0]}

    def hidden(self, t0: float, t1: float) -> float | None:
        """The hidden fraction of what was recorded since the step [t0, t1) began."""
        from minipar.overlap import hidden_fraction

        tl = self.timeline(t0, t1)
        return hidden_fraction([c[1:] for c in tl["compute"]], [c[1:] for c in tl["comm"]])

    def forget(self, before: float) -> None:
        """Drop what ended before ``before`` (a long run keeps its last step only)."""
        self.comm_named = [c for c in self.comm_named if c[2] >= before]
        self.waits = [w for w in self.waits if w[1] >= before]
