"""Vocab-parallel cross-entropy: the loss from logits split by vocabulary — перекрёстная
энтропия по частям словаря — 词表并行交叉熵.

EN vocab-parallel cross-entropy · RU перекрёстная энтропия с разбиением словаря · ZH 词表并行交叉熵

Megatron-LM (Shoeybi et al. 2019, arXiv 1909.08053, §3: "fuse the output embedding GEMM
with the cross-entropy loss", ``vocab_parallel_cross_entropy``).  Rank r of t holds the
column-parallel logits z_r (N, V/t) of vocabulary ids [r·V/t, (r+1)·V/t); no rank ever
holds the full (N, V).  With m = max over ranks of max_j z (all-reduce max), then one
all-reduce sum of (S_r, z_target,r) — S = Σ_r Σ_j e^{z−m}, z_target from the one rank
that owns the target id:

    loss = mean_n [ log S_n − (z_{n,target} − m_n) ],   dz_r = (e^{z_r−m}/S − onehot_r)/N,

the serial :mod:`minipar.nn.loss` exactly (tests/mpi/tp_check.py: loss and gradient
against it, float64).  Messages: N + 2N numbers, counted under ``tp_ce``.
"""

from __future__ import annotations

from typing import Any

from minipar.backend import xp
from minipar.collectives import _base as B
from minipar.collectives import allreduce
from minipar.nn._dtype import down, up

__all__ = ["vocab_parallel_cross_entropy_backward", "vocab_parallel_cross_entropy_forward"]


def vocab_parallel_cross_entropy_forward(comm: Any, logits: Any, targets: Any,
                                         op: str = "tp_ce") -> tuple[float, tuple]:
    """Mean cross-entropy from this rank's vocabulary columns ``logits`` (..., V/t) and the
    full ``targets`` (...); two all-reduces of N and 2N numbers (N = targets.size)."""
    c = B.traced(comm)
    vl = logits.shape[-1]
    lo = c.rank * vl
    z = up(logits).reshape(-1, vl)
    t = targets.reshape(-1)
    n = z.shape[0]
    with c.operation(op):
        m = allreduce(c, z.max(axis=-1), "max", "ring")
    e = z - m[:, None]
    xp.exp(e, out=e)
    mine = (t >= lo) & (t < lo + vl)
    rows = xp.arange(n)
    zt = xp.where(mine, z[rows, xp.where(mine, t - lo, 0)] - m, 0.0)
    with c.operation(op):
        s_zt = allreduce(c, xp.stack([e.sum(axis=-1), zt]), "sum", "ring")
    s, zt = s_zt[0], s_zt[1]
    loss = float((xp.log(s) - zt).mean())
    e /= s[:, None]  # this rank's columns of the softmax
    return loss, (e, t - lo, mine, logits.shape, logits.dtype)


def vocab_parallel_cross_entropy_backward(saved: tuple, dloss: float = 1.0) -> Any:
    """dL/dz on this rank's columns: dloss · (softmax_r − onehot_r) / N (no message)."""
    p, local, mine, shape, dtype = saved
    n = p.shape[0]
    g = p.copy()
    rows = xp.nonzero(mine)[0]
    g[rows, local[rows]] -= 1.0
    g *= float(dloss) / n
    return down(g.reshape(shape), dtype)
