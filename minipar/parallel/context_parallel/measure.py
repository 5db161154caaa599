"""Context parallelism, measured — контекстный параллелизм: измерения — 上下文并行的实测.

EN context parallelism: bytes and activation memory, measured · RU контекстный
параллелизм: байты и память активаций, измеренные · ZH 上下文并行：实测字节与激活内存

What :mod:`minipar.parallel.context_parallel.engine` claims, as numbers next to the
formulas (b batch rows, s sequence, d model width, H heads, P = cp ranks,
i bytes per element, L layers, Ψ parameters):

**Bytes one rank sends per training step** (counted by the traced
communicator, per operation):

=====================  ==================================================  =======================
operation              exact formula (P divides s, and H for Ulysses)      paper's figure
=====================  ==================================================  =======================
``ulysses_a2a``        L · 2 · 4·b·s·d·(P−1)/P² · i  (forward + backward)   4Nh/P per link per layer
``ring_attention``     L · (2(P−1) + 2(P−1) + 2P) · b·s·d/P · i             2(P−1)·b·s·h/P forward
``cp_grad_allreduce``  ring all-reduce of Ψ elements, 2(P−1)/P · Ψ · i      Patarasuk & Yuan
``cp_loss_allreduce``  ring all-reduce of one float64
=====================  ==================================================  =======================

(Ulysses: :func:`ulysses_bytes_per_rank`; ring: :func:`ring_forward_bytes` /
:func:`ring_backward_bytes`, the paper's is
:func:`minipar.plan.activations.ring_attention_bytes_per_rank`.)

**Causal work per rank** (:func:`score_elements`): the scores q·k a rank
computes per (row, head) in a forward; zigzag gives every rank (2P+1)·c².


**Attention activation memory per rank per layer** — the bytes of the
distinct buffers the attention core saves for its backward (a ledger,
:func:`minipar.memory.nbytes`; q, k and v are views of one buffer):

    serial    (3·b·s·d + b·H·s²) · i                 q, k, v and the softmax A
    Ulysses   (3·b·s·d + b·H·s²) · i / P             the same for H/P heads: 1/P
    ring      (4·b·s·d · i + b·H·s · i_c) / P        q, k, v, o and lse: no s² term

(i_c: the compute dtype's bytes, lse is kept there).  The whole layer's other
activations (LayerNorms, projections, MLP) are per token, so they are 1/P of
the serial layer's under both kinds.

**The same, measured by tracemalloc** (:func:`attention_activation_tracemalloc`,
:func:`minipar.memory.measure`): one attention core's forward on this rank's
fused qkv (made inside the measured region, dropped with the output after it),
after a warm-up call; the bytes still allocated are what the forward keeps
alive for backward.  NumPy registers its buffers with tracemalloc, so this is
the ledger plus the Python objects around the arrays (the saved tuple, array
headers: a few hundred bytes, independent of b, s, d), and equals the ledger
within 2% once a rank's share is above ~50 KB (tests/mpi/cp_check.py).
"""

from __future__ import annotations

import gc
from typing import Any

import numpy as np

from minipar import checks, memory
from minipar.backend import to_device
from minipar.collectives.cost import allreduce_bytes_sent
from minipar.comm.topology import Grid
from minipar.comm.traced import traced
from minipar.nn import GPT, executor
from minipar.nn.dtypes import compute_dtype
from minipar.parallel.context_parallel import ulysses
from minipar.parallel.context_parallel.allgather_attention import OP as ALLGATHER_OP
from minipar.parallel.common import OP_FP8_AMAX
from minipar.parallel.context_parallel.engine import OP_GRADS, OP_LOSS, ContextParallel
from minipar.parallel.context_parallel.layout import Sharding
from minipar.parallel.context_parallel.model import CPAttention
from minipar.parallel.context_parallel.options import sharding
from minipar.parallel.context_parallel.ring_attention import OP as RING_OP
from minipar.parallel.context_parallel.ring_attention import block_pairs
from minipar.parallel.mappings import all_to_all, gather_from_sequence_parallel_region
from minipar.parallel.mappings_measure import pair_bytes_sent
from minipar.plan.activations import (
    ring_attention_bytes_per_rank,
    ulysses_alltoall_elements_per_link,
)

__all__ = ["allgather_bytes_per_rank", "attention_activation_formula", "attention_bytes_by_op",
           "usp_bytes_per_rank", "attention_activation_tracemalloc",
           "attention_bytes_per_layer", "figures", "measure",
           "measured_attention_activation", "op_counters", "paper_attention_bytes",
           "ring_backward_bytes", "ring_forward_bytes", "score_elements",
           "serial_attention_activation", "step_bytes_formula", "ulysses_bytes_per_rank"]



def ring_forward_bytes(b: int, s: int, d: int, P: int, itemsize: int,
                       dkv: int | None = None) -> int:
    """Bytes one rank sends in one layer's ring forward: 2(P−1)·b·(s/P)·K·d_h·itemsize
    (``dkv`` = K·d_h, the key (or value) width: d unless grouped-query attention)."""
    return 2 * (P - 1) * b * (s // P) * (dkv or d) * itemsize


def ring_backward_bytes(b: int, s: int, d: int, P: int, itemsize: int,
                        acc_itemsize: int | None = None, dkv: int | None = None) -> int:
    """Bytes one rank sends in one layer's ring backward: K, V P−1 hops, dK, dV P hops
    (``acc_itemsize``: the accumulators' compute dtype; default ``itemsize``)."""
    if P == 1:
        return 0
    e = b * (s // P) * (dkv or d)
    return 2 * (P - 1) * e * itemsize + 2 * P * e * (acc_itemsize or itemsize)


def ulysses_bytes_per_rank(b: int, s: int, d: int, n_head: int, P: int, rank: int,
                           itemsize: int, n_kv_head: int | None = None) -> int:
    """Bytes ``rank`` sends in one layer's Ulysses forward (the backward sends the same),
    exactly: the QKV all-to-all plus the output's reverse one (``pair_bytes_sent``); with
    K < P key/value heads each travels as P/K copies (K' = P)."""
    dh, kv = d // n_head, n_kv_head or n_head
    kvp = kv * max(P // kv, 1)
    qkv = pair_bytes_sent(all_to_all, (b, s, P, (n_head + 2 * kvp) * dh // P), itemsize, P,
                          rank, split_axis=2, concat_axis=1)[0]
    out = pair_bytes_sent(all_to_all, (b, s, n_head, dh), itemsize, P, rank,
                          split_axis=2, concat_axis=1)[1]
    return qkv + out


def allgather_bytes_per_rank(b: int, s: int, dkv: int, P: int, rank: int, itemsize: int,
                             acc_itemsize: int | None = None) -> dict[str, int]:
    """Bytes ``rank`` sends in one layer of all-gather CP: the all-gather of K and V
    (b, s, 2·K·d_h) forward, the reduce-scatter of dK, dV backward (compute dtype),
    exactly (``pair_bytes_sent``): (P−1)·b·(s/P)·2·K·d_h elements each way (ring)."""
    shape = (b, s, 2 * dkv)
    fwd = pair_bytes_sent(gather_from_sequence_parallel_region, shape, itemsize, P, rank)[0]
    bwd = pair_bytes_sent(gather_from_sequence_parallel_region, shape,
                          acc_itemsize or itemsize, P, rank)[1]
    return {"forward": fwd, "backward": bwd}


def score_elements(layout: Sharding, rank: int) -> int:
    """Scores q·k one rank computes per (batch row, head) in a ring forward: its causal work
    (the block pairs :func:`~minipar.parallel.context_parallel.ring_attention.block_pairs`
    gives it, over every rank's keys)."""
    return sum((q.stop - q.start) * (k.stop - k.start)
               for j in range(layout.P) for q, k, _, _ in block_pairs(layout, rank, j))

def attention_activation_formula(kind: str, b: int, s: int, d: int, H: int, P: int,
                                 itemsize: int, compute_itemsize: int | None = None,
                                 n_kv_head: int | None = None, ulysses: int = 1) -> int:
    """Bytes the attention core of one layer saves on one rank (``kind`` "serial" too);
    ``n_kv_head`` K key/value heads (K·d_h = dkv columns each of k and v); USP: ring
    attention's on the gathered positions of H/U heads, K' = max(K, U)."""
    checks.one_of("kind", kind, ("serial", "ulysses", "ring", "allgather", "usp"))
    ic, kv = compute_itemsize or itemsize, n_kv_head or H
    if kind == "usp":
        kv = max(kv, ulysses)
    dkv = kv * (d // H)
    if kind == "serial":
        return (b * s * (d + 2 * dkv) + b * H * s * s) * itemsize
    if kind == "ulysses":  # fewer key/value heads than P: P copies travel
        dkv = max(kv, P) * (d // H)
        return (b * s * (d + 2 * dkv) + b * H * s * s) * itemsize // P
    if kind == "allgather":  # mine, and the whole sequence's K and V
        return ((b * s * (2 * d + 2 * dkv) // P + 2 * b * s * dkv) * itemsize
                + b * H * s * ic // P)
    return (b * s * (2 * d + 2 * dkv) * itemsize + b * H * s * ic) // P


def attention_activation_tracemalloc(comm: Any, kind: str, zigzag: bool, b: int, s: int,
                                    d: int, H: int, dtype: str = "float64",
                                    seed: int = 0, n_kv_head: int | None = None,
                                    ulysses: int | None = None) -> dict[str, int]:
    """What one attention core's forward keeps alive for backward on this rank, measured.

    Collective over ``comm`` (the cp group: every rank calls it).  A random fused qkv of
    the whole sequence (b, s, (H + 2K)·d_h) is cut to this rank's positions; the core runs
    once to warm caches (the causal mask, first-call buffers), then once inside
    :func:`minipar.memory.measure`, its qkv made inside the region and dropped with the
    output after it.  Returns ``tracemalloc`` (bytes still held), ``peak`` (the forward's
    high-water mark), ``ledger`` (:func:`minipar.memory.nbytes` of what it saved) and
    ``formula`` (:func:`attention_activation_formula`), bytes on this rank."""
    c = traced(comm)
    P, kv = c.size, n_kv_head or H
    layout = sharding(s, P, kind, zigzag, ulysses)
    core = CPAttention(c, kind, layout, H, kv)
    width = (H + 2 * kv) * (d // H)
    full = np.random.default_rng(seed).standard_normal((b, s, width)).astype(dtype)
    mine = to_device(np.ascontiguousarray(full[:, layout.positions(c.rank)]))
    del full
    o, saved = core.forward(mine.copy())  # warm-up
    del o, saved
    gc.collect()
    with memory.measure() as region:
        qkv = mine.copy()
        o, saved = core.forward(qkv)
        del o, qkv
        gc.collect()
    book = memory.nbytes(saved)
    del saved
    i, ic = np.dtype(dtype).itemsize, compute_dtype(np.dtype(dtype)).itemsize
    return {"tracemalloc": int(region.current_bytes), "peak": int(region.peak_bytes),
            "ledger": book,
            "formula": attention_activation_formula(kind, b, s, d, H, P, i, ic, kv,
                                                    ulysses or 1)}


def measured_attention_activation(kept: list[Any]) -> list[int]:
    """Per block: bytes of the distinct buffers its attention core saved (units' ``kept``)."""
    return [memory.nbytes(k["attn"][1]) for k in kept[1:-1]]


def serial_attention_activation(spec: Any, tokens: Any) -> list[int]:
    """The serial GPT's per-block attention-core bytes, measured the same way."""
    params = GPT(spec.config()).init(spec.seed)
    _, kept = executor.forward(GPT(spec.config()).units(), executor.Hooks(params), tokens)
    return measured_attention_activation(kept)


def usp_bytes_per_rank(b: int, s: int, d: int, n_head: int, n_kv_head: int, U: int, R: int,
                       rank: int, itemsize: int, acc_itemsize: int | None = None
                       ) -> dict[str, dict[str, int]]:
    """Bytes ``rank`` (= g·U + u) sends in one layer of USP, by part: ``ulysses_a2a`` (the
    all-to-alls of a sequence of s/R over U ranks) and ``ring_attention`` (over R ranks,
    K'/U key/value heads of s/R positions), each ``{"forward", "backward"}``."""
    a2a = ulysses_bytes_per_rank(b, s // R, d, n_head, U, rank % U, itemsize, n_kv_head)
    dkv = max(n_kv_head, U) * (d // n_head) // U
    return {ulysses.OP: {"forward": a2a, "backward": a2a},
            RING_OP: {"forward": ring_forward_bytes(b, s, d, R, itemsize, dkv),
                      "backward": ring_backward_bytes(b, s, d, R, itemsize, acc_itemsize, dkv)}}


def attention_bytes_by_op(cp: ContextParallel) -> dict[str, dict[str, int]]:
    """Exact bytes this rank sends per layer for attention, by operation: forward and
    backward."""
    spec, P, i = cp.spec, cp.world, np.dtype(cp.cfg.dtype).itemsize
    ic, kv = compute_dtype(cp.cfg.dtype).itemsize, cp.cfg.n_kv_head
    dkv = kv * (spec.d_model // spec.heads)
    if cp.kind == "usp":
        U = cp.layout.U
        return usp_bytes_per_rank(spec.batch, spec.seq, spec.d_model, spec.heads, kv, U, P // U,
                                  cp.rank, i, ic)
    if cp.kind == "ulysses":
        f = ulysses_bytes_per_rank(spec.batch, spec.seq, spec.d_model, spec.heads, P, cp.rank,
                                   i, kv)
        return {ulysses.OP: {"forward": f, "backward": f}}
    if cp.kind == "allgather":
        return {ALLGATHER_OP: allgather_bytes_per_rank(spec.batch, spec.seq, dkv, P, cp.rank, i,
                                                       ic)}
    return {RING_OP: {"forward": ring_forward_bytes(spec.batch, spec.seq, spec.d_model, P, i,
                                                    dkv),
                      "backward": ring_backward_bytes(spec.batch, spec.seq, spec.d_model, P, i,
                                                      ic, dkv)}}


def attention_bytes_per_layer(cp: ContextParallel) -> dict[str, int]:
    """Exact bytes this rank sends per layer for attention: forward and backward."""
    parts = attention_bytes_by_op(cp).values()
    return {w: sum(p[w] for p in parts) for w in ("forward", "backward")}


def step_bytes_formula(cp: ContextParallel) -> dict[str, int]:
    """Exact bytes per operation this rank sends in one training step; per-tensor FP8
    (``fp8_amax``): a ring all-reduce of one FP32 amax for each of a linear layer's four
    cut inputs (x forward, dy in dgrad, x and dy in wgrad), four linear layers a block."""
    psi, gi = cp.states.layout.size, cp.states.grads.dtype.itemsize
    out = {op: cp.spec.layers * (f["forward"] + f["backward"])
           for op, f in attention_bytes_by_op(cp).items()}
    if cp.cfg.fp8 == "tensor" and not cp.spec.experts and cp.world > 1:
        out[OP_FP8_AMAX] = 16 * cp.spec.layers * allreduce_bytes_sent(1, 4, cp.world, cp.rank,
                                                                      "ring")
    return {**out, OP_GRADS: allreduce_bytes_sent(psi, gi, cp.world, cp.rank, "ring"),
            OP_LOSS: allreduce_bytes_sent(1, 8, cp.world, cp.rank, "ring")}


def paper_attention_bytes(kind: str, b: int, s: int, d: int, P: int, itemsize: int,
                          ulysses: int = 1) -> float:
    """The paper's per-layer forward figure: Ulysses 4Nh/P per link, ring 2(P−1)·b·s·h/P,
    all-gather (P−1)/P·2·b·s·h (multi-head attention); USP (U·R = P): Ulysses' 4Nh/U on a
    group's N = b·s/R, plus the ring's 2(R−1)·b·s·(h/U)/R."""
    if kind == "usp":
        r = P // ulysses
        return (ulysses_alltoall_elements_per_link(b * s // r, d, ulysses) * itemsize
                + ring_attention_bytes_per_rank(s, b, d // ulysses, r, itemsize))
    if kind == "allgather":
        return (P - 1) * 2 * b * s * d * itemsize / P
    if kind == "ulysses":
        return ulysses_alltoall_elements_per_link(b * s, d, P) * itemsize
    return ring_attention_bytes_per_rank(s, b, d, P, itemsize)


def figures(cp: ContextParallel, steps: int, before: dict[str, int] | None = None,
            traffic: dict[str, int] | None = None) -> dict[str, Any]:
    """This rank's figures of an engine that has trained ``steps`` steps.

    ``before``: the traced counters of the step operations before those steps
    (:func:`op_counters`; default none: the grid's communicator counted only them);
    ``traffic``: the engine's ``traffic()`` over those steps (default: taken now).
    Returns ``bytes_by_op`` (per step, counted), ``bytes_by_op_formula``,
    ``bytes_by_axis`` (per step), ``attention_bytes_per_layer`` (counted forward of one
    layer, and the formula), ``activation`` (measured per layer, formula, serial),
    ``activation_tracemalloc`` (one layer's attention core, the run's sizes and dtype:
    :func:`attention_activation_tracemalloc`), ``score_elements``.  Collective over cp."""
    spec, kind = cp.spec, cp.kind
    stats = cp.grid.world.stats
    before = before or {}
    counted = {op: (stats.bytes_sent(op) - before.get(op, 0)) // steps
               for op in step_bytes_formula(cp)}
    traffic = cp.traffic() if traffic is None else traffic
    axes = {a: v // steps for a, v in traffic.items() if v}
    # one more forward, counted alone: a layer's attention forward bytes
    tokens, _ = spec.global_batch(0)
    ops = list(attention_bytes_by_op(cp))
    b0 = sum(stats.bytes_sent(op) for op in ops)
    _, kept = cp.forward(cp.states.param_views(), tokens)
    fwd_layer = (sum(stats.bytes_sent(op) for op in ops) - b0) // spec.layers
    measured = measured_attention_activation(kept)
    del kept
    traced_mem = attention_activation_tracemalloc(cp.comm, kind, cp.zigzag, spec.batch, spec.seq,
                                                  spec.d_model, spec.heads, cp.cfg.dtype,
                                                  n_kv_head=cp.cfg.n_kv_head,
                                                  ulysses=getattr(cp.layout, "U", None))
    i = np.dtype(cp.cfg.dtype).itemsize
    ic = compute_dtype(cp.cfg.dtype).itemsize
    args = (spec.batch, spec.seq, spec.d_model, spec.heads, cp.world, i, ic, cp.cfg.n_kv_head,
            getattr(cp.layout, "U", 1))
    return {
        "kind": kind, "zigzag": cp.zigzag,
        "positions": [int(p) for p in cp.positions],
        "bytes_by_op": counted, "bytes_by_op_formula": step_bytes_formula(cp),
        "bytes_by_axis": axes,
        "attention_forward_bytes_per_layer": fwd_layer,
        "attention_bytes_per_layer_formula": attention_bytes_per_layer(cp),
        "attention_paper_bytes_per_layer": paper_attention_bytes(
            kind, spec.batch, spec.seq, spec.d_model, cp.world, i, getattr(cp.layout, "U", 1)),
        "activation_per_layer": measured,
        "activation_tracemalloc": traced_mem,
        "activation_formula": attention_activation_formula(kind, *args),
        "serial_activation_formula": attention_activation_formula("serial", *args),
        "score_elements": (score_elements(cp.layout, cp.rank) * spec.heads if kind == "ring"
                           else score_elements(cp.layout.ring, cp.rank // cp.layout.U)
                           * spec.heads // cp.layout.U if kind == "usp"
                           else sum(n * (a + n) for a, n in cp.layout.chunks(cp.rank))
                           * spec.heads if kind == "allgather"
                           else spec.heads // cp.world * spec.seq * spec.seq),
    }


def op_counters(cp: ContextParallel) -> dict[str, int]:
    """The traced bytes sent so far by each operation of a step (``figures``' ``before``)."""
    stats = cp.grid.world.stats
    return {op: stats.bytes_sent(op) for op in step_bytes_formula(cp)}


def measure(comm: Any, spec: Any, kind: str, zigzag: bool | None = None,
            ulysses: int | None = None) -> dict[str, Any]:
    """Train ``spec`` with context parallelism on all of ``comm``'s ranks; this rank's figures.

    A grid of cp ranks, the engine, ``spec.steps`` steps on the global batches
    (:meth:`~minipar.parallel.common.RunSpec.batch_at`), then :func:`figures`, plus
    ``losses`` and ``params`` (final flat).  The grid is freed after."""
    grid = Grid(comm, cp=traced(comm).size)
    try:
        cp = ContextParallel(grid, spec, kind, zigzag, ulysses)
        before = op_counters(cp)
        cp.traffic()
        losses = [cp.step(spec.batch_at(s)).loss for s in range(spec.steps)]
        traffic = cp.traffic()
        out = {"losses": losses, "params": cp.states.params.copy(),
               **figures(cp, spec.steps, before, traffic)}
        cp.close()
    finally:
        grid.free()
    return out
