"""The tensor-parallel GPT: Megatron's MLP, attention and MoE, as units; sequence parallelism
as their option — тензорно-параллельный GPT (и параллелизм по последовательности) —
张量并行 GPT（含序列并行）.

EN tensor-parallel transformer block (Megatron-LM), sequence parallelism · RU
тензорно-параллельный блок трансформера, параллелизм по последовательности · ZH 张量并行
Transformer 块，序列并行

Shoeybi et al. 2019, arXiv 1909.08053, §3, Fig. 3, built from the layers of
:mod:`minipar.parallel.tensor_parallel.layers`; each piece is a forward and its backward
on this rank's slices, so each runs exactly one f (all-reduce backward) and one g
(all-reduce forward):

    MLP        f → [X W_in,r + b_in,r → GELU] (column, GELU local) → X_r W_out,r (row) → g → + b_out
    attention  f → QKV of my heads (column, n_head/t heads) → softmax(q kᵀ/√d_h + M) v
               → o_r W_out,r (row: the rows of my heads) → g → + b_out
    MoE        y = combine( g( Experts_r( f(dispatch(x)) ) ) )   (router replicated)
    block      x1 = x + attention(LN1(x));   y = x1 + MLP(LN2(x1))   (LayerNorms replicated)

:func:`tp_steps` hands them to the serial block walk (:func:`minipar.nn.gpt.block_forward`'s
``attn=`` / ``ffn=``), so the LayerNorms and residuals of the tensor-parallel block are the
serial code.  A block runs exactly **2 all-reduces forward** (the two g) **and 2 backward**
(the two f), each of b·s·h elements: with a ring every rank sends 4 × 2(t−1)/t × b·s·h ×
bytes per block per step (:func:`minipar.plan.tensor.tp_bytes_per_rank_per_layer`).  The
embedding (vocabulary rows, g counted as ``tp_embed``) and the head (``ln_f``, then
``lm_head`` column-parallel by vocabulary, f counted as ``tp_head``; no gather) add one
all-reduce each, and the vocab-parallel loss two small ones (``tp_ce``).

A mixture-of-experts block (Switch/GShard, :mod:`minipar.nn.moe_steps`) slices each
expert's MLP like the dense one: dispatch and the router run replicated on every rank (the
same routing everywhere), the expert buffers (E, C, d) enter through f, every rank runs
its columns of W_in and rows of W_out of every expert (b_out added on rank 0 only, so the
sum adds it once), and g sums the expert outputs before the replicated combine: again
2 all-reduces forward and 2 backward, of E·C·d elements.

**Sequence parallelism** (``sequence_parallel=True``; Korthikanti, Casper, Lym, McAfee,
Andersch, Shoeybi & Catanzaro 2022, "Reducing Activation Recomputation in Large
Transformer Models", arXiv 2205.05198, §4.2.2).  Tensor parallelism leaves the LayerNorms
(and dropouts) of a block replicated: every one of the t ranks holds their whole b·s·h
activations.  Sequence parallelism cuts them along the sequence instead: rank r keeps
positions [r·s/t, (r+1)·s/t).  The two tensor-parallel regions need the whole sequence,
so the conjugate pairs change (:mod:`minipar.parallel.mappings`):

    TP:     LN (replicated) ─ f ─→ column … row ─ g ─→ + residual (replicated)
    TP+SP:  LN (seq shard)  ─ SP's f = all-gather(seq) ─→ column … row
                            ─ SP's g = reduce-scatter(seq) ─→ + residual (seq shard)

An all-reduce *is* a reduce-scatter followed by an all-gather, so the pairs move the same
bytes as TP's f and g: per block 2 all-gathers + 2 reduce-scatters forward, the same
backward, each (t−1)/t × b·s·h elements.  The column-parallel layers keep only their
sequence shard of X for backward and all-gather it again there (op ``sp_regather``:
2 more all-gathers per block, as Megatron does), and the parameters that see one shard
of the sequence (LayerNorm γ, β, the row-parallel b_out, pos_emb) get their gradients
summed over the tp ranks (op ``sp_param_grads``, one fused all-reduce per unit).  What
this saves is measured in :mod:`minipar.parallel.tensor_parallel.measure`.

The units (:class:`TPEmbedUnit`, :class:`TPBlockUnit`, :class:`TPHeadUnit`) are
:class:`minipar.nn.units.Unit` s with the serial parameter names, so the executor's one
walk (:mod:`minipar.nn.executor`) runs them; the loss between the walks is the
vocab-parallel cross-entropy (:func:`tp_loss_and_grads`).  Tests: tests/mpi/tp_check.py
(the GPT built from them against the serial one, float64).
"""

from __future__ import annotations

from typing import Any

from minipar import spans
from minipar.backend import to_device, xp
from minipar.collectives import allreduce
from minipar.comm.traced import traced
from minipar.nn import executor
from minipar.nn.attention import (
    attention_core_backward,
    attention_core_forward,
    merge_heads,
    split_heads,
)
from minipar.nn.dtypes import up
from minipar.nn.gpt import BlockUnit, Step, block_backward, block_forward
from minipar.nn.gpt_config import GPTConfig
from minipar.nn.layers import gelu_backward, gelu_forward, layernorm_backward, layernorm_forward
from minipar.nn.moe_steps import (
    combine_backward,
    combine_forward,
    dispatch_backward,
    dispatch_forward,
    experts_backward,
    experts_forward,
)
from minipar.nn.units import Unit
from minipar.parallel.mappings import copy_to_parallel, reduce_from_parallel
from minipar.parallel.tensor_parallel.layers import (
    ColumnParallelLinear,
    RowParallelLinear,
    VocabParallelEmbedding,
    check_tp,
    shard_params,
    vocab_parallel_cross_entropy_backward,
    vocab_parallel_cross_entropy_forward,
)

__all__ = ["OP_PARAM_GRADS", "TPBlockUnit", "TPEmbedUnit", "TPHeadUnit", "TensorParallelGPT",
           "tp_attention_backward", "tp_attention_forward", "tp_gpt_units", "tp_loss_and_grads",
           "tp_mlp_backward", "tp_mlp_forward", "tp_moe_backward", "tp_moe_forward", "tp_steps"]

OP_PARAM_GRADS = "sp_param_grads"


def _rank_size(comm: Any) -> tuple[int, int]:
    c = traced(comm)
    return c.rank, c.size


# ------------------------------------------------------------------------------- MLP
def tp_mlp_forward(comm: Any, p: dict[str, Any], x: Any,
                   sequence_parallel: bool = False) -> tuple[Any, tuple]:
    """Megatron's MLP: column-parallel W_in, GELU local, row-parallel W_out, b_out once."""
    col = ColumnParallelLinear(comm, sequence_parallel=sequence_parallel)
    row = RowParallelLinear(comm, sequence_parallel=sequence_parallel)
    a, s1 = col.forward({"w": p["w_in"], "b": p["b_in"]}, x)
    h, s2 = gelu_forward(a)
    del a
    y, s3 = row.forward({"w": p["w_out"], "b": p["b_out"]}, h)
    return y, (s1, s2, s3, sequence_parallel)


def tp_mlp_backward(comm: Any, p: dict[str, Any], saved: tuple,
                    dy: Any) -> tuple[Any, dict[str, Any]]:
    """Return ``(dx, {w_in, b_in, w_out, b_out})`` (this rank's slices; b_out replicated)."""
    s1, s2, s3, sp = saved
    dh, g_row = RowParallelLinear(comm, sequence_parallel=sp).backward(
        {"w": p["w_out"], "b": p["b_out"]}, s3, dy)
    da = gelu_backward(s2, dh)
    dx, g_col = ColumnParallelLinear(comm, sequence_parallel=sp).backward(
        {"w": p["w_in"], "b": p["b_in"]}, s1, da)
    return dx, {"w_in": g_col["w"], "b_in": g_col["b"], "w_out": g_row["w"], "b_out": g_row["b"]}


# ------------------------------------------------------------------------- attention
def tp_attention_forward(comm: Any, p: dict[str, Any], x: Any, n_head: int,
                         sequence_parallel: bool = False, core: Any = None) -> tuple[Any, tuple]:
    """Self-attention with this rank's n_head/t heads (``n_head``: the model's heads).
    ``core``: another attention core on the local fused qkv (b, s, 3h/t) -> o (b, s, h/t),
    e.g. context parallelism's ``CPAttention`` (an object handed in, the hybrid's CP x TP)."""
    _, t = _rank_size(comm)
    h_local = n_head // t
    col = ColumnParallelLinear(comm, sequence_parallel=sequence_parallel)
    qkv, s_qkv = col.forward({"w": p["w_qkv"], "b": p["b_qkv"]}, x)
    if core is not None:
        o, s_core = core.forward(qkv)
    else:
        q, k, v = (split_heads(a, h_local) for a in xp.split(qkv, 3, axis=-1))
        o, s_core = attention_core_forward(q, k, v)
        o = merge_heads(o)
    del qkv
    row = RowParallelLinear(comm, sequence_parallel=sequence_parallel)
    y, s_out = row.forward({"w": p["w_out"], "b": p["b_out"]}, o)
    return y, (s_qkv, s_core, s_out, h_local, sequence_parallel)


def tp_attention_backward(comm: Any, p: dict[str, Any], saved: tuple, dy: Any,
                          core: Any = None) -> tuple[Any, dict[str, Any]]:
    """Return ``(dx, {w_qkv, b_qkv, w_out, b_out})`` (``core``: the forward's)."""
    s_qkv, s_core, s_out, h_local, sp = saved
    do, g_out = RowParallelLinear(comm, sequence_parallel=sp).backward(
        {"w": p["w_out"], "b": p["b_out"]}, s_out, dy)
    if core is not None:
        dqkv = core.backward(s_core, do)
    else:
        dq, dk, dv = attention_core_backward(s_core, split_heads(do, h_local))
        dqkv = xp.concatenate([merge_heads(dq), merge_heads(dk), merge_heads(dv)], axis=-1)
    dx, g_qkv = ColumnParallelLinear(comm, sequence_parallel=sp).backward(
        {"w": p["w_qkv"], "b": p["b_qkv"]}, s_qkv, dqkv)
    return dx, {"w_qkv": g_qkv["w"], "b_qkv": g_qkv["b"], "w_out": g_out["w"],
                "b_out": g_out["b"]}


# ----------------------------------------------------------------------------- MoE
def tp_moe_forward(comm: Any, p: dict[str, Any], x: Any, cfg: GPTConfig) -> tuple[Any, dict]:
    """MoE under TP: replicated dispatch, f on the buffers, sliced experts, g, combine."""
    r, _ = _rank_size(comm)
    h = x.reshape(-1, x.shape[-1])
    buffers, s_d = dispatch_forward(p["router"], h, cfg.n_experts, cfg.top_k,
                                    cfg.capacity_factor, cfg.aux_loss_coef)
    buffers = copy_to_parallel.forward(comm, buffers)
    pe = dict(p)
    if r:  # b_out is replicated: rank 0 adds it, g's sum then has it once
        for e in range(cfg.n_experts):
            pe[f"experts.{e}.b_out"] = xp.zeros_like(p[f"experts.{e}.b_out"])
    out, s_e = experts_forward(pe, buffers, s_d["tokens_per_expert"])
    out = reduce_from_parallel.forward(comm, out)
    y, s_c = combine_forward(out, s_d)
    return y.reshape(x.shape), {**s_d, "x_shape": x.shape, "experts": s_e, "combine": s_c}


def tp_moe_backward(comm: Any, p: dict[str, Any], saved: dict, dy: Any,
                    daux: float = 1.0) -> tuple[Any, dict[str, Any]]:
    """combine⁻¹ (replicated) → g⁻¹ → sliced experts⁻¹ → f⁻¹ (all-reduce) → dispatch⁻¹."""
    d_out, d_gates = combine_backward(saved["combine"], dy.reshape(-1, dy.shape[-1]))
    d_out = reduce_from_parallel.backward(comm, d_out)
    d_buf, g_e = experts_backward(p, saved["experts"], d_out)
    d_buf = copy_to_parallel.backward(comm, d_buf)
    dh, d_router = dispatch_backward(p["router"], saved, d_buf, d_gates, daux)
    return dh.reshape(saved["x_shape"]), {"router": d_router, **g_e}


# --------------------------------------------------------------------- the block's steps
def tp_steps(comm: Any, cfg: GPTConfig, sequence_parallel: bool = False,
             core: Any = None) -> tuple[Step, Step]:
    """The ``(attn, ffn)`` steps (:data:`minipar.nn.gpt.Step`) of a Megatron-sliced block:
    :func:`minipar.nn.gpt.block_forward` / ``block_backward`` with these is the
    tensor-parallel block (the LayerNorms and residuals are the serial code); ``core``:
    the attention core of the local heads (default: the serial one; context parallelism's)."""
    sp = sequence_parallel

    def attn_forward(q: dict[str, Any], a: Any) -> tuple[Any, Any]:
        return tp_attention_forward(comm, q, a, cfg.n_head, sp, core)

    def attn_backward(q: dict[str, Any], s: Any, dy: Any) -> tuple[Any, dict[str, Any]]:
        return tp_attention_backward(comm, q, s, dy, core)

    def ffn_forward(q: dict[str, Any], h: Any) -> tuple[Any, Any]:
        if "router" in q:
            return tp_moe_forward(comm, q, h, cfg)
        return tp_mlp_forward(comm, q, h, sp)

    def ffn_backward(q: dict[str, Any], s: Any, dy: Any,
                     daux: float = 1.0) -> tuple[Any, dict[str, Any]]:
        if "router" in q:
            return tp_moe_backward(comm, q, s, dy, daux)
        return tp_mlp_backward(comm, q, s, dy)

    return (attn_forward, attn_backward), (ffn_forward, ffn_backward)


# ------------------------------------------------------------------------ the units
def _sum_param_grads(comm: Any, grads: dict[str, Any], names: list[str]) -> None:
    """SP: the named gradients saw one sequence shard each; sum them over the tp ranks
    (one fused all-reduce, op ``sp_param_grads``), in place in ``grads``."""
    names = [n for n in names if n in grads]
    flat = xp.concatenate([xp.asarray(grads[n], xp.float64).reshape(-1) for n in names])
    c = traced(comm)
    with c.operation(OP_PARAM_GRADS):
        total = allreduce(c, flat.astype(grads[names[0]].dtype), "sum", "ring")
    at = 0
    for n in names:
        k = grads[n].size
        grads[n] = total[at:at + k].reshape(grads[n].shape)
        at += k


class TPEmbedUnit(Unit):
    """x = VocabParallelEmbedding(tokens) + pos_emb (SP: my sequence positions only;
    ``positions``: a context-parallel rank's positions, as context parallelism's
    ``CPEmbedUnit`` looks them up)."""

    has_input_grad = False  # token ids in: B does nothing, the whole backward is W

    def __init__(self, cfg: GPTConfig, comm: Any, sequence_parallel: bool = False,
                 positions: Any = None) -> None:
        self.cfg, self.comm, self.sp = cfg, comm, sequence_parallel
        self.positions = None if positions is None else to_device(positions)  # moved once
        self.name, self.names = "embed", ("tok_emb", "pos_emb")
        self.emb = VocabParallelEmbedding(comm, cfg.vocab_size, sequence_parallel,
                                          op="sp_embed" if sequence_parallel else "tp_embed")

    def forward(self, p: dict[str, Any], tokens: Any) -> tuple[Any, Any]:
        self.cfg.check_tokens(tokens)
        y, s = self.emb.forward({"table": p["tok_emb"]}, tokens)
        if self.positions is not None:  # context parallelism: distinct, maybe zigzag
            y += p["pos_emb"][self.positions]
            return y, (s, self.positions, None, p["pos_emb"].shape)
        r, t = _rank_size(self.comm)
        lo, hi = spans.span(tokens.shape[1], t, r) if self.sp else (0, tokens.shape[1])
        y += p["pos_emb"][lo:hi]
        return y, (s, lo, hi, p["pos_emb"].shape)

    def backward(self, p: dict[str, Any], saved: Any, dx: Any,
                 daux: float = 1.0) -> tuple[None, dict[str, Any]]:
        s, lo, hi, shape = saved
        dpos = xp.zeros(shape, dtype=dx.dtype)
        dpos[lo if hi is None else slice(lo, hi)] = up(dx).sum(axis=0)
        _, g = self.emb.backward({"table": p["tok_emb"]}, s, dx)
        grads = {"tok_emb": g["table"], "pos_emb": dpos}
        if self.sp:
            _sum_param_grads(self.comm, grads, ["pos_emb"])
        return None, grads


class TPBlockUnit(Unit):
    """Block ``i``: x + attention(LN1 x) then + MLP (or MoE)(LN2 ·), Megatron-sliced."""

    def __init__(self, cfg: GPTConfig, comm: Any, i: int, sequence_parallel: bool = False,
                 core: Any = None) -> None:
        self.cfg, self.comm, self.sp = cfg, comm, sequence_parallel
        serial = BlockUnit(cfg, i)
        self.name, self.prefix, self.names = serial.name, serial.prefix, serial.names
        self.steps = tp_steps(comm, cfg, sequence_parallel, core)

    def forward(self, p: dict[str, Any], x: Any) -> tuple[Any, Any]:
        return block_forward(p, x, self.cfg, *self.steps)

    def backward(self, p: dict[str, Any], saved: Any, dy: Any,
                 daux: float = 1.0) -> tuple[Any, dict[str, Any]]:
        dx, grads = block_backward(p, saved, dy, daux, *self.steps)
        if self.sp:
            _sum_param_grads(self.comm, grads, ["ln1.gamma", "ln1.beta", "attn.b_out",
                                                "ln2.gamma", "ln2.beta", "mlp.b_out"])
        return dx, {n: grads[n] for n in self.names}

    def aux_loss(self, saved: Any) -> float:
        f = saved["ffn"]
        return float(f["aux_loss"]) if isinstance(f, dict) else 0.0


class TPHeadUnit(Unit):
    """logits_r = LN_f(x) @ lm_head_r: this rank's vocabulary columns (no gather)."""

    def __init__(self, cfg: GPTConfig, comm: Any, sequence_parallel: bool = False) -> None:
        self.cfg, self.comm, self.sp = cfg, comm, sequence_parallel
        self.name, self.names = "head", ("ln_f.gamma", "ln_f.beta", "lm_head")
        self.lin = ColumnParallelLinear(comm, sequence_parallel=sequence_parallel,
                                        op="sp_head" if sequence_parallel else "tp_head")

    def forward(self, p: dict[str, Any], x: Any) -> tuple[Any, Any]:
        h, s_ln = layernorm_forward(x, p["ln_f.gamma"], p["ln_f.beta"])
        logits, s_lin = self.lin.forward({"w": p["lm_head"]}, h)
        return logits, (s_ln, s_lin)

    def backward(self, p: dict[str, Any], saved: Any, dlogits: Any,
                 daux: float = 1.0) -> tuple[Any, dict[str, Any]]:
        s_ln, s_lin = saved
        dh, g = self.lin.backward({"w": p["lm_head"]}, s_lin, dlogits)
        dx, dg, db = layernorm_backward(p["ln_f.gamma"], s_ln, dh)
        grads = {"ln_f.gamma": dg, "ln_f.beta": db, "lm_head": g["w"]}
        if self.sp:
            _sum_param_grads(self.comm, grads, ["ln_f.gamma", "ln_f.beta"])
        return dx, grads


def tp_gpt_units(cfg: GPTConfig, comm: Any, sequence_parallel: bool = False) -> tuple[Unit, ...]:
    """embed, block 0 … block L-1, head, tensor-parallel over ``comm``."""
    return (TPEmbedUnit(cfg, comm, sequence_parallel),
            *(TPBlockUnit(cfg, comm, i, sequence_parallel) for i in range(cfg.n_layer)),
            TPHeadUnit(cfg, comm, sequence_parallel))


def tp_loss_and_grads(units: Any, hooks: executor.Hooks, comm: Any, tokens: Any, targets: Any,
                      scale: float = 1.0, records: list | None = None) -> float:
    """The executor's walk with the vocab-parallel loss in the middle; grads to ``hooks``."""
    aux: list[float] = []
    logits, kept = executor.forward(units, hooks, tokens, records, aux)
    ce, s_ce = vocab_parallel_cross_entropy_forward(comm, logits, targets)
    del logits
    dlogits = vocab_parallel_cross_entropy_backward(s_ce, scale)
    del s_ce
    executor.backward(units, hooks, kept, dlogits, scale, records)
    return ce + sum(aux)


class TensorParallelGPT:
    """The GPT sliced over the tensor-parallel communicator ``comm`` (every rank of it calls
    every method alike).  Shards keep the serial parameter names (:func:`shard_params`)."""

    def __init__(self, cfg: GPTConfig, comm: Any, sequence_parallel: bool = False) -> None:
        self.cfg, self.comm, self.sp = cfg, comm, sequence_parallel
        self.rank, self.t = _rank_size(comm)
        check_tp(cfg, self.t, sequence_parallel)
        self._units = tp_gpt_units(cfg, comm, sequence_parallel)

    def units(self) -> tuple[Unit, ...]:
        return self._units

    def shard(self, full: dict[str, Any]) -> dict[str, Any]:
        """This rank's shard of the full parameters (cut, not re-drawn)."""
        return shard_params(full, self.cfg, self.t, self.rank)

    def _check(self, tokens: Any) -> None:
        check_tp(self.cfg, self.t, self.sp, getattr(tokens, "shape", (0, 0))[1])

    def forward(self, shard: dict[str, Any], tokens: Any) -> Any:
        """This rank's vocabulary columns of the logits, (B, T, V/t)."""
        self._check(tokens)
        return executor.forward(self._units, executor.Hooks(shard), tokens)[0]

    def loss(self, shard: dict[str, Any], tokens: Any, targets: Any) -> float:
        self._check(tokens)
        aux: list[float] = []
        logits, _ = executor.forward(self._units, executor.Hooks(shard), tokens, aux=aux)
        return vocab_parallel_cross_entropy_forward(self.comm, logits, targets)[0] + sum(aux)

    def loss_and_grads(self, shard: dict[str, Any], tokens: Any, targets: Any,
                       loss_scale: float = 1.0) -> tuple[float, dict[str, Any]]:
        """(loss, grads of this rank's shard, keyed and ordered like ``shard``)."""
        self._check(tokens)
        hooks = executor.Hooks(shard)
        loss = tp_loss_and_grads(self._units, hooks, self.comm, tokens, targets, loss_scale)
        return loss, {k: hooks.grads[k] for k in shard}
