"""Zero-bubble pipeline schedules: ZB-H1, ZB-H2 and ZB-V, the backward split into B and W.

EN zero bubble pipeline parallelism · RU конвейер с нулевым пузырём · ZH 零气泡流水线并行

Qi et al. 2023, "Zero Bubble Pipeline Parallelism", arXiv
2401.10241.  A layer's backward is two computations: **B**, the gradient with
respect to its input (``BackwardInput``: the previous stage waits for it), and
**W**, the gradient with respect to its weights (``BackwardWeight``: only the
optimizer step needs it).  B alone goes down the pipeline, so the gradients
return sooner; the W's, which nobody waits for, fill the idle time.  Drawn with
T_F = T_B = T_W (one unit each; ``W0`` = the W of micro-batch 0), 3 stages, 6
micro-batches; 1F1B on the same costs (a whole backward ``B0B0`` = B + W)::

    1f1b     stage 0  F0F1F2. . . . B0B0F3B1B1F4B2B2F5B3B3. B4B4. B5B5
             stage 1  . F0F1. . B0B0F2B1B1F3B2B2F4B3B3F5B4B4. B5B5. .
             stage 2  . . F0B0B0F1B1B1F2B2B2F3B3B3F4B4B4F5B5B5. . . .

``zb-h1`` — 1F1B's warm-up, steady state and cool-down with each B sent on at
once (Qi et al. 2023, Fig. 3 top): stage s runs each W s B's late, so the W's
fill the idle slots that would be stage s's bubble, and its last s W's fill the
cool-down.  1F1B's peak memory: p − s micro-batches between F and B and at most
s more between B and W — p from F to W on every stage (m >= p); bubble
(p − 1)(T_F + T_B − T_W), a third of 1F1B's (m >= p)::

    zb-h1    stage 0  F0F1F2. . B0W0F3B1W1F4B2W2F5B3W3B4W4B5W5
             stage 1  . F0F1. B0F2B1W0F3B2W1F4B3W2F5B4W3B5W4W5
             stage 2  . . F0B0F1B1F2B2W0F3B3W1F4B4W2F5B5W3W4W5

``zb-h2`` — ZB-H1 with p − 1 more warm-up forwards per stage (Qi et al. 2023,
Fig. 3 bottom): 2(p − s) − 1 between F and B on stage s fill the start, then 2s
(B, F) pairs whose W's wait, one W before each later F, and the W's still
waiting fill the end: each stage busy from its first to its last instruction,
a parallelogram.  2p − 1 micro-batches from F to W on every stage, the paper's
peak (§3.2); bubble max(0, (p − 1)(T_F + T_B − 2T_W)), zero here (m >= 2p − 1)::

    zb-h2    stage 0  F0F1F2F3F4B0W0F5B1W1B2W2B3W3B4W4B5W5. .
             stage 1  . F0F1F2B0F3B1F4B2W0F5B3W1B4W2B5W3W4W5.
             stage 2  . . F0B0F1B1F2B2F3B3F4B4W0F5B5W1W2W3W4W5

``zb-v`` — two chunks per rank in a V (:func:`~.stage_loop.virtual_stage` with
``placement="v"``): chunk 0 is virtual stage s, chunk 1 is 2p − 1 − s, so rank 0
holds the first and the last chunk and the loss; 2p chunks, at least 2p units,
twice the messages.  Zero bubble with 1F1B's memory (2p chunk-activations = p
micro-batches of a whole stage; chunk costs half a stage's; lower case: chunk 1)::

    zb-v     stage 0  F0F1F2F3F4f0b0w0f1b1w1f2b2w2F5B0W0f3b3w3B1W1f4b4w4B2W2f5b5w5B3W3B4W4B5W5. .
             stage 1  . F0F1F2f0F3f1b0w0f2b1w1F4B0W0f3b2w2F5B1W1f4b3w3B2W2f5b4w4B3b5B4W3B5W4w5W5.
             stage 2  . . F0f0F1f1F2f2b0w0F3B0W0f3b1w1F4B1W1f4b2w2F5B2W2f5b3w3B3b4B4b5B5W3w4w5W4W5

The bubble here is the paper's: iteration time = the longest per-stage span
(first instruction's start to last one's end on one stage; each stage steps
its optimizer when its own W's are done), bubble = that − m(T_F + T_B + T_W)
(:func:`~minipar.parallel.pipeline.measure.bubble_time`).  ZB-H2's and ZB-V's
later stages end later than stage 0: a synchronisation of all stages before
the step (a global gradient norm, a found-inf check) brings the bubble back
(:func:`~minipar.parallel.pipeline.measure.synced_bubble_fraction`); the paper
removes it by stepping optimistically and validating afterwards.  ZB-H1's order is
:func:`zb_h1`, ZB-H2's :func:`zb_h2` and ZB-V's :func:`zb_v` (handcrafted); below
m = 2p − 1, ZB-H2 and ZB-V are built by :func:`list_schedule`, a list scheduler at
unit costs.  Each is a compute order: :func:`~.schedule.with_comm` adds the
messages, as for every schedule, and :class:`~.stage_loop.StageLoop` runs B and W.
"""

from __future__ import annotations

import functools
from typing import Any

from minipar.parallel.pipeline.stage_loop import (
    BackwardInput,
    BackwardWeight,
    Forward,
    virtual_stage,
)

#: the zero-bubble schedules (Qi et al. 2023): backward split into B and W
ZERO_BUBBLE = ("zb-h1", "zb-h2", "zb-v")


def zero_bubble_order(kind: str, stage: int, p: int, m: int) -> list[Any]:
    """The compute order of ``kind`` (zb-h1, zb-h2, zb-v) on stage ``stage``: handcrafted,
    or for zb-h2 and zb-v below m = 2p − 1, :func:`list_schedule`'s."""
    if kind == "zb-h1":
        return zb_h1(stage, p, m)
    if m < 2 * p - 1:
        return list(list_schedule(kind, p, m)[stage])
    return zb_h2(stage, p, m) if kind == "zb-h2" else zb_v(stage, p, m)


def zb_h1(stage: int, p: int, m: int) -> list[Any]:
    """ZB-H1's handcrafted order on stage s (Qi et al. 2023, Fig. 3 top): 1F1B's, with
    each backward split and its W run s B's late.

    1. warm-up: w = min(p − s − 1, m) forwards, as in 1F1B;
    2. steady: m − w times (F(w + i), B(i), W(i − s)) — no W while i < s;
    3. cool-down: the last w B's, each with its late W; then the s W's still waiting.

    Stage s holds p − s micro-batches between F and B and at most s more between B and
    W: p from F to W on every stage (m >= p), 1F1B's peak.  Held back, the W's leave the
    B's (which the previous stage waits for) first in line, and the s W's still waiting
    after the last B fill the cool-down; with T_F = T_B = T_W the bubble is
    (p − 1)(T_F + T_B − T_W) for m >= p (Table 2)."""
    w = min(p - stage - 1, m)
    o: list[Any] = [Forward(i) for i in range(w)]
    for i in range(m):
        o += [Forward(w + i)] if i < m - w else []
        o += [BackwardInput(i)] + ([BackwardWeight(i - stage)] if i >= stage else [])
    return o + [BackwardWeight(i) for i in range(max(0, m - stage), m)]


def zb_h2(stage: int, p: int, m: int) -> list[Any]:
    """ZB-H2's handcrafted order on stage s (m >= 2p − 1; Qi et al. 2023, Fig. 3 bottom):
    ZB-H1's shape with p − 1 more warm-up forwards per stage, a parallelogram.

    1. warm-up: w = 2(p − s) − 1 forwards (they fill what would be the start's bubble);
    2. 2s times (B(i), F(w + i)): the B's come back every other step, the W's wait — now
       2p − 1 forwards have run on every stage, none of their W's;
    3. steady: m − 2p + 1 times (B, W, F): one W before each new F;
    4. cool-down: w times (B, W); then the 2s W's still waiting fill the tail.

    Every stage holds 2p − 1 micro-batches from F to W (2(p − s) − 1 of them to B), the
    paper's peak (§3.2), and B(i) on stage s comes at least two steps after B(i) on stage
    s + 1 in the stages' own clocks (stage s starts one step after stage s − 1): with
    T_F = T_B = T_W each stage is busy from its first F to its last W, zero bubble."""
    w = 2 * (p - stage) - 1
    o: list[Any] = [Forward(i) for i in range(w)]
    for i in range(2 * stage):
        o += [BackwardInput(i), Forward(w + i)]
    for r in range(m - 2 * p + 1):
        o += [BackwardInput(2 * stage + r), BackwardWeight(r), Forward(2 * p - 1 + r)]
    done = m - 2 * p + 1
    for d in range(w):
        o += [BackwardInput(m - w + d), BackwardWeight(done + d)]
    return o + [BackwardWeight(i) for i in range(done + w, m)]


def zb_v(r: int, p: int, m: int) -> list[Any]:
    """ZB-V's handcrafted order on rank r (m >= 2p − 1; Qi et al. 2023's V schedule, as
    PyTorch's ``ScheduleZBVZeroBubble`` lays it out).  Chunk 0 is virtual stage r, chunk 1
    virtual stage 2p − 1 − r:

    1. warm-up: 2(p − r) − 1 chunk-0 forwards; then r pairs (chunk-1 F, chunk-0 F); then
       p − r triples (chunk-1 F, B, W) — the loss is near, chunk 1's gradients start;
    2. steady: (chunk-0 F, B, W), (chunk-1 F, B, W) until every forward has run;
    3. cool-down: r pairs of B (chunk 0, chunk 1), then p − r (chunk-0 B, an old W),
       then the W's left — they fill the tail that 1F1B leaves idle.

    With T_F = T_B = T_W every rank is busy from its first F to its last W (zero bubble)
    while holding at most 2p chunk-activations = p micro-batches of a whole stage, 1F1B's
    memory."""
    o: list[Any] = []
    f0 = f1 = b0 = b1 = 0
    for _ in range(2 * (p - r) - 1):
        o.append(Forward(f0, 0))
        f0 += 1
    for _ in range(r):
        o += [Forward(f1, 1), Forward(f0, 0)]
        f0, f1 = f0 + 1, f1 + 1
    for _ in range(p - r):
        o += [Forward(f1, 1), BackwardInput(b1, 1), BackwardWeight(b1, 1)]
        f1, b1 = f1 + 1, b1 + 1
    while f1 < f0 or f0 < m:
        if f0 < m:
            o.append(Forward(f0, 0))
            f0 += 1
        o += [BackwardInput(b0, 0), BackwardWeight(b0, 0)]
        o += [Forward(f1, 1), BackwardInput(b1, 1), BackwardWeight(b1, 1)]
        b0, f1, b1 = b0 + 1, f1 + 1, b1 + 1
    w0, w1 = b0, b1
    for _ in range(r):
        o += [BackwardInput(b0, 0), BackwardInput(b1, 1)]
        b0, b1 = b0 + 1, b1 + 1
    for _ in range(p - r):
        o += [BackwardInput(b0, 0), BackwardWeight(w0, 0)]
        b0, w0 = b0 + 1, w0 + 1
    o += [BackwardWeight(i, 1) for i in range(w1, b1)]
    return o + [BackwardWeight(i, 0) for i in range(w0, b0)]


def zero_bubble_cap(kind: str, stage: int, p: int) -> int:
    """The most (micro-batch, chunk) pairs stage ``stage`` may hold between F and B in a
    zero-bubble schedule: ZB-H1 p − s (1F1B's memory), ZB-H2 2(p − s) − 1 (the extra
    warm-up forwards that fill the start), ZB-V 2p chunks (= p micro-batches of a whole
    stage, 1F1B's memory again: each chunk holds half a stage)."""
    return {"zb-h1": p - stage, "zb-h2": 2 * (p - stage) - 1, "zb-v": 2 * p}[kind]


@functools.lru_cache(maxsize=256)
def list_schedule(kind: str, p: int, m: int) -> tuple[tuple[Any, ...], ...]:
    """Every stage's compute order of a zero-bubble schedule, by list scheduling at unit
    costs (T_F = T_B = T_W, one time step each, per chunk; messages free).

    At each step every free stage runs, in this order of preference:

    1. a **B** whose output gradient has arrived (B is on the critical path: the
       previous stage waits for it);
    2. else an **F** whose input has arrived, if the stage holds fewer than
       :func:`zero_bubble_cap` micro-batches between F and B (the memory cap);
    3. else its oldest pending **W** (nobody waits for a W: it fills what would be
       bubble);
    4. else it waits.

    With two chunks (ZB-V) chunk 1 wins a tie.  Used for zb-h2 and zb-v when
    m < 2p − 1 (too few micro-batches to fill; no stage can hold more than m from F to
    W anyway); from m = 2p − 1 on they are :func:`zb_h2` and :func:`zb_v`, and ZB-H1 is
    always :func:`zb_h1`.  This rule, run for ``"zb-h1"`` or for
    ``"zb-h2"`` at larger m, also reaches Table 2 but runs the W's after the stage's last
    F: up to m micro-batches held from F to W, where the paper keeps p (ZB-H1) and
    2p − 1 (ZB-H2).  The order is then fixed data: the executor and the simulator run it
    with any costs."""
    v = 2 if kind == "zb-v" else 1
    place = "v" if kind == "zb-v" else "loop"
    last = p * v - 1
    f_end: dict[tuple[int, int], int] = {}   # (virtual stage, mb) -> end time of its F
    b_end: dict[tuple[int, int], int] = {}   # (virtual stage, mb) -> end time of its B
    next_f = [[0] * v for _ in range(p)]
    next_b = [[0] * v for _ in range(p)]
    held = [0] * p
    pending_w: list[list[BackwardWeight]] = [[] for _ in range(p)]
    orders: list[list[Any]] = [[] for _ in range(p)]
    todo, t = 3 * m * v * p, 0
    while todo:
        for s in range(p):
            pick: Any = None
            for c in reversed(range(v)):                       # 1. a ready B
                mb, vs = next_b[s][c], virtual_stage(s, c, p, place)
                if mb < next_f[s][c] and f_end[vs, mb] <= t and \
                        (vs == last or b_end.get((vs + 1, mb), t + 1) <= t):
                    pick = BackwardInput(mb, c)
                    break
            cap = zero_bubble_cap(kind, s, p)
            if pick is None and held[s] < cap and held[s] + len(pending_w[s]) < cap + 2 * p:
                for c in reversed(range(v)):                   # 2. a ready F
                    mb, vs = next_f[s][c], virtual_stage(s, c, p, place)
                    if mb < m and (vs == 0 or f_end.get((vs - 1, mb), t + 1) <= t):
                        pick = Forward(mb, c)
                        break
            if pick is None and pending_w[s]:                  # 3. the oldest W
                pick = pending_w[s].pop(0)
            if pick is None:
                continue
            mb, c = pick.mb, pick.chunk
            vs = virtual_stage(s, c, p, place)
            if isinstance(pick, Forward):
                f_end[vs, mb], held[s] = t + 1, held[s] + 1
                next_f[s][c] += 1
            elif isinstance(pick, BackwardInput):
                b_end[vs, mb], held[s] = t + 1, held[s] - 1
                next_b[s][c] += 1
                pending_w[s].append(BackwardWeight(mb, c))
            orders[s].append(pick)
            todo -= 1
        t += 1
    return tuple(tuple(o) for o in orders)
