"""Exercise: ring attention's online-softmax merge, written by you.

EN ring attention · RU кольцевое внимание · ZH 环形注意力

Grade it (4 ranks by default):

    minipar exercise check ring_attention_merge ring_attention_merge.py -n 4

THE SETTING (Liu, Zaharia & Abbeel 2023, Ring Attention, arXiv 2310.01889)
    A sequence of T = N·B tokens is cut into N blocks of B; rank r holds the
    queries x, keys k and values v of block r (arrays (..., B, d)).  No rank
    may hold the whole sequence, yet each must compute its rows of

        o = softmax(q kᵀ / sqrt(d)) v      over ALL T keys (causal or not)

    The K/V blocks travel around the ring: at step s = 0 … N-1 rank r holds
    the block of rank src = (r - s) % N (its own first), then passes it on.
    The loop below is given; attention_block() (given) attends the queries
    to ONE block and returns a partial result (o_blk, lse_blk):

        o_blk   = softmax over that block's keys alone, times its values
        lse_blk = log Σ_j exp(q·k_j / sqrt(d)) over that block's keys

THE GOAL
    1. merge(o, lse, o_blk, lse_blk): the partial result over the keys of
       both.  The softmax's denominators ADD, so (online softmax, Milakov &
       Gimelshein 2018; FlashAttention):

           lse_new = log(exp(lse) + exp(lse_blk))        (np.logaddexp)
           o_new   = exp(lse - lse_new) · o + exp(lse_blk - lse_new) · o_blk

       (lse has one axis less than o: use lse[..., None] to weigh o.)
       The start, o = 0 and lse = -inf, is "no key seen yet".
    2. The causal mask, in the loop: query i may see key j only if j <= i,
       in GLOBAL positions.  A block from an earlier rank (src < r) is all
       past: no mask.  The own block (src == r): the lower triangle,
       np.tri(B, dtype=bool).  A later block (src > r): all future: skip it.

WHAT THE GRADER MEASURES
    * The result, against full attention over the whole sequence (float64,
      the serial model's attention core when causal), causal and not.  A
      wrong result is named when it is exactly a known mistake: a plain
      average of the o_blk, no rescaling by exp(lse - lse_new), the max for
      the log-sum-exp, every block masked like the diagonal, later blocks
      not skipped, ...
    * The ring: (N-1) x (|K_r| + |V_r|) bytes per rank, only to (r + 1) % N
      (keep the given comm.Sendrecv calls).
    * No MPI collectives.
    Stuck?  minipar exercise hint ring_attention_merge   (level 1, 2, 3)
"""

# ruff: noqa: F841  (the names set up below are yours to use)
from __future__ import annotations

import math

import numpy as np


def attention_block(q: np.ndarray, k: np.ndarray, v: np.ndarray,
                    mask: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
    """GIVEN: softmax attention of q over one block of keys: (o_blk, lse_blk).

    mask (B, B) bool, True where a query may see a key (None: all); a query
    that sees no key gets o_blk = 0 and lse_blk = -inf."""
    s = q @ k.swapaxes(-1, -2) / math.sqrt(q.shape[-1])
    if mask is not None:
        s = np.where(mask, s, -np.inf)
    m = s.max(axis=-1, keepdims=True)
    m = np.where(np.isfinite(m), m, 0.0)
    p = np.exp(s - m)
    total = p.sum(axis=-1, keepdims=True)
    with np.errstate(divide="ignore"):
        lse = (m + np.log(total))[..., 0]
    return (p @ v) / np.where(total > 0, total, 1.0), lse


def merge(o: np.ndarray, lse: np.ndarray, o_blk: np.ndarray,
          lse_blk: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Two partial results of the same queries over disjoint keys -> (o_new, lse_new)."""
    # TODO 1: lse_new by log-sum-exp; o_new = both outputs, each weighed by its share
    raise NotImplementedError("TODO: the online-softmax merge")


def ring_attention(comm, x: np.ndarray, k: np.ndarray, v: np.ndarray,
                   causal: bool = True) -> np.ndarray:
    """This rank's rows of attention over the whole sequence (x: its query block)."""
    n, r = comm.Get_size(), comm.Get_rank()
    right, left = (r + 1) % n, (r - 1) % n
    o, lse = np.zeros(x.shape), np.full(x.shape[:-1], -np.inf)  # nothing seen yet
    kb, vb = k.copy(), v.copy()
    B = x.shape[-2]
    for s in range(n):
        src = (r - s) % n  # whose K/V block you hold now
        # TODO 2: under the causal mask, skip later blocks and mask the own block
        o, lse = merge(o, lse, *attention_block(x, kb, vb))
        if s < n - 1:  # GIVEN: pass the block on: send to the right, receive from the left
            k_in, v_in = np.empty_like(kb), np.empty_like(vb)
            comm.Sendrecv(kb, dest=right, recvbuf=k_in, source=left)
            comm.Sendrecv(vb, dest=right, recvbuf=v_in, source=left)
            kb, vb = k_in, v_in
    return o
