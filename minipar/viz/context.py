"""Figures for context parallelism: Ulysses vs ring traffic, the online-softmax merge.

EN context parallelism · RU контекстный параллелизм · ZH 上下文并行

Bytes one rank sends per layer forward, from the formulas of
:mod:`minipar.plan.activations` (N = b·s tokens, h hidden, P ranks, e bytes
per element; per rank = per link x (P-1)/P):

    DeepSpeed-Ulysses  4Nh/P per link     -> 4Nh(P-1)/P² · e   (Jacobs et al. 2023, 2309.14509)
    Megatron-SP        4Nh per link       -> 4Nh(P-1)/P  · e   (the same paper, §3.2)
    ring attention     K, V pass P-1 hops -> 2Nh(P-1)/P  · e   (Liu et al. 2023, 2310.01889)

so per rank the ring sends P/2 times what Ulysses sends, and both grow
linearly with s.  :func:`merge_walk` runs one query over blocks of keys with
:mod:`minipar.nn.blockwise_attention` and keeps every number of the
log-sum-exp merge; :func:`merge_figure` draws them.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import matplotlib.pyplot as plt
import numpy as np
from matplotlib.figure import Figure

from minipar.nn.blockwise_attention import attention_block_forward, merge_attention
from minipar.plan.activations import (
    megatron_sp_elements_per_link,
    ring_attention_bytes_per_rank,
    ulysses_alltoall_elements_per_link,
)

KINDS = ("ulysses", "ring", "megatron-sp")
COLORS = {"ulysses": "#4c72b0", "ring": "#dd8452", "megatron-sp": "#999999"}
BLOCK_COLORS = ("#4c72b0", "#dd8452", "#55a868", "#c44e52", "#8172b3")


def bytes_per_rank(kind: str, s: int, b: int, h: int, P: int, itemsize: int = 2) -> float:
    """Bytes one of P ranks sends per layer forward, for ``kind`` in :data:`KINDS`."""
    if kind == "ring":
        return ring_attention_bytes_per_rank(s, b, h, P, itemsize)
    per_link = {"ulysses": ulysses_alltoall_elements_per_link,
                "megatron-sp": megatron_sp_elements_per_link}
    if kind not in per_link:
        raise ValueError(f"unknown kind {kind!r}; one of {', '.join(KINDS)}")
    return per_link[kind](b * s, h, P) * (P - 1) / P * itemsize


def cp_traffic(b: int, h: int, seqs: Sequence[int], ranks: Sequence[int], P: int, s: int,
               itemsize: int = 2, measured: Iterable[Mapping[str, Any]] = ()) -> Figure:
    """Left: bytes per rank vs sequence length at P ranks; right: vs ranks at length s.

    ``measured``: points ``{"kind", "s", "P", "bytes"}`` counted by a run, drawn as
    markers on the panel (and at the place) they belong to."""
    fig, (a1, a2) = plt.subplots(1, 2, figsize=(10, 3.8))
    for kind in KINDS:
        style = {"color": COLORS[kind], "label": kind,
                 "linestyle": ":" if kind == "megatron-sp" else "-"}
        a1.plot(seqs, [bytes_per_rank(kind, x, b, h, P, itemsize) for x in seqs], **style)
        a2.plot(ranks, [bytes_per_rank(kind, s, b, h, p, itemsize) for p in ranks], **style)
    for m in measured:
        mk = {"color": COLORS[m["kind"]], "marker": "o", "s": 50, "zorder": 3,
              "edgecolor": "black"}
        if m["P"] == P:
            a1.scatter([m["s"]], [m["bytes"]], **mk)
        if m["s"] == s:
            a2.scatter([m["P"]], [m["bytes"]], **mk)
    a1.set_xlabel("sequence length s")
    a1.set_title(f"P = {P} ranks")
    a2.set_xlabel("ranks P")
    a2.set_title(f"s = {s}")
    for ax in (a1, a2):
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_ylabel("bytes per rank, one layer forward")
        ax.legend(fontsize=8)
    fig.suptitle(f"context parallelism traffic (b = {b}, h = {h}, {itemsize}-byte elements); "
                 "● counted")
    fig.tight_layout()
    return fig


def merge_walk(scores: Sequence[float], values: Sequence[float], block: int) -> dict[str, Any]:
    """One query over keys in blocks of ``block``: every number of the online softmax.

    ``scores`` are q·k_j / sqrt(d) (any reals), ``values`` one number per key.
    Returns ``{"steps": [...], "full": {...}, "average": float}``: per step the
    block's keys, its (o, lse), the weights exp(lse_old - lse) and
    exp(lse_blk - lse), the running (o, lse); the full softmax's o, lse and
    probabilities; and the (wrong) plain average of the blocks' outputs."""
    s, v = np.asarray(scores, dtype=np.float64), np.asarray(values, dtype=np.float64)
    if s.shape != v.shape or s.ndim != 1 or not s.size or block < 1:
        raise ValueError(f"need as many scores as values (got {s.shape}, {v.shape}) and "
                         f"block >= 1 (got {block})")
    T = s.size
    # q·k_j / sqrt(1) = s_j with q = 1 and k_j = s_j (d = 1); the query sits after every key
    q, k = np.ones((1, 1, 1, 1)), s.reshape(1, 1, T, 1)
    vv = v.reshape(1, 1, T, 1)
    o, lse = np.zeros((1, 1, 1, 1)), np.full((1, 1, 1), -np.inf)
    steps = []
    for lo in range(0, T, block):
        hi = min(T, lo + block)
        ob, lb = attention_block_forward(q, k[:, :, lo:hi], vv[:, :, lo:hi], T, lo)
        new_o, new_lse = merge_attention(o, lse, ob, lb)
        steps.append({"keys": (lo, hi), "o_blk": float(ob.item()), "lse_blk": float(lb.item()),
                      "w_old": float(np.exp(lse - new_lse).item()),
                      "w_blk": float(np.exp(lb - new_lse).item()),
                      "o": float(new_o.item()), "lse": float(new_lse.item())})
        o, lse = new_o, new_lse
    p = np.exp(s - s.max())
    p /= p.sum()
    return {"steps": steps,
            "full": {"o": float(p @ v), "lse": float(np.logaddexp.reduce(s)), "p": p.tolist()},
            "average": float(np.mean([st["o_blk"] for st in steps]))}


def merge_figure(walk: Mapping[str, Any]) -> Figure:
    """Left: the full softmax's p_j, coloured by block, each block's weight written on it;
    right: the running output after each merge, the true output and the plain average."""
    steps, full = walk["steps"], walk["full"]
    fig, (a1, a2) = plt.subplots(1, 2, figsize=(10, 3.6))
    for i, st in enumerate(steps):
        lo, hi = st["keys"]
        col = BLOCK_COLORS[i % len(BLOCK_COLORS)]
        a1.bar(range(lo, hi), full["p"][lo:hi], color=col, label=f"block {i}")
        a1.text((lo + hi - 1) / 2, max(full["p"][lo:hi]) * 1.05,
                f"Σp = exp(lse_{i} − lse)\n= {sum(full['p'][lo:hi]):.3f}", ha="center",
                fontsize=8)
    a1.set_xlabel("key j")
    a1.set_ylabel("softmax weight p_j (all keys)")
    a1.set_ylim(0, max(full["p"]) * 1.45)
    a1.legend(fontsize=8)
    x = np.arange(1, len(steps) + 1)
    a2.plot(x, [st["o"] for st in steps], "o-", label="running o (merged)")
    a2.axhline(full["o"], color="black", linestyle="--", label="full attention")
    a2.axhline(walk["average"], color="#c44e52", linestyle=":", label="plain average (wrong)")
    a2.set_xticks(x)
    a2.set_xlabel("blocks merged")
    a2.set_ylabel("output o")
    a2.legend(fontsize=8)
    fig.suptitle("online softmax: each block's o weighed by its share of the normaliser")
    fig.tight_layout()
    return fig
