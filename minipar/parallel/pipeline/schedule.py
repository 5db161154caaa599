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

from dataclasses import dataclass

from minipar import checks

KINDS = ("naive", "gpipe", "1f1b", "interleaved")


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


Instruction = Forward | Backward | SendAct | RecvAct | SendGrad | RecvGrad | OptimizerStep
COMPUTE = (Forward, Backward)
SENDS = (SendAct, SendGrad)
RECVS = (RecvAct, RecvGrad)


def virtual_stage(stage: int, chunk: int, p: int) -> int:
    """Position of (rank ``stage``, its chunk ``chunk``) along the model: chunk·p + stage."""
    return chunk * p + stage


def _check_args(kind: str, stage: int, p: int, m: int, v: int) -> None:
    for name, x in (("p", p), ("m", m), ("v", v), ("stage", stage)):
        checks.integer(name, x)
    checks.one_of("the pipeline schedule", kind, KINDS)
    if p < 1 or m < 1 or v < 1:
        raise ValueError(f"need p >= 1 stages, m >= 1 micro-batches and v >= 1 chunks, "
                         f"got p={p}, m={m}, v={v}")
    if not 0 <= stage < p:
        raise ValueError(f"stage {stage} is out of range for p={p} stages (0..{p - 1})")
    if kind != "interleaved" and v != 1:
        raise ValueError(f"v={v} model chunks per rank needs the 'interleaved' schedule, "
                         f"not {kind!r} (use v=1)")
    if kind == "interleaved" and m % p:
        raise ValueError(f"interleaved 1F1B sends micro-batches in groups of p: m={m} "
                         f"micro-batches is not a multiple of p={p} stages")


def _with_comm(order: list[tuple[str, int, int]], stage: int, p: int, v: int) -> list[Instruction]:
    """Compute order -> instructions: receive right before a compute, send right after."""
    last = p * v - 1
    out: list[Instruction] = []
    for what, mb, c in order:
        vs = virtual_stage(stage, c, p)
        if what == "F":
            out += [RecvAct(mb, c)] if vs > 0 else []
            out += [Forward(mb, c)] + ([SendAct(mb, c)] if vs < last else [])
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


def stage_schedule(kind: str, stage: int, p: int, m: int, v: int = 1) -> list[Instruction]:
    """The instructions rank ``stage`` of ``p`` runs for one step of ``m`` micro-batches.

    ``kind``: ``naive``, ``gpipe``, ``1f1b`` or ``interleaved`` (``v`` model chunks
    per rank; ``m`` a multiple of ``p``).  The list ends with one :class:`OptimizerStep`.
    Bad input raises a ``ValueError`` naming the numbers.
    """
    _check_args(kind, stage, p, m, v)
    if kind == "naive":
        order = [(w, i, 0) for i in range(m) for w in ("F", "B")]
    elif kind == "gpipe":
        order = [("F", i, 0) for i in range(m)] + [("B", i, 0) for i in reversed(range(m))]
    elif kind == "1f1b":
        return _one_f_one_b(stage, p, m)
    else:
        order = _interleaved_order(stage, p, m, v)
    return _with_comm(order, stage, p, v)


def forward_schedule(stage: int, p: int, m: int, v: int = 1) -> list[Instruction]:
    """A forward-only pass (validation) on rank ``stage``: micro-batch by micro-batch, chunk
    by chunk, each forward between its receive and its send; no backward, no step.

    No deadlock: (micro-batch i, chunk c) on rank s waits only for (i, c) on rank s − 1
    (or (i, c − 1) on rank p − 1), which comes earlier in the order (i, c, s) that every
    rank's list follows, and sends never block."""
    _check_args("interleaved" if v > 1 else "gpipe", stage, p, m, v)
    order = [("F", i, c) for i in range(m) for c in range(v)]
    return _with_comm(order, stage, p, v)[:-1]


def schedules(kind: str, p: int, m: int, v: int = 1) -> list[list[Instruction]]:
    """Every stage's list: ``[stage_schedule(kind, s, p, m, v) for s in range(p)]``."""
    return [stage_schedule(kind, s, p, m, v) for s in range(p)]


def in_flight(stage_schedule: list[Instruction]) -> int:
    """Peak number of (micro-batch, chunk) pairs whose Forward has run and Backward has not.

    That is how many micro-batches' activations the stage holds at once (with
    v chunks, counted in chunk-activations, each 1/v of the stage's layers):
    GPipe m; 1F1B min(p − s, m) on stage s; interleaved (Megatron-LM, m > p)
    min(2(p − s − 1) + (v − 1)p + 1, m·v), and m·v when m = p.
    """
    held: set[tuple[int, int]] = set()
    peak = 0
    for ins in stage_schedule:
        if isinstance(ins, Forward):
            held.add((ins.mb, ins.chunk))
            peak = max(peak, len(held))
        elif isinstance(ins, Backward):
            held.discard((ins.mb, ins.chunk))
    return peak
