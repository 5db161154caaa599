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
GShard's einsums): :func:`to_experts` (a2a #0 and #1); the way back is that
pair's backward, the reverse permutation: :func:`from_experts` (a2a #2).
Backward mirrors it: d(out) (E, C_r, d) goes to the experts' ranks by
:func:`to_experts` (a2a #3), d(buffers) comes back by :func:`from_experts` (a2a #4).

**Why fixed-capacity buffers, not "counts first, then the tokens".**  The
serial block already gives each expert a buffer of exactly C rows (zero rows
past its count), so the buffer is the message: its shape is known to every
rank before any message (C_j = ⌈k·n_j/E × capacity_factor⌉ from rank j's row
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

:func:`~minipar.parallel.expert_parallel.model.ep_units` builds one rank's GPT from
these layers (the EP engine and the hybrid's EP stages share it).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from minipar import spans
from minipar.backend import to_host, xp
from minipar.nn.gpt_config import GPTConfig
from minipar.nn.moe_steps import (
    combine_backward,
    combine_forward,
    dispatch_backward,
    dispatch_forward,
    experts_backward,
    experts_forward,
)
from minipar.parallel.expert_parallel.layout import expert_ids
from minipar.parallel.mappings import all_to_all

__all__ = ["EPMoE", "from_experts", "to_experts"]


def to_experts(comm: Any, x: Any, caps: list[int], op: str) -> Any:
    """All-to-all to the experts' ranks: my (E, C_r, ...) -> (E/ep, Σ_j C_j, ...).

    Block c of the expert axis (experts c·E/ep … (c+1)·E/ep − 1) goes to rank c;
    what arrives is joined along the capacity axis, source j's C_j rows at offset
    Σ_{i<j} C_i (``caps`` = [C_j for every rank j of ``comm``, the ep group])."""
    ep = comm.size
    return all_to_all.forward(comm, x, split_axis=0, concat_axis=1,
                              split_sizes=[x.shape[0] // ep] * ep, output_sizes=caps, op=op)


def from_experts(comm: Any, y: Any, caps: list[int], op: str) -> Any:
    """The reverse all-to-all, back to the tokens' ranks: (E/ep, Σ_j C_j, ...) -> (E, C_r, ...)
    (:func:`to_experts`' adjoint: source j's rows return to rank j)."""
    ep = comm.size
    return all_to_all.backward(comm, y, split_axis=0, concat_axis=1,
                               split_sizes=[y.shape[0]] * ep, output_sizes=caps, op=op)


class EPMoE:
    """One MoE layer whose experts are spread over ``comm`` (the ``ep`` group).

    ``caps`` = [C_j for each rank j of the group] (every rank knows every C_j:
    they follow from the row counts); ``ids`` the experts this rank holds.
    ``forward(p, x) -> (y, saved)``, ``backward(p, saved, dy, daux) -> (dx, grads)``
    like :func:`minipar.nn.moe.moe_forward` / ``moe_backward``; ``p`` holds the
    router and this rank's experts only, and so do the grads.
    """

    def __init__(self, comm: Any, cfg: GPTConfig, caps: list[int]) -> None:
        self.comm, self.cfg, self.caps = comm, cfg, [int(c) for c in caps]
        self.ids = expert_ids(cfg.n_experts, comm.size, comm.rank)
        self.offsets = spans.offsets(self.caps)  # where source j's rows start

    def forward(self, p: dict[str, Any], x: Any) -> tuple[Any, dict[str, Any]]:
        cfg, comm = self.cfg, self.comm
        h = x.reshape(-1, x.shape[-1])
        buffers, sd = dispatch_forward(p["router"], h, cfg.n_experts, cfg.top_k,
                                       cfg.capacity_factor, cfg.aux_loss_coef)  # (E, C_r, d)
        counts = to_host(sd["tokens_per_expert"])  # the host decides which rows to compute
        got = to_experts(comm, np.asarray(counts, dtype=np.int64).reshape(-1, 1),
                         [1] * comm.size, "ep_counts")  # (E/ep, ep): rows source j filled
        rows = to_experts(comm, buffers, self.caps, "ep_dispatch")  # (E/ep, Σ C_j, d)
        out = xp.zeros_like(rows)
        s_experts = []
        for j, (o, c) in enumerate(zip(self.offsets, self.caps)):  # one source at a time
            out[:, o:o + c], sj = experts_forward(p, rows[:, o:o + c], got[:, j], self.ids)
            s_experts.append(sj)
        back = from_experts(comm, out, self.caps, "ep_combine")  # (E, C_r, d)
        y, s_combine = combine_forward(back, sd)
        saved = {**sd, "tokens_per_expert": counts, "x_shape": x.shape, "experts": s_experts,
                 "combine": s_combine}
        return y.reshape(x.shape), saved

    def backward(self, p: dict[str, Any], saved: dict[str, Any], dy: Any,
                 daux: float = 1.0) -> tuple[Any, dict[str, Any]]:
        d_back, d_gates = combine_backward(saved["combine"], dy.reshape(-1, dy.shape[-1]))
        d_out = to_experts(self.comm, d_back, self.caps, "ep_combine_grad")  # (E/ep, Σ C_j, d)
        d_rows = xp.zeros_like(d_out)
        grads: dict[str, Any] = {}
        for o, c, se in zip(self.offsets, self.caps, saved["experts"]):
            d_rows[:, o:o + c], g = experts_backward(p, se, d_out[:, o:o + c])
            for k, v in g.items():  # sources in rank order, as micro-batches accumulate
                grads[k] = v if k not in grads else grads[k] + v
        d_buffers = from_experts(self.comm, d_rows, self.caps, "ep_dispatch_grad")  # (E, C_r, d)
        dh, d_router = dispatch_backward(p["router"], saved, d_buffers, d_gates, daux)
        return dh.reshape(saved["x_shape"]), {"router": d_router, **grads}
