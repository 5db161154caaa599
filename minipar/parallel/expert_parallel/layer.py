"""The MoE layer across ranks — слой смеси экспертов на нескольких рангах — 跨 rank 的混合专家层.

EN expert-parallel MoE layer · RU слой MoE с параллелизмом экспертов · ZH 专家并行的 MoE 层

GShard (Lepikhin et al. 2020, arXiv 2006.16668, §2.2-3) and Switch
Transformer (Fedus et al. 2021, arXiv 2101.03961, §2.2): the serial block's
three steps (:mod:`minipar.nn.moe_steps`) with an all-to-all between them.
The ``ep`` ranks of one expert-parallel group each hold E/ep experts (rank c
of the group: experts c·E/ep … (c+1)·E/ep − 1,
:mod:`~minipar.parallel.expert_parallel.layout`) and their own tokens:

    dispatch   (local)      router, top-k, capacity C_r  →  buffers (E, C_r, d), counts (E,)
    a2a #0     counts       (E,) → (E/ep, ep)             how many rows each source filled
    a2a #1     dispatch     (E, C_r, d) → (E/ep, Σ_j C_j, d)   rows for my experts, by source
    experts    (local)      out[i, source j] = Expert_{c·E/ep+i}(rows of j)   filled rows only
    a2a #2     combine      (E/ep, Σ_j C_j, d) → (E, C_r, d)   the reverse all-to-all
    combine    (local)      y[n] = Σ_j kept · g_j · out[e_j, slot_j]

The all-to-all is :data:`minipar.parallel.mappings.all_to_all` with the expert axis
split and the capacity axis concatenated (the (E_local, G·C, d) layout of
GShard's einsums); combine is that pair's backward, the reverse permutation.
Backward mirrors it: d(out) (E, C_r, d) goes to the experts' ranks by the
pair's forward (a2a #3), d(buffers) comes back by its backward (a2a #4).

**Why fixed-capacity buffers, not "counts first, then the tokens".**  The
serial block already gives each expert a buffer of exactly C rows (zero rows
past its count), so the buffer is the message: its shape is known to every
rank before any message (C_j = ⌈n_j/E × capacity_factor⌉ from rank j's row
count, which all ranks know), the bytes are fixed by the configuration
(GShard's and Switch's padded all-to-all, what ``minipar.plan.moe`` counts),
and the backward sends the same shapes back.  The cost is the padding: with
C = 1.25 N/E about a fifth of the rows sent are zeros.  Only E/ep integers
per destination travel first (a2a #0), because an expert must compute its
filled rows and no others (``experts_forward``: a 1-row product may round
differently from the same row inside a larger one).

**Same drops as the serial block.**  Each rank routes its own micro-batch as
one group, with capacity over its own k·n_r assignments — GShard's local groups — so
dispatch on rank r *is* the serial block on rank r's rows, and
``serial_reference(spec, world)`` (one micro-batch per data-parallel rank,
cut like the ranks' rows) drops exactly the same tokens.  An expert computes
each source's rows as its own matrix (a loop over experts and sources, never
over tokens), the very product the serial block computes for that
micro-batch, so the forward is bit-identical; its weight gradient sums the
sources in rank order, as gradient accumulation sums the micro-batches.

:func:`ep_units` builds one rank's GPT from these blocks (the EP engine and
the hybrid engine's EP stages can share it).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from minipar import spans
from minipar.backend import to_host, xp
from minipar.nn.gpt import (
    BlockUnit,
    EmbedUnit,
    HeadUnit,
    block_backward,
    block_forward,
    param_shapes,
)
from minipar.nn.gpt_config import GPTConfig
from minipar.nn.moe_steps import (
    combine_backward,
    combine_forward,
    dispatch_backward,
    dispatch_forward,
    experts_backward,
    experts_forward,
)
from minipar.nn.units import Unit
from minipar.parallel.expert_parallel.layout import OPS, expert_ids
from minipar.parallel.mappings import all_to_all

__all__ = ["EPBlockUnit", "EPMoE", "ep_units"]


class EPMoE:
    """One MoE layer whose experts are spread over ``comm`` (the ``ep`` group).

    ``caps`` = [C_j for each rank j of the group] (every rank knows every C_j:
    they follow from the row counts); ``tokens`` = this rank's n_r, the tokens
    of one forward call; ``ids`` the experts this rank holds.
    ``forward(p, x) -> (y, saved)``, ``backward(p, saved, dy, daux) -> (dx, grads)``
    like :func:`minipar.nn.moe.moe_forward` / ``moe_backward``; ``p`` holds the
    router and this rank's experts only, and so do the grads.
    """

    def __init__(self, comm: Any, cfg: GPTConfig, caps: list[int], tokens: int) -> None:
        self.comm, self.cfg, self.caps, self.tokens = comm, cfg, [int(c) for c in caps], tokens
        self.ep, self.coord = comm.size, comm.rank
        self.ids = expert_ids(cfg.n_experts, self.ep, self.coord)
        self.per = len(self.ids)
        self.offsets = spans.offsets(self.caps)

    def _a2a(self, x: Any, reverse: bool, op: str) -> Any:
        kw = {"split_axis": 0, "concat_axis": 1, "split_sizes": [self.per] * self.ep,
              "output_sizes": self.caps, "op": op}
        return (all_to_all.backward if reverse else all_to_all.forward)(self.comm, x, **kw)

    def forward(self, p: dict[str, Any], x: Any) -> tuple[Any, dict[str, Any]]:
        cfg = self.cfg
        h = x.reshape(-1, x.shape[-1])
        if h.shape[0] != self.tokens:  # the others' C_j would not match what arrives
            raise ValueError(f"expert parallelism: this rank routes {h.shape[0]} tokens, but its "
                             f"capacity C = {self.caps[self.coord]} was set for {self.tokens}")
        buffers, sd = dispatch_forward(p["router"], h, cfg.n_experts, cfg.top_k,
                                       cfg.capacity_factor, cfg.aux_loss_coef)
        # the host needs the counts (which rows to compute): one small device->host copy
        counts = to_host(sd["tokens_per_expert"])
        got = all_to_all.forward(self.comm, np.asarray(counts, dtype=np.int64).reshape(-1, 1),
                                 split_axis=0, concat_axis=1,
                                 split_sizes=[self.per] * self.ep, output_sizes=[1] * self.ep,
                                 op=OPS[0])  # (E/ep, ep): rows source j filled for expert i
        rows = self._a2a(buffers, False, OPS[1])  # (E/ep, Σ C_j, d)
        out = xp.zeros_like(rows)
        s_experts = []
        for j, (o, c) in enumerate(zip(self.offsets, self.caps)):  # one source at a time
            oj, sj = experts_forward(p, rows[:, o:o + c], got[:, j], self.ids)
            out[:, o:o + c] = oj
            s_experts.append(sj)
        back = self._a2a(out, True, OPS[2])  # (E, C_r, d)
        y, s_combine = combine_forward(back, sd)
        saved = {**sd, "tokens_per_expert": counts, "x_shape": x.shape, "experts": s_experts,
                 "combine": s_combine}
        return y.reshape(x.shape), saved

    def backward(self, p: dict[str, Any], saved: dict[str, Any], dy: Any,
                 daux: float = 1.0) -> tuple[Any, dict[str, Any]]:
        d_back, d_gates = combine_backward(saved["combine"], dy.reshape(-1, dy.shape[-1]))
        d_out = self._a2a(d_back, False, OPS[3])  # (E/ep, Σ C_j, d) to the experts' ranks
        d_rows = xp.zeros_like(d_out)
        grads: dict[str, Any] = {}
        for (o, c), se in zip(zip(self.offsets, self.caps), saved["experts"]):
            db, g = experts_backward(p, se, d_out[:, o:o + c])
            d_rows[:, o:o + c] = db
            for k, v in g.items():  # sources in rank order, as micro-batches accumulate
                grads[k] = v if k not in grads else grads[k] + v
        d_buffers = self._a2a(d_rows, True, OPS[4])  # (E, C_r, d) back to the tokens' rank
        dh, d_router = dispatch_backward(p["router"], saved, d_buffers, d_gates, daux)
        return dh.reshape(saved["x_shape"]), {"router": d_router, **grads}


class EPBlockUnit(Unit):
    """Transformer block ``i`` whose MoE runs across ranks: x + attn(ln1(x)), then
    + EPMoE(ln2(·)).  It is :func:`minipar.nn.gpt.block_forward` / ``block_backward``
    with :class:`EPMoE` as the feed-forward step (``ffn=``), so the dense part is the
    serial code, bit-identical.  ``names``: the block's dense parameters, the router,
    and this rank's experts only."""

    def __init__(self, cfg: GPTConfig, i: int, moe: EPMoE) -> None:
        self.cfg, self.moe, self.name, self.prefix = cfg, moe, f"block {i}", f"blocks.{i}."
        mine = tuple(f"moe.experts.{e}." for e in moe.ids)
        local = [n[len(self.prefix):] for n in param_shapes(cfg) if n.startswith(self.prefix)]
        self.names = tuple(n for n in local
                           if not n.startswith("moe.experts.") or n.startswith(mine))

    def forward(self, p: dict[str, Any], x: Any) -> tuple[Any, Any]:
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
    blocks = [EPBlockUnit(cfg, i, EPMoE(comm, cfg, caps, tokens)) if cfg.is_moe_block(i)
              else BlockUnit(cfg, i) for i in range(cfg.n_layer)]
    return (EmbedUnit(cfg), *blocks, HeadUnit(cfg))
