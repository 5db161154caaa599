"""DeepSeek-V3's pipelines: DualPipe and DualPipe-V, a forward and a backward overlapped.

EN DualPipe (bidirectional pipeline) · RU DualPipe (двунаправленный конвейер) ·
ZH DualPipe（双向流水线）

DeepSeek-AI 2024, "DeepSeek-V3 Technical Report", arXiv 2412.19437, §3.2.1 and Fig. 5;
the step structure is that of DeepSeek's ``DualPipe`` repository (``dualpipe.py``,
``dualpipev.py``, the latter Sea AI Lab's "cut-in-half"), rebuilt here as data.  Built on
the B/W split of the zero-bubble schedules (Qi et al. 2023, :mod:`.zero_bubble`).

**DualPipe** (``dualpipe``, PP = p ranks, p even, m even, m >= 2p): micro-batches enter
from *both* ends, m/2 at each.  Rank s holds stage s of the pipeline going down the ranks
(its chunk 0) and stage p − 1 − s of the one going up (its chunk 1) — two copies of the
model's parameters over the ranks, whose gradients are summed before the step (ranks s
and p − 1 − s hold the same two stages) so that both copies stay one model.  Placement
``"dual"`` (:func:`~.stage_loop.ends`); micro-batch i of chunk 0 is row block i of the
step, micro-batch i of chunk 1 row block m/2 + i.

**DualPipe-V** (``dualpipev``, p ranks, PP = 2p stages, m >= 2p): ZB-V's V placement —
rank s holds stages s and 2p − 1 − s, one copy of the model, 2× a stage's parameters per
rank — and DualPipe's steps, folded: rank s of DualPipe-V runs what ranks s and
2p − 1 − s of a 2p-rank DualPipe run, every micro-batch going down and back up.

Both run DeepSeek's eight steps on (half-)rank r of n, M micro-batches per *phase*
(DualPipe: n = p/2, r = min(s, p − 1 − s), M = m/2, phase 0 the direction whose
entrance is nearer to rank s; DualPipe-V: n = p, r = s, M = m, phase = chunk)::

    1  nF0     2(n − r − 1) forwards of phase 0          warm-up
    2  nF0F1   r + 1 times: F phase 0, F phase 1
    3  nB1W1F1 n − r − 1 times: B (its W at once), W, F of phase 1   zero bubble
    4  nF0B1F1B0  M − 2n + r + 1 times: (F0 & B1), (F1 & B0)        overlapped pairs
    5  nB1F1B0 n − r − 1 times: B phase 1, (F1 & B0)
    6  nB1B0   r + 1 times: B phase 1, B phase 0 — from the middle one on, B only:
               their W's wait                                      cool-down
    7  nWB0    n − r − 1 times: a waiting W, B phase 0 (its W waits)
    8  nW      the r + 1 W's left fill the end

``(F0 & B1)`` is a :class:`~.stage_loop.ForwardBackward`: a forward of one micro-batch and
the whole backward of another, overlapped.  As in the repository, the middle rank
(r = n − 1) runs its first pair of step 4 as F then B, not overlapped (its F0's output is
what its own B1 needs soonest); W's leave a FIFO in the order their B's ran.

Drawn by the simulator, p = 4, m = 8, F = B − W = W = 1 (a pair F&B = F + B = 3, drawn as
its F then its B; upper case: going down the ranks, lower case: going up; ``B0B0`` a whole
backward, ``b0`` alone its input part, ``w0`` its weight part)::

    stage 0  F0F1F2f0b0w0f1F3b1b1. f2B0B0b2b2. f3B1B1b3b3B2W2B3W3
    stage 1  . F0f0F1f1F2b0b0f2B0B0F3b1b1f3B1B1b2b2B2B2. b3B3w3W3
    stage 2  . f0F0f1F1f2B0B0F2b0b0f3B1B1F3b1b1B2B2b2b2. B3b3W3w3
    stage 3  f0f1f2F0B0W0F1f3B1B1. F2b0b0B2B2. F3b1b1B3B3b2w2b3w3

Ranks s and p − 1 − s mirror each other; DualPipe-V on 2 ranks (m = 4, lower case: the
V's way back) runs exactly rows 0 and 1.  Each rank idles (PP/2 − 1)(F&B + B − 3W) = 2
at most (ranks 0 and 3; 1 on ranks 1, 2): the table's bubble, which this schedule meets
when F = B − W and F&B = F + B (``minipar bubble --costs`` shows the other cases and by
how much they differ).  Activations: PP + 1 = 5 chunk-activations in flight on every rank.

**Where this differs from the repository.**  The order of computation is DeepSeek's; the
messages are minipar's (:func:`~.schedule.with_comm`: each receive right before its
compute, each send right after), where the repository delays a few sends to overlap them
(step 2 sends F0's output after F1).  Sends are non-blocking, as the repository's
``batch_isend_irecv``: with synchronous sends both schedules deadlock (the checker's
``sends="rendezvous"``), as interleaved 1F1B does.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from minipar.parallel.pipeline.stage_loop import (
    Backward,
    BackwardInput,
    BackwardWeight,
    Forward,
    ForwardBackward,
)

#: DeepSeek-V3's schedules: bidirectional, and its V-shaped cut in half
DUALPIPE = ("dualpipe", "dualpipev")


def dualpipe_order(kind: str, stage: int, p: int, m: int) -> list[Any]:
    """The compute order of ``kind`` (dualpipe, dualpipev) on rank ``stage`` of ``p``:
    :func:`steps` with DualPipe's halves (phase 0 = chunk 0 on the first half of the
    ranks, chunk 1 on the second) or DualPipe-V's whole (phase = chunk)."""
    if kind == "dualpipev":
        return steps(p, stage, m, lambda phase: phase)
    second = int(stage >= p // 2)
    return steps(p // 2, min(stage, p - 1 - stage), m // 2, lambda phase: phase ^ second)


def steps(n: int, r: int, M: int, chunk: Callable[[int], int]) -> list[Any]:
    """DeepSeek's eight steps on (half-)rank ``r`` of ``n``, ``M`` micro-batches per phase
    (the module docstring); ``chunk(phase)``: my chunk of that phase."""
    order: list[Any] = []
    nf, nb = [0, 0], [0, 0]                     # next forward / backward, per phase
    waiting: list[BackwardWeight] = []          # W's of the B's run alone, FIFO

    def F(ph: int) -> Forward:
        nf[ph] += 1
        return Forward(nf[ph] - 1, chunk(ph))

    def B(ph: int, zb: bool = False) -> Backward | BackwardInput:
        nb[ph] += 1
        if zb:
            waiting.append(BackwardWeight(nb[ph] - 1, chunk(ph)))
        return (BackwardInput if zb else Backward)(nb[ph] - 1, chunk(ph))

    def W() -> BackwardWeight:
        return waiting.pop(0)

    order += [F(0) for _ in range(2 * (n - r - 1))]                     # 1 nF0
    for _ in range(r + 1):                                               # 2 nF0F1
        order += [F(0), F(1)]
    for _ in range(n - r - 1):                                           # 3 nB1W1F1
        order += [B(1, zb=True), W(), F(1)]
    for i in range(M - 2 * n + r + 1):                                   # 4 nF0B1F1B0
        order += [F(0), B(1)] if i == 0 and r == n - 1 else [ForwardBackward(F(0), B(1))]
        order.append(ForwardBackward(F(1), B(0)))
    for _ in range(n - r - 1):                                           # 5 nB1F1B0
        order += [B(1), ForwardBackward(F(1), B(0))]
    zb = False
    for i in range(r + 1):                                               # 6 nB1B0
        zb = zb or (i == (r + 1) // 2 and r % 2 == 1)
        order.append(B(1, zb))
        zb = zb or (i == (r + 1) // 2 and r % 2 == 0)
        order.append(B(0, zb))
    for _ in range(n - r - 1):                                           # 7 nWB0
        order += [W(), B(0, zb=True)]
    return order + [W() for _ in range(r + 1)]                           # 8 nW


def check_dualpipe(kind: str, p: int, m: int, v: int) -> None:
    """DeepSeek's own conditions, each a one-line ``ValueError``: DualPipe needs p even,
    m even and m >= 2p; DualPipe-V m >= 2p (= PP, its stages); both two chunks a rank."""
    if v != 2:
        raise ValueError(f"{kind} holds exactly 2 model chunks per rank, got v={v} (use v=2;"
                         f" {kind} cannot be interleaved further)")
    if kind == "dualpipe" and (p % 2 or m % 2):
        raise ValueError(f"dualpipe feeds m/2 micro-batches from each end of p/2 rank pairs: "
                         f"needs p and m even, got p={p}, m={m}")
    if m < 2 * p:
        pp = "PP = p" if kind == "dualpipe" else "PP = 2p (its stages)"
        raise ValueError(f"{kind} needs m >= 2p = {2 * p} micro-batches ({pp}), got m={m}")
