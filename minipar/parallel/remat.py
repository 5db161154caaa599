"""Activation checkpointing (remat) — чекпоинтинг активаций (рематериализация) — 激活检查点（重计算）.

EN activation checkpointing / rematerialization · RU чекпоинтинг активаций
(рематериализация) · ZH 激活检查点（重计算）; EN selective recomputation ·
RU выборочный пересчёт · ZH 选择性重计算

Chen, Xu, Zhang & Guestrin 2016, "Training Deep Nets with Sublinear Memory
Cost", arXiv 1604.06174.  Backward needs every unit's ``saved`` (its
activations), so a plain walk over n units holds n units' worth at the end
of forward: memory O(n).  Cut the n units into segments of k and keep, for
every segment but the last, only its *input* x (one (B, T, d) array, the
checkpoint); drop the other ``saved``.  Backward reaches a segment from its
end, recomputes the segment's forward from the checkpoint (its k ``saved``
now live again) and walks back through it.  At any moment the hooks hold

    ⌈n/k⌉ checkpoints  +  one segment's k units' activations,

which is smallest near k = √n: about 2√n units instead of n — sublinear
memory for one extra forward.  The last segment's activations are still
needed first, so it is kept as it is and never recomputed: the forwards run
are n + (n − last) with last = n − (⌈n/k⌉ − 1)·k
(:func:`minipar.plan.checkpointing.recompute_forward_layers`).  With k = n
there is one segment, kept whole: no remat at all.

Selective recomputation (Korthikanti et al. 2022, "Reducing Activation
Recomputation in Large Transformer Models", arXiv 2205.05198): keep every
unit's ``saved`` but drop the attention probabilities A = softmax(q kᵀ/√d_h
+ M), B·H·T·T elements per block — the one activation that grows with T²
— and recompute A from the q, k, v that ``saved`` holds anyway (one
``attention_core_forward``, cheap next to the matrix products of a block).

:class:`Checkpointing` does both through the units executor's hooks
(:mod:`minipar.nn.executor`): ``on_saved`` keeps less (a :class:`Segment`'s
checkpoint, or the unit :class:`Whole`), ``restore`` recomputes.  It wraps
any other hooks — serial, DDP's, ZeRO's: parameters for the recompute come
through the wrapped ``fetch``/``release`` (ZeRO-3 gathers the unit again),
gradients go to the wrapped ``on_grads`` — and the recomputation is the very
same ``unit.forward``, so gradients and loss are bit-identical to no remat
(tests/test_remat.py; the MoE aux loss is read once, in the first forward,
never from a recompute).

What the hooks hold is measured outside, from what they return:
:class:`minipar.parallel.offload.measure.ActivationLedger` wraps a
``Checkpointing`` and counts the bytes of its segments, kept units and the
``saved`` handed to backward (each buffer once; on the device or moved out).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

from minipar import checks
from minipar.nn.attention import attention_core_forward
from minipar.nn.executor import Hooks

__all__ = ["Checkpointing", "Segment", "Whole", "default_every"]


def default_every(n: int) -> int:
    """k = ⌈√n⌉ units per segment (Chen et al.'s choice, near the memory minimum)."""
    checks.integer("the number of units", n, 1)
    return math.isqrt(n - 1) + 1 if n > 1 else 1


class Segment:
    """What :meth:`Checkpointing.on_saved` keeps for a checkpointed unit: its segment's
    input ``x`` (the checkpoint), its ``units`` as forward met them, and (while backward
    walks it) the recomputed ``saved`` of each, the last unit's on top.  Every unit of a
    segment keeps the same object (an offload moves ``x`` out once)."""

    def __init__(self, x: Any) -> None:
        self.x: Any = x
        self.units: list[Any] = []
        self.saved: list[Any] = []


class Whole:
    """What :meth:`Checkpointing.on_saved` keeps for a unit kept whole (the last segment,
    or every unit under selective recomputation): what the wrapped hooks' ``on_saved``
    returned."""

    def __init__(self, kept: Any) -> None:
        self.kept = kept


class Checkpointing(Hooks):
    """Hooks that keep less and recompute: ``Checkpointing(hooks, units, every=None,
    selective=False)``.

    ``units``: the units one ``executor.forward`` walks, in order (a pipeline stage
    passes its slice); ``every``: k, units per segment (default ⌈√n⌉, n = len(units);
    k = n keeps everything; Megatron-LM's ``recompute_granularity="full"`` with
    ``recompute_num_layers``); ``selective``: instead of segments, keep every ``saved``
    except each block's attention probabilities A (Korthikanti et al.; Megatron-LM's
    ``recompute_granularity="selective"``).  Several
    forwards may be in flight before their backwards (GPipe's micro-batches): each
    segment lives in the walk's own ``kept`` list, not in the hooks.  ``grads`` is the
    wrapped hooks'; anything else of theirs is read on them, ``inner``."""

    def __init__(self, hooks: Hooks, units: Sequence[Any], every: int | None = None,
                 selective: bool = False) -> None:
        n = len(units)
        if n < 1:
            raise ValueError("activation checkpointing needs at least one unit to walk")
        if selective and every is not None:
            raise ValueError("selective recomputation keeps every unit's activations but A; "
                             "pass either every=k (segments) or selective=True, not both")
        k = default_every(n) if every is None else every
        checks.integer("remat interval every", k, 1, why="units per checkpointed segment")
        if k > n:
            raise ValueError(f"remat interval every={k} exceeds the {n} units walked; "
                             f"every={n} already keeps everything")
        self.inner, self.units, self.every, self.selective = hooks, tuple(units), k, selective
        self._pos = {id(u): i for i, u in enumerate(self.units)}
        self._last_segment = (n - 1) // k
        self._open: Segment | None = None
        self._expect = 0  # position of the unit the forward walk must reach next

    @property
    def grads(self) -> dict[str, Any]:  # type: ignore[override]
        return self.inner.grads

    def fetch(self, unit: Any) -> dict[str, Any]:
        return self.inner.fetch(unit)

    def release(self, unit: Any, params: dict[str, Any]) -> None:
        self.inner.release(unit, params)

    def _position(self, unit: Any) -> int:
        i = self._pos.get(id(unit))
        if i is None:
            raise ValueError(f"unit {unit.name!r} is not one of the {len(self.units)} units this "
                             f"Checkpointing was made for (one instance per walked slice)")
        return i

    def on_saved(self, unit: Any, saved: Any, x: Any) -> Any:
        """Keep the unit's activations whole (last segment), minus A (selective), or
        nothing but its segment's input (the first unit of a segment keeps x)."""
        i = self._position(unit)
        if i not in (0, self._expect):
            raise ValueError(f"forward reached unit {unit.name!r} (position {i}) where position "
                             f"{self._expect} was next: a walk must run the units given, in order")
        self._expect = (i + 1) % len(self.units)
        if self.selective:
            saved = _without_probabilities(saved)
        if self.selective or i // self.every == self._last_segment:
            self._open = None
            return Whole(self.inner.on_saved(unit, saved, x))
        if i % self.every == 0:
            self._open = Segment(x)
        seg = self._open
        assert seg is not None  # a walk starts at position 0, a segment's first unit
        seg.units.append(unit)
        if i % self.every == self.every - 1:
            self._open = None
        return seg

    def restore(self, unit: Any, kept: Any) -> Any:
        """``saved`` again: from the wrapped hooks (A recomputed if selective), or
        popped from the segment, which is recomputed from its checkpoint first."""
        if isinstance(kept, Whole):
            out = self.inner.restore(unit, kept.kept)
            return _with_probabilities(out) if self.selective else out
        seg = kept
        if not seg.saved:  # backward has reached the segment's last unit: recompute it
            x = seg.x
            for v in seg.units:
                p = self.inner.fetch(v)
                x, s = v.forward(p, x)
                self.inner.release(v, p)
                del p
                seg.saved.append(s)
            seg.x = None  # the checkpoint is done with
        if seg.units.pop() is not unit:
            raise ValueError(f"backward reached unit {unit.name!r} out of its segment's order")
        return seg.saved.pop()

    def on_backward_input(self, unit: Any) -> None:
        self.inner.on_backward_input(unit)

    def on_grads(self, unit: Any, grads: dict[str, Any]) -> None:
        self.inner.on_grads(unit, grads)


# -- selective recomputation: the attention probabilities of a block --------------------
def _without_probabilities(saved: Any) -> Any:
    """A block's ``saved`` with A (B, H, T, T) replaced by None; other units' as they are.
    The block's layout is ``{"attn": (s_qkv, (q, k, v, A), s_out, n_head), ...}``."""
    if not (isinstance(saved, dict) and "attn" in saved):
        return saved
    s_qkv, (q, k, v, _a), s_out, n_head = saved["attn"]
    return {**saved, "attn": (s_qkv, (q, k, v, None), s_out, n_head)}


def _with_probabilities(saved: Any) -> Any:
    """A recomputed from the q, k, v still in ``saved``: the same operations as the first
    forward (``attention_core_forward``), so the same bits."""
    if not (isinstance(saved, dict) and "attn" in saved):
        return saved
    s_qkv, (q, k, v, _none), s_out, n_head = saved["attn"]
    a = attention_core_forward(q, k, v)[1][3]
    return {**saved, "attn": (s_qkv, (q, k, v, a), s_out, n_head)}
