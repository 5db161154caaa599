"""The expert-parallel GPT — GPT с экспертами на нескольких рангах — 专家并行的 GPT.

EN expert-parallel GPT (units) · RU GPT с параллелизмом экспертов (блоки) ·
ZH 专家并行的 GPT（计算单元）

Everything in the MoE GPT but the MoE layers runs on each rank's own rows
unchanged (embedding, attention, LayerNorms, head, the loss; the routers too,
replicated).  So the EP GPT is the serial model's units
(:mod:`minipar.nn.units`) with one thing swapped, and :mod:`minipar.nn.executor`
walks them unchanged: in every MoE block (``cfg.is_moe_block(i)``) the
feed-forward step is :class:`~minipar.parallel.expert_parallel.layer.EPMoE`
(:class:`EPBlockUnit`), whose parameters are the router and this rank's experts
only.  :func:`ep_units` builds them for one rank of the ep group; the EP engine
and the hybrid's EP stages share it.
"""

from __future__ import annotations

from typing import Any

from minipar.nn.gpt import (
    BlockUnit,
    EmbedUnit,
    HeadUnit,
    block_backward,
    block_forward,
    block_loads,
    param_shapes,
    with_bias,
)
from minipar.nn.gpt_config import GPTConfig
from minipar.nn.units import Unit
from minipar.parallel.expert_parallel.layer import EPMoE

__all__ = ["EPBlockUnit", "ep_units"]


class EPBlockUnit(Unit):
    """Transformer block ``i`` whose MoE runs across ranks: x + attn(ln1(x)), then
    + EPMoE(ln2(·)).  It is :func:`minipar.nn.gpt.block_forward` / ``block_backward``
    with :class:`EPMoE` as the feed-forward step (``ffn=``), so the dense part is the
    serial code, bit-identical.  ``names``: the block's dense parameters, the router,
    and this rank's experts only.  ``tokens``: the n_r tokens this rank routes per
    forward call, for which every rank of the group sized this rank's capacity."""

    def __init__(self, cfg: GPTConfig, i: int, moe: EPMoE, tokens: int) -> None:
        self.cfg, self.moe, self.name, self.prefix = cfg, moe, f"block {i}", f"blocks.{i}."
        self.tokens = tokens
        mine = tuple(f"moe.experts.{e}." for e in moe.ids)
        local = [n[len(self.prefix):] for n in param_shapes(cfg) if n.startswith(self.prefix)]
        self.names = tuple(n for n in local
                           if not n.startswith("moe.experts.") or n.startswith(mine))

    def params(self, full: dict[str, Any]) -> dict[str, Any]:
        return with_bias(super().params(full), full, self.prefix)

    def loads(self, saved: Any) -> Any:
        return block_loads(saved)

    def forward(self, p: dict[str, Any], x: Any) -> tuple[Any, Any]:
        n = x.size // x.shape[-1]
        if n != self.tokens:  # the others' C_j would not match what arrives
            raise ValueError(f"expert parallelism: this rank routes {n} tokens, but its "
                             f"capacity C = {self.moe.caps[self.moe.comm.rank]} was set for "
                             f"{self.tokens}")
        return block_forward(p, x, self.cfg, ffn=(self.moe.forward, self.moe.backward))

    def backward(self, p: dict[str, Any], saved: Any, dy: Any,
                 daux: float = 1.0) -> tuple[Any, dict[str, Any]]:
        return block_backward(p, saved, dy, daux, ffn=(self.moe.forward, self.moe.backward))

    def aux_loss(self, saved: Any) -> float:
        return float(saved["ffn"]["aux_loss"])


def ep_units(cfg: GPTConfig, comm: Any, caps: list[int], tokens: int) -> tuple[Unit, ...]:
    """embed, block 0 … L-1, head of the GPT whose MoE blocks run across ``comm`` (the ep
    group; this rank is ``comm.rank`` of it): an :class:`EPBlockUnit` where
    ``cfg.is_moe_block(i)``, the serial block elsewhere.  ``caps``: C_j of every rank of the
    group (:func:`~minipar.parallel.expert_parallel.layout.capacities`); ``tokens``: the
    n_r tokens this rank routes per forward call (its rows × the sequence)."""
    blocks = [EPBlockUnit(cfg, i, EPMoE(comm, cfg, caps), tokens) if cfg.is_moe_block(i)
              else BlockUnit(cfg, i) for i in range(cfg.n_layer)]
    return (EmbedUnit(cfg), *blocks, HeadUnit(cfg))
