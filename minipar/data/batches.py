"""The global batch of a step — глобальный батч шага — 一步的全局批次.

Every data set of :mod:`minipar.data` keeps one contract, and this module is
all of it:

* the global batch of step ``s`` is a pure function of ``(seed, s)``: its
  random numbers come from :func:`batch_rng`, a generator seeded by
  ``SeedSequence([seed, s, task id])`` (:data:`TASK_IDS`, one id per data
  set, so two data sets never share a stream);
* a caller asks for rows ``[lo, hi)`` of it (:func:`batch_rows` checks them),
  and the data set draws the *whole* batch's random numbers before it cuts
  the rows out, so rows ``[lo, hi)`` are the same numbers whoever asks.

So any rank can fetch any slice of any step's batch without talking to
another rank — a data-parallel rank its 1/N of the rows
(:func:`minipar.parallel.common.local_rows`), a pipeline's first stage one
micro-batch — and a parallel run sees exactly the serial run's data.
"""

from __future__ import annotations

import numpy as np  # host-side RNG only: the data sets move their batches with to_device

#: data set -> the third word of its SeedSequence (never reuse or renumber one:
#: a checkpoint's data position means these streams)
TASK_IDS: dict[str, int] = {"modular_sum": 1, "spirals": 2, "text.train": 3,
                            "text.validation": 4}


def batch_rng(task: str, seed: int, step: int) -> np.random.Generator:
    """The generator of global batch ``step`` of ``task`` under ``seed``."""
    if seed < 0 or step < 0:
        raise ValueError(f"seed and step must be >= 0, got seed={seed}, step={step}")
    return np.random.default_rng(np.random.SeedSequence([int(seed), int(step), TASK_IDS[task]]))


def batch_rows(batch_size: int, lo: int, hi: int | None) -> tuple[int, int]:
    """``(lo, hi)`` with ``hi = batch_size`` when None; ValueError unless inside the batch."""
    if batch_size < 1:
        raise ValueError(f"batch_size must be >= 1, got {batch_size}")
    hi = batch_size if hi is None else hi
    if not 0 <= lo <= hi <= batch_size:
        raise ValueError(f"rows [{lo}, {hi}) are not inside the global batch of {batch_size}")
    return lo, hi
