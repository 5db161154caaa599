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
(:mod:`minipar.nn.executor`: ``on_saved`` keeps less, ``restore`` recomputes).
It wraps any other hooks — serial, DDP's, ZeRO's: parameters for the
recompute come through the wrapped ``fetch``/``release`` (ZeRO-3 gathers the
unit again), gradients go to the wrapped ``on_grads`` — and the recomputation
is the very same ``unit.forward``, so gradients and loss are bit-identical to
no remat (tests/test_remat.py; the MoE aux loss is read once, in the
first forward, never from a recompute).  Its ledger counts the bytes of the
activations it holds (each buffer once), from ``on_saved`` until the unit's
``on_grads``: ``bytes_now``, ``bytes_peak``.  It knows a buffer by its ``id``
*and* a weak reference to it: offloading (:mod:`minipar.parallel.offload.activations`,
wrapped inside or outside) frees the buffers it moves out, and a new buffer may get a
dead one's id, which an id alone would take for the old one.  A held buffer
that died was moved out (host or disk), one still alive is on the device:
``device_now`` / ``device_peak`` count those (= ``bytes_now`` without offload).
"""

from __future__ import annotations

import itertools
import math
import weakref
from collections.abc import Sequence
from typing import Any

from minipar import checks
from minipar.nn.attention import attention_core_forward
from minipar.nn.executor import Hooks
from minipar.trees import arrays, owner

__all__ = ["Checkpointing", "Segment", "Whole", "default_every"]


def default_every(n: int) -> int:
    """k = ⌈√n⌉ units per segment (Chen et al.'s choice, near the memory minimum)."""
    checks.integer("the number of units", n, 1)
    return math.isqrt(n - 1) + 1 if n > 1 else 1


class Segment:
    """What :meth:`Checkpointing.on_saved` keeps for a checkpointed unit: its segment's
    input ``x`` (the checkpoint), its units as forward met them, and (while backward walks
    it) the recomputed ``saved`` of each, last unit's on top.  Every unit of a segment
    keeps the same object (an offload moves ``x`` out once)."""

    def __init__(self, x: Any) -> None:
        self.x: Any = x
        self.held: dict[int, int] = {}  # the checkpoint's buffers on the ledger
        self.units: list[Any] = []
        self.saved: list[tuple[Any, dict[int, int]]] = []


class Whole:
    """What :meth:`Checkpointing.on_saved` keeps for a unit kept whole (the last segment, or
    every unit under selective recomputation): what the wrapped hooks' ``on_saved``
    returned (``kept``), and its buffers on the ledger (``held``)."""

    def __init__(self, kept: Any, held: dict[int, int]) -> None:
        self.kept, self.held = kept, held


class Checkpointing(Hooks):
    """Hooks that keep less and recompute: ``Checkpointing(hooks, units, every=None,
    selective=False)``.

    ``units``: the units one ``executor.forward`` walks, in order (a pipeline stage
    passes its slice); ``every``: k, units per segment (default ⌈√n⌉, n = len(units);
    k = n keeps everything); ``selective``: instead of segments, keep every ``saved``
    except each block's attention probabilities A (Korthikanti et al.).  Several
    forwards may be in flight before their backwards (GPipe's micro-batches): each
    segment lives in the walk's own ``kept`` list, not in the hooks.  ``grads`` is the
    wrapped hooks'; anything else of theirs (DDP's ``finish``, ZeRO's
    ``peak_gathered_bytes``) is read on them, ``inner``."""

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
        self._held: dict[Any, list[int]] = {}  # buffer key -> [bytes, references]
        self._lent: dict[int, dict[Any, int]] = {}  # id(unit) -> buffers restore handed out
        self._alive: dict[int, tuple[Any, Any]] = {}  # id -> (weak reference, key)
        self._refs: dict[Any, Any] = {}  # key -> weak reference (absent: no weakref)
        self._serial = itertools.count()
        self.bytes_now = 0
        self.bytes_peak = 0
        self.device_peak = 0

    @property
    def grads(self) -> dict[str, Any]:  # type: ignore[override]
        return self.inner.grads

    # -- the ledger -----------------------------------------------------------------
    @property
    def device_now(self) -> int:
        """Bytes of the held buffers still alive (not moved out by an offload)."""
        return sum(size for key, (size, _) in self._held.items()
                   if key not in self._refs or self._refs[key]() is not None)

    def _key(self, r: Any) -> Any:
        """The ledger's name for buffer ``r``: its id and a serial number (a new buffer at a
        dead one's address is a new entry); its id alone if it takes no weak reference."""
        known = self._alive.get(id(r))
        if known is not None and known[0]() is r:
            return known[1]
        try:
            ref = weakref.ref(r)
        except TypeError:
            return id(r)
        key = (id(r), next(self._serial))
        self._alive[id(r)], self._refs[key] = (ref, key), ref
        return key

    def _hold(self, tree: Any) -> dict[Any, int]:
        """Count the buffers of ``tree`` as held; returns them ({key: bytes}) for :meth:`_drop`."""
        bufs = {self._key(r): int(r.nbytes) for r in map(owner, arrays(tree))}
        for b, size in bufs.items():
            entry = self._held.setdefault(b, [size, 0])
            entry[1] += 1
            if entry[1] == 1:
                self.bytes_now += size
        self.bytes_peak = max(self.bytes_peak, self.bytes_now)
        self.device_peak = max(self.device_peak, self.device_now)
        return bufs

    def _drop(self, bufs: dict[Any, int]) -> None:
        for b in bufs:
            entry = self._held[b]
            entry[1] -= 1
            if entry[1] == 0:
                self.bytes_now -= entry[0]
                del self._held[b]
                self._refs.pop(b, None)

    def reset_peak(self) -> None:
        """Start a new peak from what is held now (between measured steps)."""
        self.bytes_peak = self.bytes_now
        self.device_peak = self.device_now

    # -- the hooks ------------------------------------------------------------------
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
            return Whole(self.inner.on_saved(unit, saved, x), self._hold(saved))
        if i % self.every == 0:
            self._open = Segment(x)
            self._open.held = self._hold(x)
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
            if self.selective:
                out = _with_probabilities(out)
            self._lent[id(unit)] = self._hold(out)  # A included: the executor holds it now
            self._drop(kept.held)
            return out
        seg = kept
        if not seg.saved:  # backward has reached the segment's last unit: recompute it
            x = seg.x
            for v in seg.units:
                p = self.inner.fetch(v)
                x, s = v.forward(p, x)
                self.inner.release(v, p)
                del p
                seg.saved.append((s, self._hold(s)))
            self._drop(seg.held)
            seg.x = None
        if seg.units.pop() is not unit:
            raise ValueError(f"backward reached unit {unit.name!r} out of its segment's order")
        out, self._lent[id(unit)] = seg.saved.pop()
        return out

    def on_backward_input(self, unit: Any) -> None:
        """A zero-bubble B is done: the unit's ``saved`` is dropped (what W keeps is counted
        apart, by the pipeline engine), so it leaves the ledger now."""
        lent = self._lent.pop(id(unit), None)
        if lent is not None:
            self._drop(lent)
        self.inner.on_backward_input(unit)

    def on_grads(self, unit: Any, grads: dict[str, Any]) -> None:
        """The executor has dropped the unit's ``saved``: off the ledger; grads passed on."""
        lent = self._lent.pop(id(unit), None)
        if lent is not None:
            self._drop(lent)
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
