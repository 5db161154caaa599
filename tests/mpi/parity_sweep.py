"""The parity sweep: every correct run says "equal", every broken one "different".

Launched once on 8 ranks by tests/test_parity.py.  For each world size w = 1..8
the first w ranks form a sub-communicator (``Split``; the others wait
politely) and run their cases on it; rank 0 compares each with the serial run
(:func:`minipar.parallel.common.serial_reference`, computed in this launch, the
(size, seed) pairs spread over the ranks) through :func:`minipar.parallel.parity.compare`.

Correct cases: every (strategy, w) once — dp, ps (sync) and ZeRO 0-3 — with
model size and seed rotating (sizes from ``RunSpec()`` to d_model 64 / 4 layers,
one of them trained 10 steps, seeds 0-2, DDP bucket sizes and PS server counts
rotating too), plus the issue's model (d_model 40, 3 layers, 4 heads, vocab 29,
seq 10, batch 14) on 2 and 3 ranks for every strategy, plus one DDP run past the
horizon (lr 0.1, 30 steps), which may say "equal" or "not comparable", never "different".

Broken cases, built here by subclassing or patching the public classes (the
library has no bug switches): no 1/N (a rank's loss weight 1), one DDP bucket
skipped, a one-step-stale ZeRO shard, one rank's gradient dropped.

Rank 0 prints ``PARITY-SWEEP {json}``: per case its label and the verdict's
``as_dict()``, the per-step loss differences and the serial loss scale max|ℓ_t|.
"""

from __future__ import annotations

import json
import time
from typing import Any

import numpy as np
from mpi4py import MPI

from minipar import spans
from minipar.comm import TracedComm
from minipar.comm.topology import Grid
from minipar.optim import FlatParams
from minipar.parallel import loop
from minipar.parallel.common import RunSpec, serial_reference
from minipar.parallel.data_parallel.engine import DataParallel
from minipar.parallel.data_parallel.ps_engine import ParameterServer
from minipar.parallel.engine import Batch, StepResult
from minipar.parallel.parity import compare
from minipar.parallel.zero.engine import ZeRO

SIZES = {
    "default": RunSpec(),
    "d24x2, 10 steps": RunSpec(d_model=24, layers=2, heads=2, vocab=12, seq=8, batch=12, steps=10),
    "issue": RunSpec(d_model=40, layers=3, heads=4, vocab=29, seq=10, batch=14),
    "d64x4": RunSpec(d_model=64, layers=4, heads=4, vocab=32, seq=12, batch=16),
    # past the horizon: lr 0.1 for 30 steps amplifies rounding (must not say "different")
    "default, lr 0.1, 30 steps": RunSpec(lr=0.1, steps=30),
}
ROTATING = ("default", "d24x2, 10 steps", "issue", "d64x4")
SEEDS = (0, 1, 2)
STRATEGIES = ("dp", "ps", "zero0", "zero1", "zero2", "zero3")
BUCKETS = (4096, 2**30)  # a few buckets, one bucket (one parameter per bucket on <= 3 ranks)


def correct_cases() -> list[dict[str, Any]]:
    """Every (strategy, world size) once — for each strategy the size cycles with w and
    the seed with 2w, so every strategy meets every size and seed and every (size, seed)
    pair occurs — plus the issue's case on 2 and 3 ranks for every strategy and one
    run past the horizon."""
    cases = []
    for w in range(1, 9):
        for j, strat in enumerate(STRATEGIES):
            if strat == "ps" and w < 2:
                continue  # a server and at least one worker
            cases.append({"w": w, "strategy": strat, "size": ROTATING[(w + j) % len(ROTATING)],
                          "seed": SEEDS[(2 * w + j) % len(SEEDS)], "variant": w + j})
        if w in (2, 3):
            have = {(c["w"], c["strategy"], c["size"], c["seed"]) for c in cases}
            cases += [{"w": w, "strategy": s, "size": "issue", "seed": 0, "variant": j}
                      for j, s in enumerate(STRATEGIES) if (w, s, "issue", 0) not in have]
    cases.append({"w": 2, "strategy": "dp", "size": "default, lr 0.1, 30 steps", "seed": 1,
                  "variant": 1})
    return cases


BROKEN = [  # (world size, strategy, bug, size)
    *[(w, "dp", bug, "issue") for w in (2, 3)
      for bug in ("no 1/N", "bucket skipped", "gradient dropped")],
    *[(2, f"zero{k}", "no 1/N", "default") for k in (0, 1, 2, 3)],
    *[(w, f"zero{k}", "stale shard", size) for k in (1, 2)
      for w, size in ((2, "issue"), (3, "default"))],
    *[(w, "ps", bug, "issue") for w in (3, 4) for bug in ("no 1/N", "gradient dropped")],
]


# -- the bugs: subclasses and patches of the public classes ---------------------------------
class _Done:
    """A request that is already complete: what a skipped bucket 'starts'."""

    t_start = t_end = 0.0

    def progress(self) -> bool:
        return True

    def wait(self) -> None:
        return None


class SkippedBucket(DataParallel):
    """DDP that never reduces bucket 1: each replica steps on its own weighted gradient there."""

    def start_bucket(self, b: Any) -> Any:
        return _Done() if b.index == 1 else super().start_bucket(b)


class DroppedGradient(DataParallel):
    """DDP whose last rank sends zeros instead of its gradient (its loss still counts)."""

    def start_bucket(self, b: Any) -> Any:
        if self.rank == self.world - 1:
            self.states.grads[b.lo:b.hi] = 0.0
        return super().start_bucket(b)


class NoOneOverN(DataParallel):
    """DDP whose rank 1 weights its rows' loss and gradients by 1 instead of b_r / B."""

    def local_batch(self, batch: Any) -> tuple[Any, Any, float]:
        x, y, weight = super().local_batch(batch)
        return x, y, 1.0 if self.rank == 1 else weight


class NoOneOverNServer(ParameterServer):
    """A parameter server whose worker 0 weights its rows by 1 instead of b_w / B."""

    def local_batch(self, batch: Any) -> tuple[Any, Any, float]:
        x, y, weight = super().local_batch(batch)
        return x, y, 1.0 if self.worker == 0 else weight


class StaleShard(ZeRO):
    """ZeRO-1/2 where every rank but the last keeps the last rank's slice of the gathered
    parameters one step behind (the values of the previous step's all-gather)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        n = self.comm.size
        self.victim = spans.span(self.layout.size, n, n - 1)  # the last rank's shard
        self.lag = self.params[slice(*self.victim)].copy()

    def step(self, batch: Batch) -> StepResult:
        result = super().step(batch)
        if self.comm.rank != self.comm.size - 1:
            fresh = self.params[slice(*self.victim)].copy()
            self.params[slice(*self.victim)] = self.lag
            self.lag = fresh
        return result


# -- one run on a sub-communicator -----------------------------------------------------------
def run_case(c: TracedComm, strategy: str, spec: RunSpec, variant: int, bug: str | None):
    """(losses, final flat params) on rank 0 of ``c``, (None, None) elsewhere."""
    r, w = c.rank, c.size
    if strategy in ("dp", "ps"):
        grid = Grid(c, dp=w)
        try:
            return _run_data_parallel(grid, strategy, spec, variant, bug)
        finally:
            grid.free()
    stage = int(strategy[-1])
    cls = StaleShard if bug == "stale shard" else ZeRO
    grid = Grid(c, dp=w)
    eng = cls(grid, spec, stage=stage)
    if bug == "no 1/N" and r == 1:
        eng.weight = 1.0
    losses = [eng.step(spec.batch_at(s)).loss for s in range(spec.steps)]
    final = eng.layout.flatten(eng.full_params())
    grid.free()
    return (losses, final) if r == 0 else (None, None)


def _run_data_parallel(grid: Grid, strategy: str, spec: RunSpec, variant: int, bug: str | None):
    """DDP or the synchronous parameter server through the engine interface: (losses, final
    flat params) on rank 0, (None, None) elsewhere."""
    r, w = grid.rank, grid.size("dp")
    if strategy == "dp":
        cls = {"bucket skipped": SkippedBucket, "gradient dropped": DroppedGradient,
               "no 1/N": NoOneOverN}.get(bug, DataParallel)
        bucket = 4096 if bug else 1 if w <= 3 else BUCKETS[variant % len(BUCKETS)]
        eng = cls(grid, spec, bucket)
        assert bug != "bucket skipped" or len(eng.buckets) > 2, "the bug needs several buckets"
    else:
        servers = 2 if w >= 3 and variant % 2 else 1
        eng = (NoOneOverNServer if bug == "no 1/N" else ParameterServer)(grid, spec, servers, "sync")
        if not eng.is_server and bug == "gradient dropped" and eng.worker == eng.workers - 1:
            eng.model.loss_and_grads = _dropped(eng.model.loss_and_grads)
    losses = loop.train(eng, spec.batch_at, spec.steps).losses
    params = eng.full_params()
    if r != 0:
        return None, None
    return losses, FlatParams.like(params).flatten(params)


def _dropped(loss_and_grads: Any) -> Any:
    def zero_grads(*args: Any, **kwargs: Any) -> Any:
        loss, grads = loss_and_grads(*args, **kwargs)
        return loss, {k: np.zeros_like(g) for k, g in grads.items()}
    return zero_grads


# -- the sweep --------------------------------------------------------------------------------
def main() -> None:
    world = TracedComm(MPI.COMM_WORLD)
    R, N = world.rank, world.size
    assert N == 8, "the sweep runs on 8 ranks"
    t0 = time.perf_counter()
    cases = correct_cases() + [{"w": w, "strategy": s, "size": size, "seed": 0, "variant": 0,
                                "bug": bug} for w, s, bug, size in BROKEN]
    keys = sorted({(c["size"], c["seed"]) for c in cases})
    mine = {k: serial_reference(SIZES[k[0]].with_(seed=k[1])) for k in keys[R::N]}
    mine = {k: (v["losses"], v["params"]) for k, v in mine.items()}
    serial: dict = {}
    for part in world.comm.gather(mine, root=0) or []:  # reporting only (MPI pickles)
        serial.update(part or {})
    t_serial = time.perf_counter() - t0
    out = []
    for w in range(1, N + 1):
        sub = MPI.COMM_WORLD.Split(0 if R < w else MPI.UNDEFINED, R)
        if R < w:
            c = TracedComm(sub, stats=world.stats)
            for case in (k for k in cases if k["w"] == w):
                spec = SIZES[case["size"]].with_(seed=case["seed"])
                t = time.perf_counter()
                losses, params = run_case(c, case["strategy"], spec, case["variant"],
                                          case.get("bug"))
                if R == 0:
                    ser_losses, ser_params = serial[(case["size"], case["seed"])]
                    init = spec.initial_params()
                    theta0 = FlatParams.like(init).flatten(init)
                    v = compare(losses, ser_losses, params, ser_params, theta0)
                    out.append({**case, "bug": case.get("bug"), "steps": spec.steps,
                                "seconds": time.perf_counter() - t, "verdict": v.as_dict(),
                                "loss_diffs": [abs(a - b) for a, b in zip(losses, ser_losses)],
                                "loss_scale": max(abs(x) for x in ser_losses)})
            sub.Free()
        world.Barrier()  # polite: the idle ranks leave the cores to the working ones
    if R == 0:
        print("PARITY-SWEEP " + json.dumps({"cases": out, "serial_seconds": t_serial,
                                            "seconds": time.perf_counter() - t0}), flush=True)


main()
