"""One training loop for every engine — единый цикл обучения — 统一训练循环.

nanoGPT's ``train.py`` in a dozen lines, for any :class:`~minipar.parallel.engine.Engine`
(the serial model, DDP, ZeRO, a pipeline, the hybrid, ...)::

    for step in start … steps−1:
        result = engine.step(source(step))            # the GLOBAL batch of this step
        every eval_every steps:  engine.evaluate(eval_source(step))
        every save_every steps:  save(engine, step + 1)  # e.g. a sharded checkpoint

``steps`` is the total: a run resumed at ``start`` (the engine loaded from a
checkpoint of ``start`` steps) goes on to the same end.  ``source(step)`` is
deterministic in the step (:meth:`minipar.parallel.common.RunSpec.batch_at`), so a
resumed run sees the batches the uninterrupted one would have.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, TextIO

from minipar import checks
from minipar.parallel.engine import Batch, Engine
from minipar.progress import bar as progress_bar


@dataclass
class History:
    """What a run of the loop gives back: the loss of every step it ran (from ``start``),
    which steps were skipped (16-bit overflow), and the validation losses by step."""

    start: int = 0
    losses: list[float] = field(default_factory=list)
    skipped: list[int] = field(default_factory=list)
    validation: dict[int, float] = field(default_factory=dict)


def train(engine: Engine, source: Callable[[int], Batch], steps: int, *, start: int = 0,
          eval_source: Callable[[int], Batch] | None = None, eval_every: int = 0,
          save: Callable[[Engine, int], Any] | None = None, save_every: int = 0,
          progress: TextIO | bool | None = None) -> History:
    """Train ``engine`` from step ``start`` to ``steps`` (the total); see the module text.

    ``progress``: a stream for a bar (:func:`minipar.progress.bar`), True for a notebook
    bar, None for none (give it on one rank only)."""
    checks.integer("steps", steps, 1)
    if not 0 <= start <= steps:
        raise ValueError(f"start {start} is outside 0..{steps}")
    h = History(start)
    bar = None if progress is None or progress is False else progress_bar(
        steps - start, "step", None if progress is True else progress, notebook=progress is True)
    try:
        for s in range(start, steps):
            r = engine.step(source(s))
            h.losses.append(r.loss)
            if r.skipped:
                h.skipped.append(s)
            if eval_source is not None and eval_every and (s + 1) % eval_every == 0:
                h.validation[s + 1] = engine.evaluate(eval_source(s))
            if save is not None and save_every and (s + 1) % save_every == 0:
                save(engine, s + 1)
            if bar is not None:
                text = f"loss {r.loss:.4f}" if math.isfinite(r.loss) else f"loss {r.loss}"
                bar.set_postfix_str(text, refresh=False)
                bar.update(1)
    finally:
        if bar is not None:
            bar.close()
    return h
