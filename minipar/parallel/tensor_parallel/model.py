"""The tensor-parallel GPT: the core's MLP and attention as units, sequence parallelism as their
option, a mixture of experts handed in — тензорно-параллельный GPT (и параллелизм по
последовательности) — 张量并行 GPT（含序列并行）.

EN tensor-parallel GPT (Megatron-LM), sequence parallelism · RU тензорно-параллельный GPT,
параллелизм по последовательности · ZH 张量并行 GPT，序列并行

The technique is :mod:`~minipar.parallel.tensor_parallel.layers` and
:mod:`~minipar.parallel.tensor_parallel.transformer`; this module makes a GPT of them that
the executor's one walk (:mod:`minipar.nn.executor`) runs, with the serial parameter
names (Shoeybi et al. 2019, arXiv 1909.08053, §3):

    embed    x = VocabParallelEmbedding(tokens) (g counted as ``tp_embed``) + pos_emb
    block i  x1 = x + ParallelAttention(LN1(x));  y = x1 + ParallelMLP(LN2(x1))
             (the serial block walk, :func:`minipar.nn.gpt.block_forward`, given the two
             steps: the LayerNorms and residuals are the serial code, replicated)
    head     logits_r = LN_f(x) @ lm_head_r (column-parallel by vocabulary, f counted as
             ``tp_head``; no gather), then the vocab-parallel cross-entropy
             (:func:`tp_loss_and_grads`)

A block runs exactly **2 all-reduces forward** (the two g) **and 2 backward** (the two f),
each of b·s·h elements: with a ring every rank sends 4 × 2(t−1)/t × b·s·h × bytes per
block per step (:func:`minipar.plan.tensor.tp_bytes_per_rank_per_layer`).

**Sequence parallelism** (``sequence_parallel=True``; Korthikanti et al. 2022, arXiv
2205.05198, §4.2.2): the layers' f and g become the all-gather and reduce-scatter along
the sequence, the embedding adds the positions of this rank's shard, and the parameters
that see one shard of the sequence (LayerNorm γ, β, the row-parallel b_out, pos_emb) get
their gradients summed over the tp ranks (:func:`sum_sequence_grads`, op
``sp_param_grads``, one fused all-reduce per unit; Megatron sums them after the backward,
in ``finalize_model_grads``).  **Grouped-query attention** with fewer key/value heads K
than t replicates each on t/K ranks: their gradient columns are summed over those ranks
(:func:`sum_kv_grads`, op ``tp_kv_grads``).

**Arguments, not overrides**, for what other techniques bring: a mixture-of-experts block's
feed-forward (``ffn``: :class:`ParallelMoE`, each expert's MLP sliced like the dense one:
dispatch and router replicated, f on the expert buffers (E, C, d), g on their outputs,
b_out added on rank 0 only so that the sum adds it once); context parallelism's attention
core and positions (``core``, ``positions``: the hybrid's CP x TP).  Tests:
tests/mpi/tp_check.py (the GPT built from these units against the serial one, float64).
"""

from __future__ import annotations

from typing import Any

from minipar import spans
from minipar.backend import to_device, xp
from minipar.collectives import allreduce
from minipar.comm.traced import traced
from minipar.nn import executor
from minipar.nn import fp8
from minipar.nn.fp8 import Split
from minipar.nn.dtypes import up
from minipar.nn.gpt import (BlockUnit, EmbedUnit, HeadUnit, block_backward, block_forward,
                            check_bias)
from minipar.nn.gpt_config import GPTConfig
from minipar.nn.layers import layernorm_backward, layernorm_forward
from minipar.nn.moe_steps import (
    combine_backward,
    combine_forward,
    dispatch_backward,
    dispatch_forward,
    experts_backward,
    experts_forward,
)
from minipar.nn.units import Unit
from minipar.parallel.mappings import (
    copy_to_tensor_model_parallel_region,
    reduce_from_tensor_model_parallel_region,
)
from minipar.parallel.tensor_parallel.layers import (
    ColumnParallelLinear,
    VocabParallelEmbedding,
    vocab_parallel_cross_entropy_backward,
    vocab_parallel_cross_entropy_forward,
)
from minipar.parallel.tensor_parallel.shards import kv_heads_of
from minipar.parallel.tensor_parallel.transformer import ParallelAttention, ParallelMLP

__all__ = ["OP_FP8_AMAX", "OP_KV_GRADS", "OP_PARAM_GRADS", "ParallelMoE", "TPBlockUnit", "TPEmbedUnit",
           "TPHeadUnit", "sum_kv_grads", "sum_sequence_grads", "tp_gpt_units",
           "tp_loss_and_grads"]

OP_PARAM_GRADS, OP_KV_GRADS = "sp_param_grads", "tp_kv_grads"
#: FP8's block amax all-reduce (MAX) over the tensor-parallel group (minipar.nn.fp8.Split)
OP_FP8_AMAX = "fp8_amax"


def fp8_splits(cfg: GPTConfig, comm: Any, attention: Any, mlp: Any) -> None:
    """Tell each linear layer where its weight slice sits in the global weight, so FP8's
    tiles and blocks are the serial run's (a block cut by a slice boundary: its amax
    all-reduced, MAX, over the group, op ``fp8_amax``)."""
    c = traced(comm)
    t, r = c.size, c.rank

    def reduce_max(a: Any) -> Any:
        with c.operation(OP_FP8_AMAX):
            return allreduce(c, xp.ascontiguousarray(a), "max", "ring")

    def at(axis: int, n: int, *pieces: tuple[int, int]) -> Split:
        return Split(axis, xp.concatenate([xp.arange(lo, lo + k) for lo, k in pieces]), n,
                     reduce_max)

    h, kv, d = cfg.n_head, cfg.n_kv_head, cfg.d_model
    dh, (first, nkv) = d // h, kv_heads_of(h, kv, t, r)
    attention.query_key_value.split = at(1, (h + 2 * kv) * dh, (r * (h // t) * dh, d // t),
                                         ((h + first) * dh, nkv * dh),
                                         ((h + kv + first) * dh, nkv * dh))
    attention.dense.split = at(0, d, (r * d // t, d // t))
    if isinstance(mlp, ParallelMLP):
        f = cfg.d_ff
        mlp.dense_h_to_4h.split = at(1, f, (r * f // t, f // t))
        mlp.dense_4h_to_h.split = at(0, f, (r * f // t, f // t))


def sum_sequence_grads(comm: Any, grads: dict[str, Any], names: list[str]) -> None:
    """SP: the named gradients saw one sequence shard each; sum them over the tp ranks
    (one fused all-reduce, op ``sp_param_grads``), in place in ``grads``."""
    names = [n for n in names if n in grads]
    flat = xp.concatenate([xp.asarray(grads[n], xp.float64).reshape(-1) for n in names])
    c = traced(comm)
    with c.operation(OP_PARAM_GRADS):
        total = allreduce(c, flat.astype(grads[names[0]].dtype), "sum", "ring")
    at = 0
    for n in names:
        grads[n] = total[at:at + grads[n].size].reshape(grads[n].shape)
        at += grads[n].size


def sum_kv_grads(group: Any, grads: dict[str, Any], q_columns: int) -> None:
    """GQA with fewer key/value heads K than t: the ``group`` of t/K ranks holding the same
    key/value head each computed its gradient from their own query heads only; sum the
    k and v columns of ``attn.w_qkv`` / ``attn.b_qkv`` (after my ``q_columns`` query
    columns) over them (op ``tp_kv_grads``; the group's bytes count on the tp axis)."""
    with group.operation(OP_KV_GRADS):
        for n in ("attn.w_qkv", "attn.b_qkv"):
            g = grads[n]
            g[..., q_columns:] = allreduce(group, g[..., q_columns:].copy(), "sum", "ring")


# ------------------------------------------------------------------------ the units
class TPEmbedUnit(EmbedUnit):
    """x = VocabParallelEmbedding(tokens) + pos_emb (SP: my sequence positions only;
    ``positions``: a context-parallel rank's positions, maybe zigzag)."""

    def __init__(self, cfg: GPTConfig, comm: Any, sequence_parallel: bool = False,
                 positions: Any = None) -> None:
        super().__init__(cfg)
        self.comm, self.sp = comm, sequence_parallel
        self.positions = None if positions is None else to_device(positions)  # moved once
        self.embedding = VocabParallelEmbedding(comm, cfg.vocab_size, sequence_parallel,
                                                op="sp_embed" if sequence_parallel else "tp_embed")

    def forward(self, p: dict[str, Any], tokens: Any) -> tuple[Any, Any]:
        self.cfg.check_tokens(tokens)
        y, s = self.embedding.forward({"table": p["tok_emb"]}, tokens)
        c, s_len = traced(self.comm), tokens.shape[1]
        mine = self.positions if self.positions is not None else slice(
            *(spans.span(s_len, c.size, c.rank) if self.sp else (0, s_len)))
        y += p["pos_emb"][mine]
        return y, (s, mine, p["pos_emb"].shape)

    def backward(self, p: dict[str, Any], saved: Any, dx: Any,
                 daux: float = 1.0) -> tuple[None, dict[str, Any]]:
        s, mine, shape = saved
        dpos = xp.zeros(shape, dtype=dx.dtype)
        dpos[mine] = up(dx).sum(axis=0)
        _, g = self.embedding.backward({"table": p["tok_emb"]}, s, dx)
        grads = {"tok_emb": g["table"], "pos_emb": dpos}
        if self.sp:
            sum_sequence_grads(self.comm, grads, ["pos_emb"])
        return None, grads


class TPBlockUnit(BlockUnit):
    """Block ``i``: x + ParallelAttention(LN1 x), then + ParallelMLP(LN2 ·) (or ``ffn``)."""

    def __init__(self, cfg: GPTConfig, comm: Any, i: int, sequence_parallel: bool = False,
                 core: Any = None, ffn: Any = None) -> None:
        super().__init__(cfg, i)
        self.comm, self.sp, self.core = comm, sequence_parallel, core
        self.attention = ParallelAttention(comm, cfg.n_head, sequence_parallel, core,
                                           cfg.n_kv_head)
        c, kv = traced(comm), cfg.n_kv_head
        self.kv_group = (c.Split(c.rank // (c.size // kv), c.rank, name=c.name)
                         if kv < c.size else None)  # the sharers of my key/value head
        self.mlp = ffn or ParallelMLP(comm, sequence_parallel)
        if cfg.fp8:
            fp8_splits(cfg, comm, self.attention, self.mlp)
        self.steps = {"attn": (self.attention.forward, self.attention.backward),
                      "ffn": (self.mlp.forward, self.mlp.backward)}

    def forward(self, p: dict[str, Any], x: Any) -> tuple[Any, Any]:
        return block_forward(p, x, self.cfg, **self.steps)

    def backward(self, p: dict[str, Any], saved: Any, dy: Any,
                 daux: float = 1.0) -> tuple[Any, dict[str, Any]]:
        cp = getattr(self.core, "token_split", None)  # a CP core: the tokens are cut too
        with fp8.tokens(cp() if cp is not None and self.cfg.fp8 else None):
            dx, grads = block_backward(p, saved, dy, daux, **self.steps)
        if self.kv_group is not None:
            sum_kv_grads(self.kv_group, grads, self.cfg.d_model // traced(self.comm).size)
        if self.sp:
            sum_sequence_grads(self.comm, grads, ["ln1.gamma", "ln1.beta", "attn.b_out",
                                                  "ln2.gamma", "ln2.beta", "mlp.b_out"])
        return dx, {n: grads[n] for n in self.names}


class TPHeadUnit(HeadUnit):
    """logits_r = LN_f(x) @ lm_head_r: this rank's vocabulary columns (no gather)."""

    def __init__(self, cfg: GPTConfig, comm: Any, sequence_parallel: bool = False) -> None:
        super().__init__(cfg)
        self.comm, self.sp = comm, sequence_parallel
        self.lm_head = ColumnParallelLinear(comm, sequence_parallel=sequence_parallel,
                                            op="sp_head" if sequence_parallel else "tp_head")

    def forward(self, p: dict[str, Any], x: Any) -> tuple[Any, Any]:
        h, s_ln = layernorm_forward(x, p["ln_f.gamma"], p["ln_f.beta"])
        logits, s_lin = self.lm_head.forward({"w": p["lm_head"]}, h)
        return logits, (s_ln, s_lin)

    def backward(self, p: dict[str, Any], saved: Any, dlogits: Any,
                 daux: float = 1.0) -> tuple[Any, dict[str, Any]]:
        s_ln, s_lin = saved
        dh, g = self.lm_head.backward({"w": p["lm_head"]}, s_lin, dlogits)
        dx, dg, db = layernorm_backward(p["ln_f.gamma"], s_ln, dh)
        grads = {"ln_f.gamma": dg, "ln_f.beta": db, "lm_head": g["w"]}
        if self.sp:
            sum_sequence_grads(self.comm, grads, ["ln_f.gamma", "ln_f.beta"])
        return dx, grads


class ParallelMoE:
    """A mixture of experts under TP: replicated dispatch, f on the buffers, every expert's
    MLP sliced (its columns of W_in, rows of W_out), g, replicated combine."""

    def __init__(self, comm: Any, cfg: GPTConfig) -> None:
        self.comm, self.cfg = comm, cfg

    def forward(self, p: dict[str, Any], x: Any) -> tuple[Any, dict]:
        cfg = self.cfg
        check_bias(cfg, p)
        if cfg.shared_experts:
            raise ValueError(f"--shared-experts {cfg.shared_experts}: tensor parallelism does "
                             "not slice shared experts here; use tp = 1")
        buffers, s_d = dispatch_forward(p["router"], x.reshape(-1, x.shape[-1]), cfg.n_experts,
                                        cfg.top_k, bias=p.get("expert_bias"),
                                        seq_len=x.shape[-2], **cfg.moe_options())
        buffers = copy_to_tensor_model_parallel_region.forward(self.comm, buffers)  # f
        pe = dict(p)
        if traced(self.comm).rank:  # b_out is replicated: rank 0 adds it, g's sum has it once
            for e in range(cfg.n_experts):
                pe[f"experts.{e}.b_out"] = xp.zeros_like(p[f"experts.{e}.b_out"])
        out, s_e = experts_forward(pe, buffers, s_d["tokens_per_expert"])
        out = reduce_from_tensor_model_parallel_region.forward(self.comm, out)  # g
        y, s_c = combine_forward(out, s_d)
        return y.reshape(x.shape), {**s_d, "x_shape": x.shape, "experts": s_e, "combine": s_c}

    def backward(self, p: dict[str, Any], saved: dict, dy: Any,
                 daux: float = 1.0) -> tuple[Any, dict[str, Any]]:
        """combine⁻¹ (replicated) → g⁻¹ → sliced experts⁻¹ → f⁻¹ (all-reduce) → dispatch⁻¹."""
        d_out, d_gates = combine_backward(saved["combine"], dy.reshape(-1, dy.shape[-1]))
        d_out = reduce_from_tensor_model_parallel_region.backward(self.comm, d_out)
        d_buf, g_e = experts_backward(p, saved["experts"], d_out)
        d_buf = copy_to_tensor_model_parallel_region.backward(self.comm, d_buf)
        dh, d_router = dispatch_backward(p["router"], saved, d_buf, d_gates, daux)
        return dh.reshape(saved["x_shape"]), {"router": d_router, **g_e}


def tp_gpt_units(cfg: GPTConfig, comm: Any, sequence_parallel: bool = False, core: Any = None,
                 positions: Any = None) -> tuple[Unit, ...]:
    """embed, block 0 … block L-1, head, tensor-parallel over ``comm`` (an MoE block's
    feed-forward :class:`ParallelMoE`; ``core``, ``positions``: context parallelism's)."""
    return (TPEmbedUnit(cfg, comm, sequence_parallel, positions),
            *(TPBlockUnit(cfg, comm, i, sequence_parallel, core,
                          ParallelMoE(comm, cfg) if cfg.is_moe_block(i) else None)
              for i in range(cfg.n_layer)),
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
