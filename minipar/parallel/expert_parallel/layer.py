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

The all-to-all is :func:`minipar.collectives.alltoall.all_to_all_rows` with the expert axis
split and the capacity axis concatenated (the (E_local, G·C, d) layout of
GShard's einsums), posted non-blocking: inside DualPipe's overlapped pair the other
micro-batch computes while it travels (:mod:`minipar.overlap`), elsewhere the layer
waits for it at once.  :func:`to_experts` (a2a #0 and #1); the way back is that
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

**Dropless** (``capacity_factor=None``; MegaBlocks, Gale et al. 2022): a source's
buffer is as long as its most loaded expert, so the padding is no longer known in
advance and would be most of the message.  Then the counts (a2a #0) are the sizes:
each source sends each expert only its filled rows, packed
(:func:`minipar.nn.moe_routing.pack`), a variable-size all-to-all whose bytes are the
tokens that really went; the expert's rank unpacks them per source into a buffer of
its own (no message), computes, packs the outputs back.  The padded layout is the
same code with every expert's rows = C_j.

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

from minipar.backend import to_host, xp
from minipar.collectives.alltoall import all_to_all_rows
from minipar.nn.gpt_config import GPTConfig
from minipar.nn.moe_routing import (pack, shared_backward, shared_forward, split_rows,
                                   unpack)
from minipar.nn.moe_steps import (combine_backward, combine_forward, dispatch_backward,
                                  dispatch_forward, experts_backward, experts_forward)
from minipar.parallel.expert_parallel.layout import expert_ids

__all__ = ["EPMoE", "from_experts", "to_experts"]


def to_experts(comm: Any, rows: Any, sent: Any, got: Any, op: str) -> Any:
    """All-to-all to the experts' ranks: my rows packed by expert (``sent`` (E,) rows each,
    experts c·E/ep … (c+1)·E/ep − 1 to rank c) -> the rows of my experts, source by source
    (``got`` (E/ep, ep): the rows source j sends each of my experts)."""
    return all_to_all_rows(comm, rows, op, [int(v) for v in sent.reshape(comm.size, -1).sum(1)],
                           [int(v) for v in got.sum(axis=0)])


def from_experts(comm: Any, rows: Any, sent: Any, got: Any, op: str) -> Any:
    """The reverse all-to-all, back to the tokens' ranks (:func:`to_experts`' adjoint: source
    j's rows return to rank j)."""
    return to_experts(comm, rows, got.T.reshape(-1), sent.reshape(comm.size, -1).T, op)


class EPMoE:
    """One MoE layer whose experts are spread over ``comm`` (the ``ep`` group).

    ``caps`` = [C_j for each rank j of the group] (every rank knows every C_j:
    they follow from the row counts; None when dropless); ``ids`` the experts this rank
    holds.  ``forward(p, x) -> (y, saved)``, ``backward(p, saved, dy, daux) -> (dx, grads)``
    like :func:`minipar.nn.moe.moe_forward` / ``moe_backward``; ``p`` holds the
    router, the shared experts (replicated) and this rank's experts only, and so do the
    grads.
    """

    def __init__(self, comm: Any, cfg: GPTConfig, caps: list[int | None]) -> None:
        self.comm, self.cfg, self.caps = comm, cfg, caps
        self.ids = expert_ids(cfg.n_experts, comm.size, comm.rank)

    def forward(self, p: dict[str, Any], x: Any) -> tuple[Any, dict[str, Any]]:
        cfg, comm = self.cfg, self.comm
        h = x.reshape(-1, x.shape[-1])
        buffers, sd = dispatch_forward(p["router"], h, cfg.n_experts, cfg.top_k,
                                       bias=p.get("expert_bias"), seq_len=x.shape[-2],
                                       **cfg.moe_options())  # (E, C_r, d)
        counts = np.asarray(to_host(sd["tokens_per_expert"]), dtype=np.int64)  # host-side
        n = np.ones((cfg.n_experts,), dtype=np.int64)
        got = to_experts(comm, counts.reshape(-1, 1), n, n.reshape(comm.size, -1).T,
                         "ep_counts").reshape(comm.size, -1).T  # (E/ep, ep): rows j filled
        sent, rows_in = (counts, got) if self.caps[0] is None else (  # dropless, or padded
            np.full(cfg.n_experts, sd["capacity"]), np.array([self.caps] * len(self.ids)))
        rows = to_experts(comm, pack(buffers, sent), sent, rows_in, "ep_dispatch")
        outs, s_experts = [], []
        for j, part in enumerate(split_rows(rows, rows_in.sum(axis=0))):  # source by source
            out, sj = experts_forward(p, unpack(part, rows_in[:, j]), got[:, j], self.ids)
            outs.append(pack(out, rows_in[:, j]))
            s_experts.append(sj)
        back = from_experts(comm, xp.concatenate(outs), sent, rows_in, "ep_combine")
        y, s_combine = combine_forward(unpack(back, sent, buffers.shape[1]), sd)
        ys, s_shared = shared_forward(p, h, cfg.shared_experts)
        saved = {**sd, "tokens_per_expert": counts, "x_shape": x.shape, "experts": s_experts,
                 "combine": s_combine, "shared": s_shared, "sent": sent, "rows_in": rows_in}
        return (y if ys is None else y + ys).reshape(x.shape), saved

    def backward(self, p: dict[str, Any], saved: dict[str, Any], dy: Any,
                 daux: float = 1.0) -> tuple[Any, dict[str, Any]]:
        sent, rows_in, dy = saved["sent"], saved["rows_in"], dy.reshape(-1, dy.shape[-1])
        d_back, d_gates = combine_backward(saved["combine"], dy)
        d_out = to_experts(self.comm, pack(d_back, sent), sent, rows_in, "ep_combine_grad")
        d_rows, grads = [], {}
        for j, (part, se) in enumerate(zip(split_rows(d_out, rows_in.sum(axis=0)),
                                           saved["experts"])):
            d_buf, g = experts_backward(p, se, unpack(part, rows_in[:, j]))
            d_rows.append(pack(d_buf, rows_in[:, j]))
            for k, v in g.items():  # sources in rank order, as micro-batches accumulate
                grads[k] = v if k not in grads else grads[k] + v
        d_buffers = from_experts(self.comm, xp.concatenate(d_rows), sent, rows_in,
                                 "ep_dispatch_grad")
        dh, d_router = dispatch_backward(p["router"], saved,
                                         unpack(d_buffers, sent, saved["capacity"]), d_gates,
                                         daux)
        d_shared, g_shared = shared_backward(p, saved["shared"], dy)
        dh = dh if d_shared is None else dh + d_shared
        return dh.reshape(saved["x_shape"]), {"router": d_router, **grads, **g_shared}
