"""Pipeline schedules as data: the list of instructions one stage executes, in order.

EN pipeline schedule · RU расписание конвейера · ZH 流水线调度

A pipeline cuts the model into ``p`` stages (one per rank) and the
mini-batch into ``m`` micro-batches.  A *schedule* says, for one stage, in
which order it runs the forwards and backwards of the micro-batches and when
it sends and receives activations (forward) and their gradients (backward).
It is plain data — a list of small frozen instructions — so that one source
drives the MPI executor, the timeline simulator
(:mod:`minipar.parallel.pipeline.simulate`), the checks
(:mod:`minipar.parallel.pipeline.check`) and the Gantt chart (the same
design as DeepSpeed's ``pipe/schedule.py``, ShallowSpeed and torchgpipe's
``clock_cycles``).

Kinds, drawn by :func:`~minipar.parallel.pipeline.measure.chart` from the
simulated timeline (4 stages, 6 micro-batches; ``F3`` = one time unit of the
forward of micro-batch 3, ``B3B3`` its backward, twice as long; ``.`` idle;
the test suite checks these drawings against the code):

``naive`` — one micro-batch at a time through the whole pipeline; only one
stage ever works: bubble (p − 1)/p of the time.

``gpipe`` — Huang et al. 2018, "GPipe", arXiv 1811.06965: all forwards,
then all backwards (in reverse, as autograd would); every stage holds all m
micro-batches' activations at the turn::

    stage 0  F0F1F2F3F4F5. . . . . . . . . B5B5B4B4B3B3B2B2B1B1B0B0
    stage 1  . F0F1F2F3F4F5. . . . . . B5B5B4B4B3B3B2B2B1B1B0B0. .
    stage 2  . . F0F1F2F3F4F5. . . B5B5B4B4B3B3B2B2B1B1B0B0. . . .
    stage 3  . . . F0F1F2F3F4F5B5B5B4B4B3B3B2B2B1B1B0B0. . . . . .

    bubble = (p − 1)/(m + p − 1) of the step = 3/9

``1f1b`` — PipeDream-Flush (Narayanan et al. 2021, "Efficient Large-Scale
Language Model Training on GPU Clusters Using Megatron-LM", arXiv
2104.04473, §2.2.1): stage s runs ``p − s − 1`` warm-up forwards, then
alternates one forward, one backward (steady state), then the remaining
backwards (cool-down).  The same step time and bubble — (p − 1)/m of the
ideal time — but at most ``p − s`` micro-batches in flight on stage s
instead of m::

    stage 0  F0F1F2F3. . . . . . B0B0F4B1B1F5B2B2. B3B3. B4B4. B5B5
    stage 1  . F0F1F2. . . . B0B0F3B1B1F4B2B2F5B3B3. B4B4. B5B5. .
    stage 2  . . F0F1. . B0B0F2B1B1F3B2B2F4B3B3F5B4B4. B5B5. . . .
    stage 3  . . . F0B0B0F1B1B1F2B2B2F3B3B3F4B4B4F5B5B5. . . . . .

``interleaved`` — interleaved 1F1B (same paper, §2.2.2): each rank holds
``v`` model *chunks* (rank s holds virtual stages s, s + p, s + 2p, ...), so
a micro-batch travels the ring of ranks v times; forwards and backwards are
v times shorter and the bubble shrinks to (1/v)(p − 1)/m of the ideal time,
for v × the point-to-point messages.  Like Megatron-LM, micro-batches go in
groups of p (so m must be a multiple of p), warm-up is
``2(p − s − 1) + (v − 1)p`` chunk-forwards (all of them when m = p).  With
m = 4, v = 2 (``f``/``b``: chunk 1; one chunk's forward ``F0`` costs 1, half
of the stage's 2), each stage idles 3·(1 + 2) = 9 units, where GPipe on the
same model (forward 2, backward 4 per stage) idles 3·(2 + 4) = 18::

    stage 0  F0F1F2F3f0f1f2f3. . . . . . . . . b0b0b1b1b2b2b3b3B0B0B1B1B2B2B3B3
    stage 1  . F0F1F2F3f0f1f2f3. . . . . . b0b0b1b1b2b2b3b3B0B0B1B1B2B2B3B3. .
    stage 2  . . F0F1F2F3f0f1f2f3. . . b0b0b1b1b2b2b3b3B0B0B1B1B2B2B3B3. . . .
    stage 3  . . . F0F1F2F3f0f1f2f3b0b0b1b1b2b2b3b3B0B0B1B1B2B2B3B3. . . . . .

**Zero bubble** — Qi et al. 2023, "Zero Bubble Pipeline Parallelism", arXiv
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

``zb-v`` — two chunks per rank in a V (:func:`virtual_stage` with
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
:func:`_zb_h1_order`, ZB-H2's :func:`_zb_h2_order` and ZB-V's :func:`_zb_v_order`
(handcrafted); below m = 2p − 1, ZB-H2 and ZB-V are built by
:func:`_zero_bubble_orders`, a list scheduler at unit costs.

Communication is in the list, so an executor can run it as written: a
receive comes right before the compute that needs it, a send right after
the compute that produced it.  In 1F1B's steady state the gradient from the
next stage is received *before* the activation is sent to it, so the two
neighbours meet their messages in the same order and even synchronous
(rendezvous) sends cannot deadlock (Megatron's ``send_forward_recv_backward``):
naive, gpipe and 1f1b pass :func:`~minipar.parallel.pipeline.check.check_schedules` with
``sends="rendezvous"``.  Interleaving sends round a *ring* (the last rank
feeds the first rank's next chunk), where every rank may be sending at once:
it needs non-blocking sends (``Isend``, Megatron's ``batch_isend_irecv``),
the executor's default rule.
``chunk`` in ``SendAct(mb, chunk)`` and friends names the *sending or
receiving stage's own* chunk: ``RecvAct(mb, c)`` is the input of my chunk c,
``SendGrad(mb, c)`` the gradient of that input.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

from minipar import checks

KINDS = ("naive", "gpipe", "1f1b", "interleaved", "zb-h1", "zb-h2", "zb-v")
#: the zero-bubble schedules (Qi et al. 2023): backward split into B and W
ZERO_BUBBLE = ("zb-h1", "zb-h2", "zb-v")


@dataclass(frozen=True)
class Forward:
    """Run my chunk ``chunk`` forward on micro-batch ``mb`` (keep its activations)."""
    mb: int
    chunk: int = 0


@dataclass(frozen=True)
class Backward:
    """Run my chunk ``chunk`` backward on micro-batch ``mb`` (free its activations)."""
    mb: int
    chunk: int = 0


@dataclass(frozen=True)
class BackwardInput:
    """**B** (Qi et al. 2023): my chunk's gradient with respect to its *input* for ``mb`` —
    what the previous stage waits for.  Frees the activations W does not need; keeps the
    linears' inputs and output gradients until :class:`BackwardWeight`."""
    mb: int
    chunk: int = 0


@dataclass(frozen=True)
class BackwardWeight:
    """**W** (Qi et al. 2023): my chunk's parameter gradients for ``mb``, from what B kept.
    No other stage waits for it; only the optimizer step does."""
    mb: int
    chunk: int = 0


@dataclass(frozen=True)
class SendAct:
    """Send the output activation of my chunk ``chunk`` for ``mb`` to the next virtual stage."""
    mb: int
    chunk: int = 0


@dataclass(frozen=True)
class RecvAct:
    """Receive the input activation of my chunk ``chunk`` for ``mb`` (previous virtual stage)."""
    mb: int
    chunk: int = 0


@dataclass(frozen=True)
class SendGrad:
    """Send the gradient of my chunk ``chunk``'s input for ``mb`` to the previous virtual stage."""
    mb: int
    chunk: int = 0


@dataclass(frozen=True)
class RecvGrad:
    """Receive the gradient of my chunk ``chunk``'s output for ``mb`` (next virtual stage)."""
    mb: int
    chunk: int = 0


@dataclass(frozen=True)
class OptimizerStep:
    """Update this stage's parameters: once, after every backward (the pipeline flush)."""


Instruction = (Forward | Backward | BackwardInput | BackwardWeight | SendAct | RecvAct
               | SendGrad | RecvGrad | OptimizerStep)
COMPUTE = (Forward, Backward, BackwardInput, BackwardWeight)
SENDS = (SendAct, SendGrad)
RECVS = (RecvAct, RecvGrad)


PLACEMENTS = ("loop", "v")


def placement(kind: str) -> str:
    """Where a schedule puts its chunks: ``"v"`` for zb-v, ``"loop"`` for every other."""
    return "v" if kind == "zb-v" else "loop"


def virtual_stage(stage: int, chunk: int, p: int, placement: str = "loop") -> int:
    """Position of (rank ``stage``, its chunk ``chunk``) along the model.

    ``"loop"`` (interleaved 1F1B): chunk·p + stage — the micro-batch goes round the ring
    of ranks v times.  ``"v"`` (ZB-V, two chunks): chunk 0 is virtual stage ``stage``,
    chunk 1 is 2p − 1 − stage — down the ranks and back up, so rank 0 holds the first
    and the last chunk (the loss is on rank 0) and rank p − 1 hands its chunk 0's output
    to its own chunk 1."""
    if placement == "v":
        return stage if chunk == 0 else 2 * p - 1 - stage
    return chunk * p + stage


def rank_of(vs: int, p: int, placement: str = "loop") -> int:
    """The rank holding virtual stage ``vs`` (inverse of :func:`virtual_stage`)."""
    if placement == "v":
        return vs if vs < p else 2 * p - 1 - vs
    return vs % p


def _check_args(kind: str, stage: int, p: int, m: int, v: int) -> None:
    for name, x in (("p", p), ("m", m), ("v", v), ("stage", stage)):
        checks.integer(name, x)
    checks.one_of("the pipeline schedule", kind, KINDS)
    if p < 1 or m < 1 or v < 1:
        raise ValueError(f"need p >= 1 stages, m >= 1 micro-batches and v >= 1 chunks, "
                         f"got p={p}, m={m}, v={v}")
    if not 0 <= stage < p:
        raise ValueError(f"stage {stage} is out of range for p={p} stages (0..{p - 1})")
    if kind == "zb-v" and v != 2:
        raise ValueError(f"zb-v holds exactly 2 model chunks per rank (a V), got v={v} "
                         f"(use v=2)")
    if kind not in ("interleaved", "zb-v") and v != 1:
        raise ValueError(f"v={v} model chunks per rank needs the 'interleaved' schedule, "
                         f"not {kind!r} (use v=1)")
    if kind == "interleaved" and m % p:
        raise ValueError(f"interleaved 1F1B sends micro-batches in groups of p: m={m} "
                         f"micro-batches is not a multiple of p={p} stages")


def _with_comm(order: list[tuple[str, int, int]], stage: int, p: int, v: int,
               place: str = "loop") -> list[Instruction]:
    """Compute order -> instructions: receive right before a compute, send right after
    (``W`` talks to no one)."""
    last = p * v - 1
    out: list[Instruction] = []
    for what, mb, c in order:
        vs = virtual_stage(stage, c, p, place)
        if what == "F":
            out += [RecvAct(mb, c)] if vs > 0 else []
            out += [Forward(mb, c)] + ([SendAct(mb, c)] if vs < last else [])
        elif what == "W":
            out.append(BackwardWeight(mb, c))
        elif what == "BI":
            out += [RecvGrad(mb, c)] if vs < last else []
            out += [BackwardInput(mb, c)] + ([SendGrad(mb, c)] if vs > 0 else [])
        else:
            out += [RecvGrad(mb, c)] if vs < last else []
            out += [Backward(mb, c)] + ([SendGrad(mb, c)] if vs > 0 else [])
    return out + [OptimizerStep()]


def _one_f_one_b(stage: int, p: int, m: int) -> list[Instruction]:
    """PipeDream-Flush on stage s: p − s − 1 warm-up forwards, then steady (forward k,
    backward i) pairs, then the cool-down backwards.  In a steady pair the gradient i from
    the next stage is received *before* activation k is sent to it: the next stage sends
    that gradient, then receives that activation — both neighbours in the same order."""
    warmup = min(p - stage - 1, m)
    first, last = stage == 0, stage == p - 1
    recv_act = [] if first else [RecvAct]
    out: list[Instruction] = []
    for k in range(warmup):
        out += [c(k) for c in recv_act] + [Forward(k), SendAct(k)]
    for i in range(m - warmup):
        k = warmup + i
        out += [c(k) for c in recv_act] + [Forward(k)]
        out += [Backward(i)] if last else [RecvGrad(i), SendAct(k), Backward(i)]
        out += [] if first else [SendGrad(i)]
    for i in range(m - warmup, m):
        out += [RecvGrad(i), Backward(i)] + ([] if first else [SendGrad(i)])
    return out + [OptimizerStep()]


def _interleaved_order(stage: int, p: int, m: int, v: int) -> list[tuple[str, int, int]]:
    """Megatron-LM's ``forward_backward_pipelining_with_interleaving`` order for one rank.

    The k-th chunk-forward of this rank is micro-batch (k // pv)·p + k % p on chunk
    (k % pv) // p; the k-th chunk-backward the same micro-batch on chunk v − 1 − that.
    """
    total = m * v

    def mb(k: int) -> int:
        return (k // (p * v)) * p + k % p

    def chunk(k: int, forward: bool) -> int:
        c = (k % (p * v)) // p
        return c if forward else v - 1 - c

    warmup = total if m == p else min(2 * (p - stage - 1) + (v - 1) * p, total)
    order = [("F", mb(k), chunk(k, True)) for k in range(warmup)]
    for i in range(total - warmup):
        order += [("F", mb(warmup + i), chunk(warmup + i, True)), ("B", mb(i), chunk(i, False))]
    order += [("B", mb(k), chunk(k, False)) for k in range(total - warmup, total)]
    return order


def zero_bubble_cap(kind: str, stage: int, p: int) -> int:
    """The most (micro-batch, chunk) pairs stage ``stage`` may hold between F and B in a
    zero-bubble schedule: ZB-H1 p − s (1F1B's memory), ZB-H2 2(p − s) − 1 (the extra
    warm-up forwards that fill the start), ZB-V 2p chunks (= p micro-batches of a whole
    stage, 1F1B's memory again: each chunk holds half a stage)."""
    return {"zb-h1": p - stage, "zb-h2": 2 * (p - stage) - 1, "zb-v": 2 * p}[kind]


@functools.lru_cache(maxsize=256)
def _zero_bubble_orders(kind: str, p: int, m: int) -> tuple[tuple[tuple[str, int, int], ...], ...]:
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
    W anyway); from m = 2p − 1 on they are :func:`_zb_h2_order` and :func:`_zb_v_order`,
    and ZB-H1 is always :func:`_zb_h1_order`.  This rule, run for ``"zb-h1"`` or for
    ``"zb-h2"`` at larger m, also reaches Table 2 but runs the W's after the stage's last
    F: up to m micro-batches held from F to W, where the paper keeps p (ZB-H1) and
    2p − 1 (ZB-H2).  The order is then fixed data: the executor and the simulator run it
    with any costs."""
    v = 2 if kind == "zb-v" else 1
    place = placement(kind)
    last = p * v - 1
    f_end: dict[tuple[int, int], int] = {}   # (virtual stage, mb) -> end time of its F
    b_end: dict[tuple[int, int], int] = {}   # (virtual stage, mb) -> end time of its B
    next_f = [[0] * v for _ in range(p)]
    next_b = [[0] * v for _ in range(p)]
    held = [0] * p
    pending_w: list[list[tuple[int, int]]] = [[] for _ in range(p)]
    orders: list[list[tuple[str, int, int]]] = [[] for _ in range(p)]
    todo, t = 3 * m * v * p, 0
    while todo:
        for s in range(p):
            pick = None
            for c in reversed(range(v)):                       # 1. a ready B
                mb, vs = next_b[s][c], virtual_stage(s, c, p, place)
                if mb < next_f[s][c] and f_end[vs, mb] <= t and \
                        (vs == last or b_end.get((vs + 1, mb), t + 1) <= t):
                    pick = ("BI", mb, c)
                    break
            cap = zero_bubble_cap(kind, s, p)
            if pick is None and held[s] < cap and held[s] + len(pending_w[s]) < cap + 2 * p:
                for c in reversed(range(v)):                   # 2. a ready F
                    mb, vs = next_f[s][c], virtual_stage(s, c, p, place)
                    if mb < m and (vs == 0 or f_end.get((vs - 1, mb), t + 1) <= t):
                        pick = ("F", mb, c)
                        break
            if pick is None and pending_w[s]:                  # 3. the oldest W
                pick = ("W",) + pending_w[s].pop(0)
            if pick is None:
                continue
            what, mb, c = pick
            vs = virtual_stage(s, c, p, place)
            if what == "F":
                f_end[vs, mb], held[s] = t + 1, held[s] + 1
                next_f[s][c] += 1
            elif what == "BI":
                b_end[vs, mb], held[s] = t + 1, held[s] - 1
                next_b[s][c] += 1
                pending_w[s].append((mb, c))
            orders[s].append(pick)
            todo -= 1
        t += 1
    return tuple(tuple(o) for o in orders)


def _zb_h1_order(stage: int, p: int, m: int) -> list[tuple[str, int, int]]:
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
    o: list[tuple[str, int, int]] = [("F", i, 0) for i in range(w)]
    for i in range(m):
        o += [("F", w + i, 0)] if i < m - w else []
        o += [("BI", i, 0)] + ([("W", i - stage, 0)] if i >= stage else [])
    return o + [("W", i, 0) for i in range(max(0, m - stage), m)]


def _zb_h2_order(stage: int, p: int, m: int) -> list[tuple[str, int, int]]:
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
    o: list[tuple[str, int, int]] = [("F", i, 0) for i in range(w)]
    for i in range(2 * stage):
        o += [("BI", i, 0), ("F", w + i, 0)]
    for r in range(m - 2 * p + 1):
        o += [("BI", 2 * stage + r, 0), ("W", r, 0), ("F", 2 * p - 1 + r, 0)]
    done = m - 2 * p + 1
    for d in range(w):
        o += [("BI", m - w + d, 0), ("W", done + d, 0)]
    return o + [("W", i, 0) for i in range(done + w, m)]


def _zb_v_order(r: int, p: int, m: int) -> list[tuple[str, int, int]]:
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
    o: list[tuple[str, int, int]] = []
    f0 = f1 = b0 = b1 = 0
    for _ in range(2 * (p - r) - 1):
        o.append(("F", f0, 0))
        f0 += 1
    for _ in range(r):
        o += [("F", f1, 1), ("F", f0, 0)]
        f0, f1 = f0 + 1, f1 + 1
    for _ in range(p - r):
        o += [("F", f1, 1), ("BI", b1, 1), ("W", b1, 1)]
        f1, b1 = f1 + 1, b1 + 1
    while f1 < f0 or f0 < m:
        if f0 < m:
            o.append(("F", f0, 0))
            f0 += 1
        o += [("BI", b0, 0), ("W", b0, 0), ("F", f1, 1), ("BI", b1, 1), ("W", b1, 1)]
        b0, f1, b1 = b0 + 1, f1 + 1, b1 + 1
    w0, w1 = b0, b1
    for _ in range(r):
        o += [("BI", b0, 0), ("BI", b1, 1)]
        b0, b1 = b0 + 1, b1 + 1
    for _ in range(p - r):
        o += [("BI", b0, 0), ("W", w0, 0)]
        b0, w0 = b0 + 1, w0 + 1
    o += [("W", i, 1) for i in range(w1, b1)] + [("W", i, 0) for i in range(w0, b0)]
    return o


def stage_schedule(kind: str, stage: int, p: int, m: int, v: int = 1) -> list[Instruction]:
    """The instructions rank ``stage`` of ``p`` runs for one step of ``m`` micro-batches.

    ``kind``: ``naive``, ``gpipe``, ``1f1b``, ``interleaved`` (``v`` model chunks
    per rank; ``m`` a multiple of ``p``), or the zero-bubble ``zb-h1``, ``zb-h2`` and
    ``zb-v`` (``v=2``, the V placement: :func:`placement`), whose backwards are split
    into :class:`BackwardInput` (B) and :class:`BackwardWeight` (W).  The list ends
    with one :class:`OptimizerStep`.
    Bad input raises a ``ValueError`` naming the numbers.
    """
    _check_args(kind, stage, p, m, v)
    if kind == "naive":
        order = [(w, i, 0) for i in range(m) for w in ("F", "B")]
    elif kind == "gpipe":
        order = [("F", i, 0) for i in range(m)] + [("B", i, 0) for i in reversed(range(m))]
    elif kind == "1f1b":
        return _one_f_one_b(stage, p, m)
    elif kind == "zb-h1":
        return _with_comm(_zb_h1_order(stage, p, m), stage, p, v)
    elif kind == "zb-h2" and m >= 2 * p - 1:
        return _with_comm(_zb_h2_order(stage, p, m), stage, p, v)
    elif kind == "zb-v" and m >= 2 * p - 1:
        return _with_comm(_zb_v_order(stage, p, m), stage, p, v, "v")
    elif kind in ZERO_BUBBLE:
        return _with_comm(list(_zero_bubble_orders(kind, p, m)[stage]), stage, p, v,
                          placement(kind))
    else:
        order = _interleaved_order(stage, p, m, v)
    return _with_comm(order, stage, p, v)


def forward_schedule(stage: int, p: int, m: int, v: int = 1,
                     place: str = "loop") -> list[Instruction]:
    """A forward-only pass (validation) on rank ``stage``: micro-batch by micro-batch, chunk
    by chunk, each forward between its receive and its send; no backward, no step.

    No deadlock: (micro-batch i, chunk c) on rank s waits only for (i, c) on rank s − 1
    (or (i, c − 1) on rank p − 1), which comes earlier in the order (i, c, s) that every
    rank's list follows, and sends never block."""
    _check_args("zb-v" if place == "v" else "interleaved" if v > 1 else "gpipe",
                stage, p, m, v)
    order = [("F", i, c) for i in range(m) for c in range(v)]
    return _with_comm(order, stage, p, v, place)[:-1]


def schedules(kind: str, p: int, m: int, v: int = 1) -> list[list[Instruction]]:
    """Every stage's list: ``[stage_schedule(kind, s, p, m, v) for s in range(p)]``."""
    return [stage_schedule(kind, s, p, m, v) for s in range(p)]


def in_flight(stage_schedule: list[Instruction], until: str = "B") -> int:
    """Peak number of (micro-batch, chunk) pairs whose Forward has run and whose backward
    (``Backward``, or its B: ``BackwardInput``) has not — their full activations held.
    1F1B and ZB-H1: p on stage 0 (m >= p); ZB-H2: 2p − 1 (m >= 2p − 1); GPipe: m.
    ``until="W"``: counted up to the W (``BackwardWeight``) instead — everything a stage
    keeps for a micro-batch: ZB-H1 p, ZB-H2 2p − 1 on every stage, as the paper's."""
    ends = (Backward, BackwardInput) if until == "B" else (Backward, BackwardWeight)
    held: set[tuple[int, int]] = set()
    peak = 0
    for ins in stage_schedule:
        if isinstance(ins, Forward):
            held.add((ins.mb, ins.chunk))
            peak = max(peak, len(held))
        elif isinstance(ins, ends):
            held.discard((ins.mb, ins.chunk))
    return peak


def w_pending(stage_schedule: list[Instruction]) -> int:
    """Peak number of (micro-batch, chunk) pairs whose B has run and whose W has not: what
    the stage keeps *only for W* (the linears' inputs and output gradients), 0 when the
    backward is not split.  ZB-H1: min(s + 1, m) on stage s (s W's held back, counted
    right after the next B), so F to W stays within 1F1B's p; ZB-H2: 2s + 1 (m >= 2p − 1),
    so F to W stays within 2p − 1."""
    kept: set[tuple[int, int]] = set()
    peak = 0
    for ins in stage_schedule:
        if isinstance(ins, BackwardInput):
            kept.add((ins.mb, ins.chunk))
            peak = max(peak, len(kept))
        elif isinstance(ins, BackwardWeight):
            kept.discard((ins.mb, ins.chunk))
    return peak
