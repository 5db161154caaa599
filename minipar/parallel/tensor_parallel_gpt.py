"""The tensor-parallel GPT: Megatron's MLP and attention, as units — тензорно-параллельный
GPT: MLP и внимание Megatron как блоки модели — 张量并行 GPT：Megatron 的 MLP 与注意力（模型单元）.

EN tensor-parallel transformer block (Megatron-LM) · RU тензорно-параллельный блок
трансформера · ZH 张量并行 Transformer 块

Shoeybi et al. 2019, arXiv 1909.08053, §3, Fig. 3, built from the layers of
:mod:`minipar.parallel.tensor_parallel`:

    MLP        f → [X W_in,r + b_in,r → GELU] (column, GELU local) → X_r W_out,r (row) → g → + b_out
    attention  f → QKV of my heads (column, n_head/t heads) → softmax(q kᵀ/√d_h + M) v
               → o_r W_out,r (row: the rows of my heads) → g → + b_out
    block      x1 = x + attention(LN1(x));   y = x1 + MLP(LN2(x1))   (LayerNorms replicated)

so a block runs exactly **2 all-reduces forward** (the two g) **and 2 backward** (the two
f), each of b·s·h elements: with a ring every rank sends 4 × 2(t−1)/t × b·s·h × bytes per
block per step (:func:`minipar.plan.tensor.tp_bytes_per_rank_per_layer`).  The embedding
(vocabulary rows, g counted as ``tp_embed``) and the head (``ln_f``, then ``lm_head``
column-parallel by vocabulary, f counted as ``tp_head``; no gather) add one all-reduce
each, and the vocab-parallel loss two small ones (``tp_ce``).

A mixture-of-experts block (Switch/GShard, :mod:`minipar.nn.moe_steps`) slices each
expert's MLP like the dense one: dispatch and the router run replicated on every rank (the
same routing everywhere), the expert buffers (E, C, d) enter through f, every rank runs
its columns of W_in and rows of W_out of every expert (b_out added on rank 0 only, so the
sum adds it once), and g sums the expert outputs before the replicated combine: again
2 all-reduces forward and 2 backward, of E·C·d elements.

``sequence_parallel=True`` (Korthikanti et al. 2022, :mod:`minipar.parallel.sequence_parallel`):
x arrives as a sequence shard, the LayerNorms run on it, f/g become all-gather /
reduce-scatter, and the gradients of the parameters that now see only a shard of the
sequence (LayerNorms, b_out, pos_emb) are all-reduced over the tensor-parallel ranks
(``sp_param_grads``).  The units (:class:`TPEmbedUnit`, :class:`TPBlockUnit`,
:class:`TPHeadUnit`) are :class:`minipar.nn.units.Unit` s with the serial parameter names,
so the executor's one walk (:mod:`minipar.nn.executor`) runs them; the loss between the
walks is the vocab-parallel cross-entropy (:func:`tp_loss_and_grads`).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from minipar import spans
from minipar.backend import xp
from minipar.collectives import _base as B
from minipar.collectives import allreduce
from minipar.nn import executor
from minipar.nn._dtype import up
from minipar.nn.gpt import block_backward, block_forward
from minipar.nn.gpt_config import GPTConfig
from minipar.nn.layers import layernorm_backward, layernorm_forward
from minipar.nn.units import Unit
from minipar.parallel.tensor_parallel import (
    ColumnParallelLinear,
    VocabParallelEmbedding,
    check_tp,
    shard_params,
    vocab_parallel_cross_entropy_backward,
    vocab_parallel_cross_entropy_forward,
)
from minipar.parallel.tensor_parallel_block import (
    tp_attention_backward,
    tp_attention_forward,
    tp_mlp_backward,
    tp_mlp_forward,
    tp_moe_backward,
    tp_moe_forward,
    tp_steps,
)

__all__ = ["TPBlockUnit", "TPEmbedUnit", "TPHeadUnit", "TensorParallelGPT", "tp_attention_backward",
           "tp_attention_forward", "tp_gpt_units", "tp_loss_and_grads", "tp_mlp_backward",
           "tp_mlp_forward", "tp_moe_backward", "tp_moe_forward"]

OP_PARAM_GRADS = "sp_param_grads"


def _rank_size(comm: Any) -> tuple[int, int]:
    c = B.traced(comm)
    return c.rank, c.size


# ---------------------------------------------------------------------------- units
def _sum_param_grads(comm: Any, grads: dict[str, Any], names: list[str]) -> None:
    """SP: the named gradients saw one sequence shard each; sum them over the tp ranks
    (one fused all-reduce, op ``sp_param_grads``), in place in ``grads``."""
    names = [n for n in names if n in grads]
    flat = np.concatenate([np.asarray(grads[n], np.float64).reshape(-1) for n in names])
    c = B.traced(comm)
    with c.operation(OP_PARAM_GRADS):
        total = allreduce(c, flat.astype(grads[names[0]].dtype), "sum", "ring")
    at = 0
    for n in names:
        k = grads[n].size
        grads[n] = total[at:at + k].reshape(grads[n].shape)
        at += k


class TPEmbedUnit(Unit):
    """x = VocabParallelEmbedding(tokens) + pos_emb (SP: my sequence positions only;
    ``positions``: a context-parallel rank's positions, as
    :class:`~minipar.parallel.context_parallel.CPEmbedUnit` looks them up)."""

    def __init__(self, cfg: GPTConfig, comm: Any, sequence_parallel: bool = False,
                 positions: Any = None) -> None:
        self.cfg, self.comm, self.sp, self.positions = cfg, comm, sequence_parallel, positions
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
        from minipar.nn.units import BlockUnit

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
