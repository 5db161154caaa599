"""One training loop for every engine — единый цикл обучения — 统一训练循环.

nanoGPT's ``train.py`` in a dozen lines, for any :class:`~minipar.parallel.engine.Engine`
(the serial model, DDP, ZeRO, a pipeline, the hybrid, ...)::

    for step in start … steps−1:
        result = engine.step(source(step))            # the GLOBAL batch of this step
        every eval_every steps:  mean of engine.evaluate(eval_source(k)), k < eval_batches
        every save_every steps:  save(engine, step + 1)  # e.g. a sharded checkpoint

``steps`` is the total: a run resumed at ``start`` (the engine loaded from a
checkpoint of ``start`` steps) goes on to the same end.  The bar shows the loss,
tokens per second and the time left; ``diverge_factor`` f stops the run with
:class:`minipar.train.Diverged` at the first loss that is NaN, infinite or above
f x the first loss of this run (:func:`minipar.train.check_loss`).  ``source(step)`` is
deterministic in the step (:meth:`minipar.parallel.common.RunSpec.batch_at`), so a
resumed run sees the batches the uninterrupted one would have.
"""

from __future__ import annotations

import contextlib
import math
import time
from collections.abc import Callable
from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from typing import Any, TextIO

from minipar import checks
from minipar.parallel.engine import Batch, Engine
from minipar.progress import bar as progress_bar
from minipar.train import check_loss


@dataclass
class History:
    """What a run of the loop gives back: the loss of every step it ran (from ``start``),
    which steps were skipped (16-bit overflow), the validation losses by step, and the
    seconds and tokens of its steps (evaluation and saving not counted)."""

    start: int = 0
    losses: list[float] = field(default_factory=list)
    skipped: list[int] = field(default_factory=list)
    validation: dict[int, float] = field(default_factory=dict)
    seconds: float = 0.0
    tokens: int = 0

    @property
    def tokens_per_second(self) -> float:
        return self.tokens / self.seconds if self.seconds > 0 else 0.0


def train(engine: Engine, source: Callable[[int], Batch], steps: int, *, start: int = 0,
          eval_source: Callable[[int], Batch] | None = None, eval_every: int = 0,
          eval_batches: int = 1,
          save: Callable[[Engine, int], Any] | None = None, save_every: int = 0,
          progress: TextIO | bool | None = None,
          diverge_factor: float | None = None,
          aside: Callable[[], AbstractContextManager[Any]] | None = None) -> History:
    """Train ``engine`` from step ``start`` to ``steps`` (the total); see the module text.

    ``progress``: a stream for a bar (:func:`minipar.progress.bar`), True for a notebook
    bar, None for none (give it on one rank only).  Validation: every ``eval_every`` steps,
    the mean loss of the same ``eval_batches`` held-out batches ``eval_source(k)`` (a fixed
    set, so the curve compares like with like).  ``save(engine, step)`` every
    ``save_every`` steps and after the last one; both inside ``aside()`` when given (e.g.
    :meth:`minipar.comm.stats.Stats.set_aside`: their messages counted apart from the
    steps')."""
    checks.integer("steps", steps, 1)
    if not 0 <= start <= steps:
        raise ValueError(f"start {start} is outside 0..{steps}")
    h = History(start)
    bar = None if progress is None or progress is False else progress_bar(
        steps - start, "step", None if progress is True else progress, notebook=progress is True)
    try:
        for s in range(start, steps):
            batch = source(s)
            t0 = time.perf_counter()
            r = engine.step(batch)
            h.seconds += time.perf_counter() - t0
            h.tokens += int(batch.tokens.size)
            h.losses.append(r.loss)
            if r.skipped:
                h.skipped.append(s)
            if diverge_factor is not None:
                check_loss(s, r.loss, h.losses[0], diverge_factor)
            with aside() if aside is not None else contextlib.nullcontext():
                if eval_source is not None and eval_every and (s + 1) % eval_every == 0:
                    h.validation[s + 1] = sum(engine.evaluate(eval_source(k))
                                              for k in range(eval_batches)) / eval_batches
                if save is not None and save_every and ((s + 1) % save_every == 0
                                                        or s + 1 == steps):
                    save(engine, s + 1)
            if bar is not None:
                text = f"loss {r.loss:.4f}" if math.isfinite(r.loss) else f"loss {r.loss}"
                if h.validation:
                    text += f", val {h.validation[max(h.validation)]:.4f}"
                text += f", {h.tokens_per_second:,.0f} tok/s"
                bar.set_postfix_str(text, refresh=False)
                bar.update(1)
    finally:
        if bar is not None:
            bar.close()
    return h


def fit(engine: Engine, spec: Any, comm: Any = None, *, save_dir: str | None = None,
        save_every: int = 0, keep_last: int = 0, resume: str | None = None,
        eval_every: int = 0, eval_batches: int = 4, progress: TextIO | bool | None = None,
        diverge_factor: float | None = None,
        aside: Callable[[], AbstractContextManager[Any]] | None = None) -> History:
    """:func:`train` on a :class:`~minipar.parallel.common.RunSpec`'s data, with its
    checkpoints: what ``minipar train`` and every ``minipar run`` strategy do.

    ``resume``: a checkpoint (a step directory, or a root: its latest complete one) that
    ``engine`` is loaded from (any layout saved it); the run goes on from its step to
    ``spec.steps`` (the total).  ``save_dir``: every ``save_every`` steps and after the
    last, every rank of ``comm`` (the engine's ranks; None: one process) writes its part
    (:func:`minipar.parallel.checkpoint.save`, atomic, the manifest last); ``keep_last`` K
    > 0: after each save rank 0 removes all but the newest K complete checkpoints under
    ``save_dir``, never the one ``resume`` names (0: keep every one).  Validation:
    the mean loss of ``eval_batches`` held-out batches (:meth:`RunSpec.eval_batch_at`)
    every ``eval_every`` steps."""
    from minipar.parallel import checkpoint

    comm = checkpoint.OneProcess() if comm is None else comm
    start = 0
    if resume is not None:
        start = int(checkpoint.load(engine, resume, spec=spec)["step"] or 0)
    save = None
    if save_dir is not None:
        def save(eng: Engine, step: int) -> None:
            checkpoint.save(eng, save_dir, comm, spec=spec)
            if keep_last and comm.rank == 0:  # the manifest is written: the save is complete
                checkpoint.prune(save_dir, keep_last, spare=(resume,) if resume else ())
    return train(engine, spec.batch_at, spec.steps, start=start,
                 eval_source=spec.eval_batch_at, eval_every=eval_every, eval_batches=eval_batches,
                 save=save, save_every=save_every or spec.steps, progress=progress,
                 diverge_factor=diverge_factor, aside=aside)
