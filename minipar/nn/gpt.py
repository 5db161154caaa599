"""The GPT model — модель GPT (декодер трансформера) — GPT 模型 (仅解码器的 Transformer).

GPT-2 (Radford et al. 2019) as nanoGPT writes it: decoder only,
pre-LayerNorm, untied output head, no dropout, so runs are deterministic.

    x = tok_emb[tokens] + pos_emb[:T]
    for each block:  x = x + attn(ln1(x));  x = x + ffn(ln2(x))   (ffn: MLP or MoE)
    logits = ln_f(x) @ lm_head;  loss = mean cross-entropy + Σ_blocks aux_loss

Parameter names (dotted, in this order — ``GPT.init`` returns them so):
``tok_emb`` (V, d), ``pos_emb`` (block_size, d), per block i
``blocks.{i}.ln1.{gamma,beta}``, ``blocks.{i}.attn.{w_qkv,b_qkv,w_out,b_out}`` (w_qkv
(d, (H + 2K)·d/H): H query heads, then K key heads, then K value heads, K = n_kv_head),
``blocks.{i}.ln2.{gamma,beta}``, then ``blocks.{i}.mlp.{w_in,b_in,w_out,b_out}``
or, in an MoE block, ``blocks.{i}.moe.router`` (d, E) and
``blocks.{i}.moe.experts.{e}.{w_in,b_in,w_out,b_out}``; ``ln_f.{gamma,beta}``,
``lm_head`` (d, V).

Initialisation (GPT-2): weights N(0, 0.02²); the projections that write
into the residual stream (``attn.w_out``, ``mlp.w_out``, experts' ``w_out``)
N(0, (0.02/sqrt(2·n_layer))²); LayerNorm γ = 1, β = 0; biases 0.  Each from
``(seed, name)`` (``init.py``).

The pieces — ``embed_*``, ``block_*``, ``head_*`` — are public so that
pipeline, tensor, sequence and expert parallel code runs the very same
computation on its share.  Each backward takes the piece's parameters
again (``head_backward(p, saved, dlogits)``): ``saved`` holds activations
only.  ``GPT.units()`` wraps the pieces as units (:mod:`minipar.nn.units`)
and ``GPT.loss_and_grads`` is one walk of the units executor
(:mod:`minipar.nn.executor`) with the serial hooks — the same walk that
``train``, DDP and ZeRO run.  Its gradients are checked against central
finite differences in float64 (tests/test_nn_gpt.py).
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from minipar.backend import xp
from minipar.nn import executor, fp8
from minipar.nn import init as _init
from minipar.nn.attention import attention_backward, attention_forward
from minipar.nn.dtypes import up
from minipar.nn.gpt_config import GPTConfig
from minipar.nn.layers import (
    embedding_backward,
    embedding_forward,
    layernorm_backward,
    layernorm_forward,
    linear_backward,
    linear_forward,
)
from minipar.nn.loss import cross_entropy_forward
from minipar.nn.mlp import mlp_backward, mlp_forward
from minipar.nn.moe import moe_backward, moe_forward
from minipar.nn.units import Unit

__all__ = [
    "GPT",
    "GPTConfig",
    "block_backward",
    "block_forward",
    "embed_backward",
    "embed_forward",
    "head_backward",
    "head_forward",
    "param_shapes",
    "serial_steps",
    "sub",
]


def param_shapes(cfg: GPTConfig) -> dict[str, tuple[int, ...]]:
    """Every parameter's name and shape, in the model's order."""
    d, f, e = cfg.d_model, cfg.d_ff, cfg.n_experts
    qkv = (cfg.n_head + 2 * cfg.n_kv_head) * (d // cfg.n_head)  # 3d unless grouped (GQA)
    w = cfg.expert_width
    s: dict[str, tuple[int, ...]] = {"tok_emb": (cfg.vocab_size, d), "pos_emb": (cfg.block_size, d)}
    for i in range(cfg.n_layer):
        b = f"blocks.{i}."
        s.update({b + "ln1.gamma": (d,), b + "ln1.beta": (d,),
                  b + "attn.w_qkv": (d, qkv), b + "attn.b_qkv": (qkv,),
                  b + "attn.w_out": (d, d), b + "attn.b_out": (d,),
                  b + "ln2.gamma": (d,), b + "ln2.beta": (d,)})
        experts = [f"moe.experts.{j}." for j in range(e)] if cfg.is_moe_block(i) else ["mlp."]
        if cfg.is_moe_block(i):
            s[b + "moe.router"] = (d, e)
            experts += [f"moe.shared.{j}." for j in range(cfg.shared_experts)]
        width = w if cfg.is_moe_block(i) else f
        for x in experts:
            s.update({b + x + "w_in": (d, width), b + x + "b_in": (width,),
                      b + x + "w_out": (width, d), b + x + "b_out": (d,)})
    s.update({"ln_f.gamma": (d,), "ln_f.beta": (d,), "lm_head": (d, cfg.vocab_size)})
    return s


def sub(params: dict[str, Any], prefix: str) -> dict[str, Any]:
    """The entries of ``params`` under ``prefix``, with the prefix removed."""
    return {k[len(prefix):]: v for k, v in params.items() if k.startswith(prefix)}


# ------------------------------------------------------------------ embedding
def embed_forward(
    p: dict[str, Any], tokens: Any, cfg: GPTConfig, pos_offset: int = 0
) -> tuple[Any, tuple]:
    """x = tok_emb[tokens] + pos_emb[pos_offset : pos_offset + T]; tokens (B, T)."""
    cfg.check_tokens(tokens, pos_offset=pos_offset)
    t = tokens.shape[1]
    x, s_tok = embedding_forward(p["tok_emb"], tokens)
    x += p["pos_emb"][pos_offset:pos_offset + t]
    return x, (s_tok, pos_offset, t, p["pos_emb"].shape)


def embed_backward(p: dict[str, Any], saved: tuple, dx: Any) -> dict[str, Any]:
    """Gradients {tok_emb, pos_emb} for dx (B, T, d); ``p`` is not read (the gradient of a
    table lookup needs only which rows were read), taken for the uniform signature."""
    s_tok, off, t, shape = saved
    dpos = xp.zeros(shape, dtype=dx.dtype)
    dpos[off:off + t] = up(dx).sum(axis=0)
    return {"tok_emb": embedding_backward(s_tok, dx), "pos_emb": dpos}


# ---------------------------------------------------------------------- block
#: a step of the block that a parallel strategy may replace, ``(forward, backward)``:
#: ``forward(q, h) -> (y, saved)``, ``backward(q, saved, dy) -> (dh, grads)`` (the
#: feed-forward step's backward also gets ``daux``), with ``q`` and ``grads`` keyed without
#: the step's prefix (``attn.``, ``mlp.`` or ``moe.``)
Step = tuple[Callable[..., tuple[Any, Any]], Callable[..., tuple[Any, dict[str, Any]]]]


def _ffn_prefix(p: dict[str, Any]) -> str:
    return "moe." if "moe.router" in p else "mlp."


def _ffn_backward(q: dict[str, Any], saved: Any, dy: Any, daux: float = 1.0) -> tuple[Any, Any]:
    return moe_backward(q, saved, dy, daux) if "router" in q else mlp_backward(q, saved, dy)


def serial_steps(cfg: GPTConfig) -> tuple[Step, Step]:
    """The serial block's ``(attn, ffn)`` steps: causal self-attention, and the MLP or, in an
    MoE block (its parameters hold a ``router``), the mixture of experts."""
    def attn_forward(q: dict[str, Any], a: Any) -> tuple[Any, Any]:
        return attention_forward(q, a, cfg.n_head, cfg.n_kv_head)

    def ffn_forward(q: dict[str, Any], h: Any) -> tuple[Any, Any]:
        if "router" in q:
            check_bias(cfg, q)
            return moe_forward(q, h, cfg.n_experts, cfg.top_k, n_shared=cfg.shared_experts,
                               **cfg.moe_options())
        return mlp_forward(q, h)

    return (attn_forward, attention_backward), (ffn_forward, _ffn_backward)


def block_forward(p: dict[str, Any], x: Any, cfg: GPTConfig, attn: Step | None = None,
                  ffn: Step | None = None) -> tuple[Any, dict[str, Any]]:
    """One pre-LN block on x (B, T, d); ``p`` has the block's local names
    (``ln1.gamma`` … ``mlp.w_out`` or ``moe.router`` …), i.e. ``sub(params, "blocks.i.")``.
    An MoE block's ``saved["ffn"]`` holds its routing statistics and ``aux_loss``.

    ``attn`` / ``ffn`` (:data:`Step`; default :func:`serial_steps`) replace the attention or
    the feed-forward step: tensor and expert parallelism pass theirs and reuse this walk
    (the LayerNorms, the residuals, the order of every sum) unchanged."""
    serial = serial_steps(cfg)
    attn, ffn = attn or serial[0], ffn or serial[1]
    recipe = cfg.fp8_recipe()  # FP8 GEMMs in the block's linear layers, if any
    with fp8.gemms(recipe):
        a, s_ln1 = layernorm_forward(x, p["ln1.gamma"], p["ln1.beta"])
        a, s_attn = attn[0](sub(p, "attn."), a)
        x1 = x + a
        h, s_ln2 = layernorm_forward(x1, p["ln2.gamma"], p["ln2.beta"])
        h, s_ffn = ffn[0](sub(p, _ffn_prefix(p)), h)
    saved = {"ln1": s_ln1, "attn": s_attn, "ln2": s_ln2, "ffn": s_ffn}
    return x1 + h, (saved if recipe is None else {**saved, "fp8": recipe})


def block_aux_loss(saved: dict[str, Any]) -> float:
    """The block's auxiliary load-balancing loss (0.0 for a dense MLP block)."""
    return float(saved["ffn"]["aux_loss"]) if isinstance(saved["ffn"], dict) else 0.0


def block_loads(saved: dict[str, Any]) -> Any:
    """The block's top-k assignments per expert (E,) of this forward (None: a dense block)."""
    return saved["ffn"]["loads"] if isinstance(saved["ffn"], dict) else None


def check_bias(cfg: GPTConfig, q: dict[str, Any]) -> None:
    """ValueError unless a loss-free MoE step got its bias (an engine that keeps none)."""
    if cfg.load_balance == "loss-free" and "expert_bias" not in q:
        raise ValueError("--load-balance loss-free: this engine does not keep the expert "
                         "bias; the serial, ep, pp and hybrid engines do")


def with_bias(p: dict[str, Any], full: dict[str, Any], prefix: str) -> dict[str, Any]:
    """``p`` and, when ``full`` holds it, the block's ``moe.expert_bias`` (loss-free
    balancing: state, not a parameter; an engine that keeps it puts it among the views)."""
    name = prefix + "moe.expert_bias"
    return {**p, "moe.expert_bias": full[name]} if name in full else p


def block_backward(
    p: dict[str, Any], saved: dict[str, Any], dy: Any, daux: float = 1.0,
    attn: Step | None = None, ffn: Step | None = None,
) -> tuple[Any, dict[str, Any]]:
    """Return ``(dx, grads)``, grads keyed like ``p``.  ``daux`` = d(loss)/d(aux_loss).
    ``attn`` / ``ffn``: the steps the forward was given (default: the serial ones)."""
    pre = _ffn_prefix(p)
    with fp8.gemms(saved.get("fp8")):  # the forward's recipe
        dh, gf = (ffn[1] if ffn else _ffn_backward)(sub(p, pre), saved["ffn"], dy, daux)
        dx1, g2, b2 = layernorm_backward(p["ln2.gamma"], saved["ln2"], dh)
        dx1 += dy
        da, ga = (attn[1] if attn else attention_backward)(sub(p, "attn."), saved["attn"],
                                                            dx1)
        dx, g1, b1 = layernorm_backward(p["ln1.gamma"], saved["ln1"], da)
        dx += dx1
    return dx, {"ln1.gamma": g1, "ln1.beta": b1, **{"attn." + k: v for k, v in ga.items()},
                "ln2.gamma": g2, "ln2.beta": b2, **{pre + k: v for k, v in gf.items()}}


# ----------------------------------------------------------------------- head
def head_forward(p: dict[str, Any], x: Any) -> tuple[Any, tuple]:
    """logits = LayerNorm_f(x) @ lm_head; ``p`` = {ln_f.gamma, ln_f.beta, lm_head}."""
    h, s_ln = layernorm_forward(x, p["ln_f.gamma"], p["ln_f.beta"])
    logits, s_lin = linear_forward(h, p["lm_head"])
    return logits, (s_ln, s_lin)


def head_backward(p: dict[str, Any], saved: tuple, dlogits: Any) -> tuple[Any, dict[str, Any]]:
    """Return ``(dx, {ln_f.gamma, ln_f.beta, lm_head})``."""
    s_ln, s_lin = saved
    dh, dw = linear_backward(p["lm_head"], s_lin, dlogits)
    dx, dg, db = layernorm_backward(p["ln_f.gamma"], s_ln, dh)
    return dx, {"ln_f.gamma": dg, "ln_f.beta": db, "lm_head": dw}


# ---------------------------------------------------------------------- model
@dataclass
class GPT:
    """The serial GPT: ``init(seed)`` and ``loss_and_grads(params, tokens, targets)``."""

    cfg: GPTConfig = field(default_factory=GPTConfig)

    def param_shapes(self) -> dict[str, tuple[int, ...]]:
        return param_shapes(self.cfg)

    def n_params(self) -> int:
        """Ψ, the number of parameters (elements)."""
        return sum(math.prod(s) for s in self.param_shapes().values())

    def init(self, seed: int = 0) -> dict[str, Any]:
        """All parameters, ordered, each drawn from ``(seed, name)`` in ``cfg.dtype``."""
        cfg, out = self.cfg, {}
        resid_std = cfg.init_std / math.sqrt(2 * cfg.n_layer)
        for name, shape in self.param_shapes().items():
            leaf = name.rsplit(".", 1)[-1]
            if leaf == "gamma":
                out[name] = _init.constant(shape, 1.0, cfg.dtype)
            elif leaf.startswith("b"):  # beta, b_qkv, b_out, b_in
                out[name] = _init.constant(shape, 0.0, cfg.dtype)
            else:
                std = resid_std if leaf == "w_out" else cfg.init_std
                out[name] = _init.normal(seed, name, shape, std, cfg.dtype)
        return out

    def units(self) -> tuple[Any, ...]:
        """embed, block 0 … block L-1, head: :class:`minipar.nn.units.Unit` s, in buffer order."""
        return gpt_units(self.cfg)

    def forward(self, params: dict[str, Any], tokens: Any) -> tuple[Any, dict[str, Any]]:
        """logits (B, T, V) and the cache the backward needs (per-piece ``saved``):
        ``{"embed": …, "blocks": [one per block], "head": …}``."""
        logits, kept = executor.forward(self.units(), executor.Hooks(params), tokens)
        return logits, {"embed": kept[0], "blocks": kept[1:-1], "head": kept[-1]}

    def _check_targets(self, tokens: Any, targets: Any) -> None:
        if getattr(tokens, "shape", None) != getattr(targets, "shape", None):
            raise ValueError(f"tokens {getattr(tokens, 'shape', None)} and targets "
                             f"{getattr(targets, 'shape', None)} must match")
        self.cfg.check_tokens(targets, what="targets")

    def loss(self, params: dict[str, Any], tokens: Any, targets: Any) -> float:
        """Mean cross-entropy plus the MoE auxiliary losses (a Python float)."""
        self._check_targets(tokens, targets)
        aux: list[float] = []
        logits, _ = executor.forward(self.units(), executor.Hooks(params), tokens, aux=aux)
        return cross_entropy_forward(logits, targets)[0] + sum(aux)

    def loss_and_grads(
        self, params: dict[str, Any], tokens: Any, targets: Any, loss_scale: float = 1.0
    ) -> tuple[float, dict[str, Any]]:
        """(loss, grads): grads keyed and ordered like ``params``, in their dtype.

        ``loss_scale`` S (mixed-fp16 loss scaling, a rank's loss weight): the grads
        are those of S·loss; the returned loss is not scaled.  One walk of
        :func:`minipar.nn.executor.loss_and_grads` with the serial hooks."""
        self._check_targets(tokens, targets)
        hooks = executor.Hooks(params)
        loss = executor.loss_and_grads(self.units(), hooks, tokens, targets, loss_scale)
        return loss, {k: hooks.grads[k] for k in params if not k.endswith(".expert_bias")}

    @staticmethod
    def moe_stats(cache: dict[str, Any]) -> list[dict[str, Any]]:
        """Per MoE block: index, capacity, first choices per expert (``routed``), assignments
        kept per expert, number dropped, aux loss, and per token (row-major over (B, T))
        its chosen experts ``expert_index`` (N, k) and whether each was ``kept`` (N, k)."""
        out = []
        for i, s in enumerate(cache["blocks"]):
            f = s["ffn"]
            if isinstance(f, dict):
                out.append({"block": i, "capacity": f["capacity"], "routed": f["routed"],
                            "tokens_per_expert": f["tokens_per_expert"],
                            "dropped": f["dropped"], "aux_loss": f["aux_loss"],
                            "expert_index": f["expert_index"], "kept": f["kept"]})
        return out


# -- the GPT as units (minipar.nn.units) -----------------------------------------------

class EmbedUnit(Unit):
    """x = tok_emb[tokens] + pos_emb[:T]; the first unit (its dx is None)."""

    has_input_grad = False  # token ids in: B does nothing, the whole backward is W

    def __init__(self, cfg: GPTConfig) -> None:
        self.cfg, self.name, self.names = cfg, "embed", ("tok_emb", "pos_emb")

    def forward(self, p: dict[str, Any], tokens: Any) -> tuple[Any, Any]:
        return embed_forward(p, tokens, self.cfg)

    def backward(self, p: dict[str, Any], saved: Any, dx: Any,
                 daux: float = 1.0) -> tuple[None, dict[str, Any]]:
        return None, embed_backward(p, saved, dx)


class BlockUnit(Unit):
    """Transformer block ``i``: x + attn(ln1(x)), then + MLP or MoE(ln2(·))."""

    def __init__(self, cfg: GPTConfig, i: int) -> None:
        self.cfg, self.name, self.prefix = cfg, f"block {i}", f"blocks.{i}."
        self.names = tuple(n[len(self.prefix):] for n in param_shapes(cfg)
                           if n.startswith(self.prefix))

    def params(self, full: dict[str, Any]) -> dict[str, Any]:
        return with_bias(super().params(full), full, self.prefix)

    def forward(self, p: dict[str, Any], x: Any) -> tuple[Any, Any]:
        return block_forward(p, x, self.cfg)

    def backward(self, p: dict[str, Any], saved: Any, dy: Any,
                 daux: float = 1.0) -> tuple[Any, dict[str, Any]]:
        return block_backward(p, saved, dy, daux)

    def aux_loss(self, saved: Any) -> float:
        return block_aux_loss(saved)

    def loads(self, saved: Any) -> Any:
        return block_loads(saved)


class HeadUnit(Unit):
    """logits = LayerNorm_f(x) @ lm_head; the last unit."""

    def __init__(self, cfg: GPTConfig) -> None:
        self.cfg, self.name, self.names = cfg, "head", ("ln_f.gamma", "ln_f.beta", "lm_head")

    def forward(self, p: dict[str, Any], x: Any) -> tuple[Any, Any]:
        return head_forward(p, x)

    def backward(self, p: dict[str, Any], saved: Any, dlogits: Any,
                 daux: float = 1.0) -> tuple[Any, dict[str, Any]]:
        return head_backward(p, saved, dlogits)


@functools.lru_cache(maxsize=32)
def gpt_units(cfg: GPTConfig) -> tuple[Unit, ...]:
    """embed, block 0 … block L-1, head (cached per configuration: units hold no state)."""
    return (EmbedUnit(cfg), *(BlockUnit(cfg, i) for i in range(cfg.n_layer)), HeadUnit(cfg))
