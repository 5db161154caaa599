"""Pipeline schedules: naive, GPipe, 1F1B and interleaved 1F1B, each a compute order.

EN pipeline schedule · RU расписание конвейера · ZH 流水线调度

The model is cut into ``p`` stages (one per rank) and the mini-batch into ``m``
micro-batches.  A schedule says in which order stage s runs the forwards and
backwards of the micro-batches; :func:`with_comm` puts the messages around them,
the same way for every kind, and :class:`~.stage_loop.StageLoop` runs the list.
The zero-bubble schedules, whose backward is split in two, are
:mod:`.zero_bubble`'s orders, through the same :func:`with_comm`.

Drawn from the simulator (4 stages, forward 1 time unit, backward 2: ``F3`` the
forward of micro-batch 3, ``B3B3`` its backward, ``.`` idle; the tests check these
drawings against the code):

``naive`` — one micro-batch at a time through the whole pipeline: only one stage
ever works, bubble (p − 1)/p of the time.

``gpipe`` (Huang et al. 2018, arXiv 1811.06965) — all forwards, then all backwards
(in reverse, as autograd would).  Bubble (p − 1)/(m + p − 1) of the step, (p − 1)/m
of the ideal time; every stage holds all **m** micro-batches' activations at the turn::

    stage 0  F0F1F2F3F4F5. . . . . . . . . B5B5B4B4B3B3B2B2B1B1B0B0
    stage 1  . F0F1F2F3F4F5. . . . . . B5B5B4B4B3B3B2B2B1B1B0B0. .
    stage 2  . . F0F1F2F3F4F5. . . B5B5B4B4B3B3B2B2B1B1B0B0. . . .
    stage 3  . . . F0F1F2F3F4F5B5B5B4B4B3B3B2B2B1B1B0B0. . . . . .

``1f1b`` (PipeDream-Flush, Narayanan et al. 2021, arXiv 2104.04473, §2.2.1) — stage
s runs p − s − 1 warm-up forwards, then one forward, one backward (the steady state),
then the remaining backwards (the cool-down).  The same bubble, (p − 1)/m, but at most
**p − s** micro-batches in flight on stage s instead of m::

    stage 0  F0F1F2F3. . . . . . B0B0F4B1B1F5B2B2. B3B3. B4B4. B5B5
    stage 1  . F0F1F2. . . . B0B0F3B1B1F4B2B2F5B3B3. B4B4. B5B5. .
    stage 2  . . F0F1. . B0B0F2B1B1F3B2B2F4B3B3F5B4B4. B5B5. . . .
    stage 3  . . . F0B0B0F1B1B1F2B2B2F3B3B3F4B4B4F5B5B5. . . . . .

``interleaved`` (same paper, §2.2.2) — each rank holds ``v`` model *chunks* (rank s:
virtual stages s, s + p, s + 2p, ...), so a micro-batch goes round the ring of ranks
v times; forwards and backwards are v times shorter and the bubble shrinks to
(1/v)(p − 1)/m, for v × the messages.  Like Megatron-LM, micro-batches go in groups
of p (m a multiple of p); warm-up 2(p − s − 1) + (v − 1)p chunk-forwards (all of them
when m = p).  m = 4, v = 2 (``f``/``b``: chunk 1, each chunk half a stage)::

    stage 0  F0F1F2F3f0f1f2f3. . . . . . . . . b0b0b1b1b2b2b3b3B0B0B1B1B2B2B3B3
    stage 1  . F0F1F2F3f0f1f2f3. . . . . . b0b0b1b1b2b2b3b3B0B0B1B1B2B2B3B3. .
    stage 2  . . F0F1F2F3f0f1f2f3. . . b0b0b1b1b2b2b3b3B0B0B1B1B2B2B3B3. . . .
    stage 3  . . . F0F1F2F3f0f1f2f3b0b0b1b1b2b2b3b3B0B0B1B1B2B2B3B3. . . . . .

**Messages.**  A receive comes right before the compute that needs it, a send right
after the compute that made it; in 1F1B's steady state the gradient is received
before the activation is sent (:func:`with_comm`), so naive, gpipe and 1f1b pass
:func:`~.check.check_schedules` even with synchronous (rendezvous) sends.
Interleaving sends round a *ring*, every rank possibly sending at once: it needs
non-blocking sends (``Isend``, Megatron's ``batch_isend_irecv``), the link's rule.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from minipar import checks
from minipar.parallel.pipeline.stage_loop import (
    Backward,
    BackwardInput,
    BackwardWeight,
    Forward,
    ForwardBackward,
    Instruction,
    OptimizerStep,
    RecvAct,
    RecvGrad,
    SendAct,
    SendGrad,
    ends,
    virtual_stage,
)
from minipar.parallel.pipeline.dualpipe import DUALPIPE, check_dualpipe, dualpipe_order
from minipar.parallel.pipeline.zero_bubble import ZERO_BUBBLE, zero_bubble_order

KINDS = ("naive", "gpipe", "1f1b", "interleaved", *ZERO_BUBBLE, *DUALPIPE)


def naive(m: int) -> list[Any]:
    """One micro-batch at a time: forward, backward, the next."""
    return [c for i in range(m) for c in (Forward(i), Backward(i))]


def gpipe(m: int) -> list[Any]:
    """All m forwards, then all m backwards, the last micro-batch first."""
    return [Forward(i) for i in range(m)] + [Backward(i) for i in reversed(range(m))]


def one_f_one_b(stage: int, p: int, m: int) -> list[Any]:
    """1F1B on stage s: warm-up, steady state, cool-down (Megatron-LM's
    ``forward_backward_pipelining_without_interleaving``).  A steady pair ``(Forward(k),
    Backward(i))`` exchanges its messages together (:func:`with_comm`)."""
    warmup = min(p - stage - 1, m)
    order: list[Any] = [Forward(i) for i in range(warmup)]    # 1. warm-up: p - s - 1 forwards
    for i in range(m - warmup):                                # 2. steady: one F, one B
        order.append((Forward(warmup + i), Backward(i)))
    order += [Backward(i) for i in range(m - warmup, m)]       # 3. cool-down: the backwards left
    return order


def interleaved(stage: int, p: int, m: int, v: int) -> list[Any]:
    """Megatron-LM's ``forward_backward_pipelining_with_interleaving`` order on one rank:
    the k-th chunk-forward is micro-batch (k // pv)·p + k % p on chunk (k % pv) // p, the
    k-th chunk-backward the same micro-batch on chunk v − 1 − that."""
    total = m * v

    def mb(k: int) -> int:
        return (k // (p * v)) * p + k % p

    def chunk(k: int, forward: bool) -> int:
        c = (k % (p * v)) // p
        return c if forward else v - 1 - c

    warmup = total if m == p else min(2 * (p - stage - 1) + (v - 1) * p, total)
    order: list[Any] = [Forward(mb(k), chunk(k, True)) for k in range(warmup)]   # warm-up
    for i in range(total - warmup):                                              # steady
        k = warmup + i
        order += [Forward(mb(k), chunk(k, True)), Backward(mb(i), chunk(i, False))]
    order += [Backward(mb(k), chunk(k, False)) for k in range(total - warmup, total)]
    return order


def with_comm(order: Sequence[Any], stage: int, p: int, v: int = 1,
              place: str = "loop") -> list[Instruction]:
    """A compute order -> rank ``stage``'s instructions, the same for every schedule: each
    receive right before its compute, each send right after (``W`` talks to no one), one
    :class:`OptimizerStep` at the end.  A pair ``(Forward(k), Backward(i))``, 1F1B's steady
    state, is Megatron's ``send_forward_recv_backward``: gradient i is received before
    activation k is sent — the order in which the next stage sends and receives them, so
    even rendezvous sends cannot deadlock.  DualPipe's :class:`ForwardBackward` receives
    both inputs first and sends both outputs after, as DeepSeek's ``_forward_backward_chunk``."""

    def messages(c: Any) -> tuple[list[Instruction], list[Instruction]]:
        first, last = ends(virtual_stage(stage, c.chunk, p, place), p, v, place)
        if isinstance(c, Forward):
            return [RecvAct(c.mb, c.chunk)] * (not first), [SendAct(c.mb, c.chunk)] * (not last)
        if isinstance(c, BackwardWeight):
            return [], []
        return [RecvGrad(c.mb, c.chunk)] * (not last), [SendGrad(c.mb, c.chunk)] * (not first)

    out: list[Instruction] = []
    for step in order:
        if isinstance(step, ForwardBackward):
            (rf, sf), (rb, sb) = messages(step.forward), messages(step.backward)
            out += rf + rb + [step] + sf + sb
        elif isinstance(step, tuple):  # Megatron's send_forward_recv_backward
            (f, b), ((rf, sf), (rb, sb)) = step, map(messages, step)
            out += rf + [f] + rb + sf + [b] + sb
        else:
            recv, send = messages(step)
            out += recv + [step] + send
    return out + [OptimizerStep()]


def placement(kind: str) -> str:
    """Where a schedule puts its chunks: ``"v"`` for zb-v and dualpipev, ``"dual"`` for
    dualpipe (two pipelines, one each way), ``"loop"`` for every other."""
    return {"zb-v": "v", "dualpipev": "v", "dualpipe": "dual"}.get(kind, "loop")


def stage_schedule(kind: str, stage: int, p: int, m: int, v: int = 1) -> list[Instruction]:
    """The instructions rank ``stage`` of ``p`` runs for one step of ``m`` micro-batches:
    ``kind``'s compute order with its messages, ending with one :class:`OptimizerStep`.

    ``kind``: naive, gpipe, 1f1b, interleaved (``v`` chunks per rank, ``m`` a multiple of
    ``p``), the zero-bubble zb-h1, zb-h2, zb-v (``v=2``: :mod:`.zero_bubble`) or DeepSeek's
    dualpipe, dualpipev (``v=2``: :mod:`.dualpipe`).  Bad
    input raises a ``ValueError`` naming the numbers."""
    check_arguments(kind, stage, p, m, v)
    if kind == "naive":
        order = naive(m)
    elif kind == "gpipe":
        order = gpipe(m)
    elif kind == "1f1b":
        order = one_f_one_b(stage, p, m)
    elif kind == "interleaved":
        order = interleaved(stage, p, m, v)
    elif kind in DUALPIPE:
        order = dualpipe_order(kind, stage, p, m)
    else:
        order = zero_bubble_order(kind, stage, p, m)
    return with_comm(order, stage, p, v, placement(kind))


def schedules(kind: str, p: int, m: int, v: int = 1) -> list[list[Instruction]]:
    """Every stage's list: ``[stage_schedule(kind, s, p, m, v) for s in range(p)]``."""
    return [stage_schedule(kind, s, p, m, v) for s in range(p)]


def forward_schedule(stage: int, p: int, m: int, v: int = 1,
                     place: str = "loop") -> list[Instruction]:
    """A forward-only pass (validation) on rank ``stage``: micro-batch by micro-batch, chunk
    by chunk, each forward between its receive and its send; no backward, no step.

    No deadlock: (micro-batch i, chunk c) on rank s waits only for (i, c) on rank s − 1
    (or (i, c − 1) on rank p − 1), which comes earlier in the order (i, c, s) that every
    rank's list follows, and sends never block.  DualPipe (``"dual"``): m/2 micro-batches
    down on chunk 0, m/2 up on chunk 1."""
    check_arguments({"v": "zb-v", "dual": "dualpipe"}.get(place, "interleaved" if v > 1 else
                                                          "gpipe"), stage, p, max(m, 2 * p), v)
    half = m // 2 if place == "dual" else m
    return with_comm([Forward(i, c) for i in range(half) for c in range(v)], stage, p, v,
                     place)[:-1]


def check_arguments(kind: str, stage: int, p: int, m: int, v: int) -> None:
    """Every rule the schedules' arithmetic needs, each a one-line ``ValueError``."""
    for name, x in (("p", p), ("m", m), ("v", v), ("stage", stage)):
        checks.integer(name, x)
    checks.one_of("the pipeline schedule", kind, KINDS)
    if p < 1 or m < 1 or v < 1:
        raise ValueError(f"need p >= 1 stages, m >= 1 micro-batches and v >= 1 chunks, "
                         f"got p={p}, m={m}, v={v}")
    if not 0 <= stage < p:
        raise ValueError(f"stage {stage} is out of range for p={p} stages (0..{p - 1})")
    if kind in DUALPIPE:
        check_dualpipe(kind, p, m, v)
    if kind == "zb-v" and v != 2:
        raise ValueError(f"zb-v holds exactly 2 model chunks per rank (a V), got v={v} "
                         f"(use v=2)")
    if kind not in ("interleaved", "zb-v", *DUALPIPE) and v != 1:
        raise ValueError(f"v={v} model chunks per rank needs the 'interleaved' schedule, "
                         f"not {kind!r} (use v=1)")
    if kind == "interleaved" and m % p:
        raise ValueError(f"interleaved 1F1B sends micro-batches in groups of p: m={m} "
                         f"micro-batches is not a multiple of p={p} stages")
