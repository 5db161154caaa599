"""One pipeline stage: its instructions, and the loop that runs them against its neighbours.

EN pipeline stage loop (instructions and their executor) · RU цикл стадии конвейера
(инструкции и их исполнитель) · ZH 流水线阶段循环（指令与执行器）

A pipeline cuts the model into ``p`` stages, one per rank, and the mini-batch into
``m`` micro-batches (GPipe, Huang et al. 2018, arXiv 1811.06965; 1F1B and
interleaved 1F1B, Narayanan et al. 2021, arXiv 2104.04473).  A *schedule* is
data: for each stage, the list of small frozen instructions it runs in order
(ShallowSpeed's ``pipe.py``, DeepSpeed's ``pipe/schedule.py``), so that one
source drives this loop, the checker (:mod:`.check`), the simulator
(:mod:`.simulate`) and the charts.  The instructions of stage s, micro-batch
``mb``, its model chunk ``chunk`` (0 unless a rank holds several)::

    Forward    Backward  = BackwardInput (B) + BackwardWeight (W)   compute
    RecvAct    SendAct   (activations, to the next virtual stage)     messages
    RecvGrad   SendGrad  (their gradients, to the previous one)
    OptimizerStep        (once, after every backward: the flush)

**Virtual stages.**  With v chunks per rank the model is p·v *virtual stages*;
chunk c of rank s is virtual stage c·p + s (interleaved 1F1B: a micro-batch goes
round the ring of ranks v times) or, in ZB-V's V, s and 2p − 1 − s
(:func:`virtual_stage`).  ``SendAct`` goes to virtual stage vs + 1, ``SendGrad``
to vs − 1; ``chunk`` in a message names the sender's or receiver's *own* chunk.

**Messages in the list.**  A schedule is written as a *compute order*;
:func:`~.schedule.with_comm` adds the messages, the same for every kind: each
receive right before the compute that needs it, each send right after the compute
that made it.

**The loop** (:class:`StageLoop`) runs one stage's list, each instruction
dispatched from one table (DeepSpeed's ``_INSTRUCTION_MAP``; a new kind of
instruction is one row).  Micro-batch i holds rows [lo_i, hi_i) of my rows (the
``array_split`` rule) and its loss is weighted by w_i = (hi_i − lo_i)/B, B the
global batch, so Σ_replicas Σ_i w_i ∇ℓ_i = ∇ℓ: gradient accumulation, then data
parallelism's sum, the serial gradient.  ``Forward`` runs the units executor over
the chunk (:mod:`minipar.nn.executor`; the last virtual stage adds the loss) and
keeps what its backward needs; ``Backward`` runs its backward, the gradients
*added* by the hooks — or split (zero bubble, Qi et al. 2023), ``BackwardInput``
keeps what ``BackwardWeight`` will need; sends and receives go through the link it
is given (:class:`~.p2p.StageLink`: non-blocking sends, blocking receives);
``OptimizerStep`` waits for the sends and calls the step it is given.  The loop
holds no clock and no ledger: whoever runs it may pass ``around(ins, dispatch)``,
which runs every instruction (the engine times them there and measures memory).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from minipar import spans
from minipar.nn import executor


@dataclass(frozen=True)
class MicroBatchInstruction:
    """An instruction about one micro-batch ``mb`` on my model chunk ``chunk`` (each kind
    below is this frozen dataclass under its own name: ``Forward(3) != Backward(3)``)."""
    mb: int
    chunk: int = 0


class Forward(MicroBatchInstruction):
    """Run my chunk forward on micro-batch ``mb`` (keep its activations)."""


class Backward(MicroBatchInstruction):
    """Run my chunk backward on micro-batch ``mb`` (free its activations)."""


class BackwardInput(MicroBatchInstruction):
    """**B** (Qi et al. 2023): my chunk's gradient with respect to its *input* for ``mb`` —
    what the previous stage waits for.  Frees the activations W does not need; keeps the
    linears' inputs and output gradients until :class:`BackwardWeight`."""


class BackwardWeight(MicroBatchInstruction):
    """**W** (Qi et al. 2023): my chunk's parameter gradients for ``mb``, from what B kept.
    No other stage waits for it; only the optimizer step does."""


class SendAct(MicroBatchInstruction):
    """Send the output activation of my chunk for ``mb`` to the next virtual stage."""


class RecvAct(MicroBatchInstruction):
    """Receive the input activation of my chunk for ``mb`` (previous virtual stage)."""


class SendGrad(MicroBatchInstruction):
    """Send the gradient of my chunk's input for ``mb`` to the previous virtual stage."""


class RecvGrad(MicroBatchInstruction):
    """Receive the gradient of my chunk's output for ``mb`` (next virtual stage)."""


@dataclass(frozen=True)
class OptimizerStep:
    """Update this stage's parameters: once, after every backward (the pipeline flush)."""


@dataclass(frozen=True)
class ForwardBackward:
    """DualPipe's **overlapped pair** (DeepSeek-AI 2024, arXiv 2412.19437, §3.2.1): the
    forward of one micro-batch and the whole backward of another, run together so that
    one's messages travel while the other computes.  Its receives come before it, its
    sends after (:func:`~.schedule.with_comm`); the loop runs ``forward`` then
    ``backward``, each through ``around`` (one core computes one at a time)."""
    forward: Forward
    backward: Backward


Instruction = (Forward | Backward | BackwardInput | BackwardWeight | SendAct | RecvAct
               | SendGrad | RecvGrad | OptimizerStep | ForwardBackward)


def ends(vs: int, p: int, v: int, placement: str = "loop") -> tuple[bool, bool]:
    """(first, last): does virtual stage ``vs`` embed the tokens, does it add the loss?
    ``"dual"`` (DualPipe: two pipelines, one each way) has two of each: vs mod p = 0, p − 1."""
    if placement == "dual":
        return vs % p == 0, vs % p == p - 1
    return vs == 0, vs == p * v - 1


def virtual_stage(stage: int, chunk: int, p: int, placement: str = "loop") -> int:
    """Position of (rank ``stage``, its chunk ``chunk``) along the model.

    ``"loop"`` (interleaved 1F1B): chunk·p + stage — the micro-batch goes round the ring
    of ranks v times.  ``"v"`` (ZB-V, two chunks): chunk 0 is virtual stage ``stage``,
    chunk 1 is 2p − 1 − stage — down the ranks and back up, so rank 0 holds the first
    and the last chunk (the loss is on rank 0) and rank p − 1 hands its chunk 0's output
    to its own chunk 1.  ``"dual"`` (DualPipe) numbers the chunks as the V does but cuts it
    at p − 1 | p: chunk 0 (vs s) is stage s of the pipeline going down the ranks, chunk 1
    (vs 2p − 1 − s) stage p − 1 − s of the one going up (:func:`ends`)."""
    if placement in ("v", "dual"):
        return stage if chunk == 0 else 2 * p - 1 - stage
    return chunk * p + stage


def rank_of(vs: int, p: int, placement: str = "loop") -> int:
    """The rank holding virtual stage ``vs`` (inverse of :func:`virtual_stage`)."""
    if placement in ("v", "dual"):
        return vs if vs < p else 2 * p - 1 - vs
    return vs % p


class StageLoop:
    """Rank ``stage`` of ``p`` (``v`` chunks each, ``placement``) running its instructions.

    ``chunks[c]``: the units of my chunk c; ``link``: my messages (``send(ins, vs, data)``,
    ``recv(ins, vs, (rows, seq))``, ``begin()``, ``wait()``, ``unreceived()``:
    :class:`~.p2p.StageLink`); ``loss``: ``loss_forward(logits, targets) -> (loss, saved)``
    and ``loss_backward(saved, scale) -> dlogits``, run on the last virtual stage;
    ``loss_weight``: every w_i is multiplied by it (1; the hybrid under context
    parallelism: s_c/s, my share of the positions)."""

    def __init__(self, stage: int, p: int, v: int, chunks: Sequence[Sequence[Any]], link: Any,
                 loss: Any, placement: str = "loop", loss_weight: float = 1.0) -> None:
        self.stage, self.p, self.v, self.placement = stage, p, v, placement
        self.chunks, self.link, self.loss_fn, self.loss_weight = chunks, link, loss, loss_weight
        self.first, self.last = zip(*(ends(self.vs(c), p, v, placement) for c in range(v)))
        self.table: dict[type, Callable[[Any], None]] = {
            Forward: self.forward, Backward: self.backward, BackwardInput: self.backward_input,
            BackwardWeight: self.backward_weight, SendAct: self.send, SendGrad: self.send,
            RecvAct: self.recv, RecvGrad: self.recv, OptimizerStep: self.optimizer_step,
            ForwardBackward: lambda ins: (self.do(ins.forward), self.do(ins.backward))}

    def run(self, instructions: Sequence[Instruction], x: Any, y: Any, rows: int, m: int,
            hooks: Sequence[Any], step: Callable[[], bool] | None = None,
            loss_scale: float = 1.0, keep: bool = True,
            around: Callable[[Instruction, Callable[[Any], None]], None] | None = None) -> float:
        """Run ``instructions`` on my rows ``x`` (tokens), ``y`` (targets) of a global batch
        of ``rows``, cut into ``m`` micro-batches, chunk c's units under ``hooks[c]``;
        ``step``: what ``OptimizerStep`` calls (True: updated; False: skipped, a 16-bit
        overflow); ``keep=False``: forward only, nothing kept.  My stage's part of the loss."""
        self.x, self.y, self.rows, self.hooks = x, y, rows, hooks
        half = m // 2 if self.placement == "dual" else 0  # DualPipe: chunk 1 has the 2nd half
        self.cuts = {(i, c): spans.span(len(x), m, i + c * half)
                     for i in range(m - half) for c in range(self.v)}
        self.step, self.loss_scale, self.keep = step, loss_scale, keep
        self.around = around or (lambda ins, dispatch: dispatch(ins))
        self.loads: dict[str, Any] | None = {} if keep else None  # MoE loads (loss-free)
        self.held: dict[tuple[int, int], Any] = {}     # (mb, chunk) -> (kept, loss's saved)
        self.pending: dict[tuple[int, int], Any] = {}  # (mb, chunk) -> what its W needs
        self.box: dict[tuple[str, int, int], Any] = {}  # (what, mb, chunk) -> tensor
        self.loss, self.stepped = 0.0, True
        self.link.begin()
        for ins in instructions:
            if type(ins) not in self.table:
                raise ValueError(f"stage {self.stage}: unknown pipeline instruction {ins!r}")
            self.do(ins)
        self.link.wait()
        if self.held or self.pending or self.box or self.link.unreceived():
            raise ValueError(f"stage {self.stage}: the instructions ended with work left: "
                             f"without backward {sorted(self.held)}, without W "
                             f"{sorted(self.pending)}, unsent or unused messages "
                             f"{sorted(self.box) + self.link.unreceived()}")
        return self.loss

    def do(self, ins: Instruction) -> None:
        self.around(ins, self.table[type(ins)])

    def vs(self, chunk: int) -> int:
        return virtual_stage(self.stage, chunk, self.p, self.placement)

    def weight(self, mb: int, c: int) -> float:
        """w_i = (hi_i − lo_i)/B (times ``loss_weight``)."""
        lo, hi = self.cuts[mb, c]
        return self.loss_weight * (hi - lo) / self.rows

    def take(self, store: dict, key: tuple, ins: Instruction, needs: str) -> Any:
        if key not in store:
            raise ValueError(f"stage {self.stage}: {ins} before its {needs}")
        return store.pop(key)

    def forward(self, ins: Forward) -> None:
        mb, c = ins.mb, ins.chunk
        lo, hi = self.cuts[mb, c]
        x = self.x[lo:hi] if self.first[c] else self.take(self.box, ("in", mb, c), ins,
                                                          "RecvAct")
        aux: list[float] = []
        out, kept = executor.forward(self.chunks[c], self.hooks[c], x, aux=aux,
                                     loads=self.loads)
        self.loss += self.weight(mb, c) * sum(aux)
        saved = None
        if self.last[c]:
            ce, saved = self.loss_fn.loss_forward(out, self.y[lo:hi])
            self.loss += self.weight(mb, c) * ce
        else:
            self.box["out", mb, c] = out
        if self.keep:
            self.held[mb, c] = (kept, saved)

    def output_grad(self, ins: Backward | BackwardInput) -> tuple[Any, Any, float]:
        """(kept, dy, scale): the loss's gradient on the last virtual stage, else received."""
        kept, saved = self.take(self.held, (ins.mb, ins.chunk), ins, "Forward")
        scale = self.weight(ins.mb, ins.chunk) * self.loss_scale
        if self.last[ins.chunk]:
            return kept, self.loss_fn.loss_backward(saved, scale), scale
        return kept, self.take(self.box, ("dout", ins.mb, ins.chunk), ins, "RecvGrad"), scale

    def backward(self, ins: Backward) -> None:
        kept, dy, scale = self.output_grad(ins)
        dx = executor.backward(self.chunks[ins.chunk], self.hooks[ins.chunk], kept, dy, scale)
        if not self.first[ins.chunk]:
            self.box["din", ins.mb, ins.chunk] = dx

    def backward_input(self, ins: BackwardInput) -> None:
        """B: the input's gradient; what W needs waits in ``pending`` until its W."""
        kept, dy, scale = self.output_grad(ins)
        dx, self.pending[ins.mb, ins.chunk] = executor.backward_input(
            self.chunks[ins.chunk], self.hooks[ins.chunk], kept, dy, scale)
        if not self.first[ins.chunk]:
            self.box["din", ins.mb, ins.chunk] = dx

    def backward_weight(self, ins: BackwardWeight) -> None:
        """W: the parameter gradients from what B kept, added by the hooks (no message)."""
        pending = self.take(self.pending, (ins.mb, ins.chunk), ins, "BackwardInput")
        executor.backward_weight(self.chunks[ins.chunk], self.hooks[ins.chunk], pending)

    def send(self, ins: SendAct | SendGrad) -> None:
        what = "out" if isinstance(ins, SendAct) else "din"
        self.link.send(ins, self.vs(ins.chunk), self.box.pop((what, ins.mb, ins.chunk), None))

    def recv(self, ins: RecvAct | RecvGrad) -> None:
        lo, hi = self.cuts[ins.mb, ins.chunk]
        what = "in" if isinstance(ins, RecvAct) else "dout"
        self.box[what, ins.mb, ins.chunk] = self.link.recv(ins, self.vs(ins.chunk),
                                                           (hi - lo, self.x.shape[1]))

    def optimizer_step(self, ins: OptimizerStep) -> None:
        self.link.wait()
        self.stepped = self.step()
