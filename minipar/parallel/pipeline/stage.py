"""What a pipeline stage holds between forward and backward: its hooks and their ledger.

EN activation memory (pipeline stage) · RU память активаций (стадия конвейера) · ZH 激活内存（流水线阶段）

A stage keeps, for every micro-batch in flight, the activations its units'
backward will need — m micro-batches' worth under GPipe, at most p − s under
1F1B (Narayanan et al. 2021, arXiv 2104.04473, §2.2.1); GPipe's
re-materialisation (Huang et al. 2018, arXiv 1811.06965; Chen et al. 2016,
arXiv 1604.06174) keeps only each segment's input and recomputes the rest.
The executor's hooks (:mod:`minipar.nn.executor`) of one chunk are, inside out:

* :class:`StageHooks` — parameters are views of the stage's flat buffer and
  gradients are *added* to its flat gradient buffer: Σ_i w_i ∇ℓ_i over the
  micro-batches (gradient accumulation);
* :class:`~minipar.parallel.remat.Checkpointing`: ``remat=True`` is
  GPipe's re-materialisation — each micro-batch keeps only the chunk's input and
  the chunk is recomputed in its backward, peak O(m·input + one micro-batch's
  chunk activations); ``remat=k``: Chen et al.'s segments of k units inside the
  chunk (its last segment kept whole); no remat: k = n, one segment kept whole,
  nothing recomputed.  Either way an
  :class:`~minipar.parallel.offload.measure.ActivationLedger` around it counts the
  activation bytes held;
* :class:`~minipar.parallel.offload.activations.Offload` (``offload="host"|"disk"``): what
  is kept moves out after forward and back before backward.

:class:`StageMemory` makes them each step and measures, around every forward
and backward, the stage's peak: this chunk's ledger peak during the instruction
plus what the other chunks hold (``activation_peak_bytes``: on the device, what
offload moved out not counted), and the same for the bytes offloaded
(``offload_stats``).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from minipar.nn import executor
from minipar.parallel.offload.measure import ActivationLedger
from minipar.parallel.remat import Checkpointing

__all__ = ["StageHooks", "StageMemory"]


class StageHooks(executor.Hooks):
    """Parameters are views of the stage's flat buffer; gradients are *added* to the flat
    gradient buffer (accumulation over micro-batches)."""

    def __init__(self, views: dict[str, Any], grad_views: dict[str, Any]) -> None:
        super().__init__(views)
        self.grad_views = grad_views

    def on_grads(self, unit: Any, grads: dict[str, Any]) -> None:
        for k, g in grads.items():
            self.grad_views[unit.prefix + k] += g


class _End:
    """A unit no walk reaches, put after a chunk's units: Checkpointing keeps its *last*
    segment whole (a serial backward needs it first), but in a pipeline other
    micro-batches' forwards come between a forward and its backward, so GPipe keeps only
    the chunk's input per micro-batch; behind this marker the chunk's one segment is not
    the last, and is checkpointed."""

    name = "end of the chunk (never walked)"


class StageMemory:
    """The hooks of a stage's chunks and their measurements: ``StageMemory(chunk_units,
    remat=None|True|k, offload=None|"host"|"disk", offload_dir=None)`` (``True``: GPipe's
    one checkpoint per chunk and micro-batch; k: segments of k units)."""

    def __init__(self, chunk_units: Sequence[Sequence[Any]], remat: Any = None,
                 offload: str | None = None, offload_dir: str | None = None) -> None:
        if offload is not None:
            from minipar.parallel.offload.wrap import check_target

            check_target(offload, offload_dir)
        self.chunk_units, self.remat = chunk_units, remat
        self.offload, self.offload_dir = offload, offload_dir
        self.hooks: list[Any] = []
        self.remat_hooks: list[ActivationLedger] = []  # each chunk's ledger, inside its hooks
        self.activation_peak_bytes = 0
        self.offload_stats = {"bytes_out": 0, "bytes_back": 0, "peak_bytes": 0, "seconds": 0.0}

    def recomputed_units(self) -> list[Any]:
        """Units whose forward runs again in backward: remat=True recomputes each chunk as
        one segment, remat=k all but the chunk's last segment of k units."""
        remat, out = self.remat, []
        for units in self.chunk_units:
            n = len(units)
            if remat is True:
                out += list(units)
            elif remat:
                k = min(remat, n)
                out += list(units[:(-(-n // k) - 1) * k])
        return out

    def start_step(self, states: Any, base: Any = None,
                   progress: Callable[[], None] | None = None) -> None:
        """New hooks for each chunk over ``states`` (a ModelStates: params, grads), or over
        ``base``, the innermost hooks if given (ZeRO-3's all-gathering ones in a hybrid);
        ``progress``: called before every unit (the messages in flight, tested)."""
        if base is None:
            base = StageHooks(states.param_views(), states.layout.unflatten(states.grads))
        if progress is not None:
            base = Progressing(base, progress)
        self.hooks, self.remat_hooks = [], []
        for units in self.chunk_units:
            n = len(units)
            if self.remat is True:  # GPipe: the chunk is one checkpointed segment
                h: Any = ActivationLedger(Checkpointing(base, (*units, _End()), every=n))
            else:  # Chen et al.'s segments of k units (k = n: everything kept whole)
                h = ActivationLedger(Checkpointing(base, units, every=min(self.remat or n, n)))
            self.remat_hooks.append(h)
            if self.offload is not None:
                from minipar.parallel.offload.activations import Offload
                from minipar.parallel.offload.measure import MeteredStore

                h = Offload(h, MeteredStore(self.offload, self.offload_dir))
            self.hooks.append(h)

    def measured(self, chunk: int, fn: Callable[[], Any]) -> Any:
        """``fn()`` (a forward or backward of chunk ``chunk``), its peaks recorded."""
        hooks, ledgers = self.hooks, self.remat_hooks
        ledgers[chunk].reset_peak()
        if self.offload is not None:
            hooks[chunk].store.reset_peak()
        out = fn()
        others = [h for i, h in enumerate(hooks) if i != chunk]
        self.activation_peak_bytes = max(self.activation_peak_bytes, ledgers[chunk].device_peak
                                         + sum(r.device_now for i, r in enumerate(ledgers)
                                               if i != chunk))
        if self.offload is not None:  # the same for the bytes offloaded (Offload's store)
            o = self.offload_stats
            o["peak_bytes"] = max(o["peak_bytes"], max(hooks[chunk].store.peak.values())
                                  + sum(max(h.store.held.values()) for h in others))
        return out

    def end_step(self) -> None:
        """Offload's counters into ``offload_stats``; its files removed."""
        for h in self.hooks:
            if self.offload is not None:
                o = self.offload_stats
                o["bytes_out"] += h.store.moved["to_host"] + h.store.moved["to_disk"]
                o["bytes_back"] += h.store.moved["to_device"]
                o["seconds"] += h.store.seconds["out"] + h.store.seconds["back"]
                h.close()
        self.hooks, self.remat_hooks = [], []


class Progressing:
    """Hooks that call ``progress()`` before each unit's parameters are fetched, then do as
    ``inner`` does: the pipeline's messages progressed from inside the computation."""

    def __init__(self, inner: Any, progress: Callable[[], None]) -> None:
        self.inner, self.progress = inner, progress

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)

    def fetch(self, unit: Any) -> Any:
        self.progress()
        return self.inner.fetch(unit)
