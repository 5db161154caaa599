"""Sequence parallelism (Megatron-SP): the LayerNorm regions split along the sequence —
параллелизм по последовательности — 序列并行.

EN sequence parallelism · RU параллелизм по последовательности · ZH 序列并行

Korthikanti, Casper, Lym, McAfee, Andersch, Shoeybi & Catanzaro 2022, "Reducing
Activation Recomputation in Large Transformer Models", arXiv 2205.05198, §4.2.2.
Tensor parallelism leaves the LayerNorms (and dropouts) of a block replicated: every
one of the t ranks holds their whole b·s·h activations.  Sequence parallelism cuts them
along the sequence instead: rank r keeps positions [r·s/t, (r+1)·s/t).  The two
tensor-parallel regions need the whole sequence, so the conjugate pairs change
(:mod:`minipar.comm.pairs`):

    TP:     LN (replicated) ─ f ─→ column … row ─ g ─→ + residual (replicated)
    TP+SP:  LN (seq shard)  ─ SP's f = all-gather(seq) ─→ column … row
                            ─ SP's g = reduce-scatter(seq) ─→ + residual (seq shard)

An all-reduce *is* a reduce-scatter followed by an all-gather, so the pairs move the same
bytes as TP's f and g: per block 2 all-gathers + 2 reduce-scatters forward, the same
backward, each (t−1)/t × b·s·h elements.  The column-parallel layers keep only their
sequence shard of X for backward and all-gather it again there (op ``sp_regather``:
2 more all-gathers per block, as Megatron does), and the parameters that see one shard
of the sequence (LayerNorm γ, β, the row-parallel b_out, pos_emb) get their gradients
summed over the tp ranks (op ``sp_param_grads``, a few vectors per block).  It is built
as an option of the tensor-parallel layers and units (``sequence_parallel=True``,
:mod:`minipar.parallel.tensor_parallel`, :mod:`minipar.parallel.tensor_parallel_gpt`);
this module holds what is SP's own: cutting the sequence, and **measuring** the
activation memory each rank keeps per block.

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
"""

from __future__ import annotations

import gc
import tracemalloc
from typing import Any

import numpy as np

from minipar import spans
from minipar.collectives import _base as B
from minipar.nn import GPT
from minipar.nn.gpt_config import GPTConfig
from minipar.plan.activations import activation_bytes_per_layer, minipar_activation_formula

__all__ = ["MODES", "activation_bytes_per_block", "ledger", "saved_arrays", "split_sequence"]

#: what :func:`activation_bytes_per_block` measures
MODES = ("none", "tp", "tp+sp")


def split_sequence(x: Any, t: int, r: int, axis: int = 1) -> Any:
    """Rank r's positions of ``x`` along ``axis`` (the ``numpy.array_split`` rule)."""
    lo, hi = spans.span(x.shape[axis], t, r)
    return np.ascontiguousarray(np.take(x, np.arange(lo, hi), axis=axis))


def _root(a: np.ndarray) -> np.ndarray:
    while isinstance(a.base, np.ndarray):
        a = a.base
    return a


def saved_arrays(saved: Any) -> list[np.ndarray]:
    """The distinct arrays ``saved`` keeps alive: every array in it (dicts, tuples, lists
    walked), each replaced by the array that owns its memory, each counted once."""
    out: dict[int, np.ndarray] = {}
    stack = [saved]
    while stack:
        s = stack.pop()
        if isinstance(s, np.ndarray):
            if s.dtype != object:
                r = _root(s)
                out[id(r)] = r
        elif isinstance(s, dict):
            stack.extend(s.values())
        elif isinstance(s, (tuple, list)):
            stack.extend(s)
    return list(out.values())


def ledger(saved: Any) -> int:
    """Bytes of the arrays a block's ``saved`` keeps for its backward (views counted once)."""
    return sum(int(a.nbytes) for a in saved_arrays(saved))


def activation_bytes_per_block(comm: Any, cfg: GPTConfig, batch: int,
                               mode: str = "tp+sp", seed: int = 0) -> dict[str, Any]:
    """Measure the activations one block keeps on this rank (t = the size of ``comm``).

    Runs block 0 of ``GPT(cfg)`` (its parameters sliced for this rank) on a random
    input of ``batch`` x ``cfg.block_size`` positions (this rank's shard under SP), once
    to warm caches, then once measured.  Returns ``{"ledger", "tracemalloc", "formula",
    "paper", "s", "b", "h", "a", "t", "mode"}``, bytes on this rank.  ``mode`` "none" is
    the serial block (t must be 1).  Collective for "tp" and "tp+sp": every rank calls it.
    """
    from minipar.nn.units import BlockUnit
    from minipar.parallel.tensor_parallel import shard_params
    from minipar.parallel.tensor_parallel_gpt import TPBlockUnit

    if mode not in MODES:
        raise ValueError(f"unknown mode {mode!r}; one of {', '.join(MODES)}")
    c = B.traced(comm)
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
    x = np.random.default_rng(seed).standard_normal((batch, s, h)).astype(one.dtype)
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
