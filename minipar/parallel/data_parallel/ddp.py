"""Data parallelism (DDP) — параллелизм по данным — 数据并行.

Li et al. 2020, "PyTorch Distributed: Experiences on Accelerating Data
Parallel Training", arXiv 2006.15704; Sergeev & Del Balso 2018, "Horovod",
arXiv 1802.05799.  Every rank holds a full replica of the model states; rank
r computes the gradients of its rows of the global batch (:func:`local_batch`),
weighted by b_r / B so that the *sum* over ranks is the serial mean gradient,
and the ranks sum them with an all-reduce.  Then every rank takes the same
optimizer step on the same gradient: the replicas stay identical, and equal
to the serial run.  Read in this order:

1. :func:`local_batch` — this rank's rows and their weight b_r / B;
2. :class:`Bucket`, :func:`make_buckets` — the gradients grouped, in *reverse*
   parameter order (the order backward produces them: ``lm_head`` first,
   ``tok_emb`` last), into buckets of at least ``bucket_bytes`` bytes (DDP's
   ``bucket_cap_mb``); a bucket is a contiguous span of the flat gradient
   buffer, so its all-reduce needs no copy;
3. :func:`start_allreduce` — one bucket's all-reduce, started: the
   non-blocking ring (:mod:`minipar.collectives.nonblocking`, a state machine
   that ``progress()`` advances), MPI's ``Iallreduce``, or a blocking
   recursive doubling, done when it returns;
4. :class:`DDPHooks` — the units executor's hooks (:mod:`minipar.nn.executor`):
   ``on_grads`` writes a unit's gradients into the flat buffer and, as soon as
   a bucket's last gradient exists, starts its all-reduce while backward goes
   on with earlier units (**the overlap**), then calls ``progress()`` on the
   reductions in flight; ``finish_grad_sync`` starts the rest and waits for all;
5. :func:`ddp_step` — forward, the overlapped backward, wait for every
   bucket, the optimizer.

MoE blocks need nothing extra: the executor adds their auxiliary loss and
scales its gradient like the loss's.

Formula the tests check (bytes per rank per step, S = Ψ x itemsize): each
bucket b of n_b elements costs the exact figure of the algorithm a_b it ran,
so rank r sends exactly

    Σ_b allreduce_bytes_sent(n_b, itemsize, N, r, a_b)       (measure.bytes_formula(dp))

counted under ``"dp_grad_allreduce"``.  With the ring on every bucket that is
≈ 2(N-1)/N x S, the ZeRO paper's "2Ψ" per step for DP (Rajbhandari et al.
2019, arXiv 1910.02054, §7: reduce-scatter Ψ + all-gather Ψ elements, i.e.
2Ψ x (N-1)/N elements sent per rank on a ring); recursive doubling sends
log2 N x S_b per bucket when N is a power of two (S_b on 2 ranks, as the ring).

The engine around it (which algorithm each bucket runs, timelines, state)
is :mod:`minipar.parallel.data_parallel.engine`.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from minipar import checks
from minipar.collectives.nonblocking import TAG_BASE, BlockingAllreduceRequest, iallreduce
from minipar.nn import executor
from minipar.optim import FlatParams
from minipar.parallel.common import local_rows
from minipar.parallel.engine import Batch
from minipar.precision import ModelStates

OP_GRADS = "dp_grad_allreduce"


def local_batch(batch: Batch, rank: int, world: int) -> tuple[Any, Any, float]:
    """Rank ``rank``'s rows of the global ``batch`` (:func:`~minipar.parallel.common.local_rows`)
    and their weight b_r / B: each rank's mean loss times b_r / B, summed over the ranks, is
    the mean over all B rows, even when the rows do not split evenly."""
    lo, hi = local_rows(batch.size, rank, world)
    # copies: a view of the rows would keep the whole global batch alive
    return batch.tokens[lo:hi].copy(), batch.targets[lo:hi].copy(), (hi - lo) / batch.size


@dataclass(frozen=True)
class Bucket:
    """Gradients reduced together: ``names`` (reverse parameter order) = flat span [lo, hi)."""

    index: int
    names: tuple[str, ...]
    lo: int
    hi: int

    @property
    def size(self) -> int:
        return self.hi - self.lo


def make_buckets(layout: FlatParams, bucket_bytes: int, itemsize: int) -> list[Bucket]:
    """Walk the parameters from last to first, closing a bucket once it holds
    >= ``bucket_bytes`` bytes (a parameter is never split).  ``bucket_bytes = 1``: one
    parameter per bucket; more than the model: one bucket for all."""
    checks.integer("bucket size", bucket_bytes, 1, why="bytes")
    buckets: list[Bucket] = []
    names: list[str] = []
    hi = layout.size
    lo = hi
    for name in reversed(layout.names):
        names.append(name)
        lo = layout.span(name)[0]
        if (hi - lo) * itemsize >= bucket_bytes:
            buckets.append(Bucket(len(buckets), tuple(names), lo, hi))
            names, hi = [], lo
    if names:
        buckets.append(Bucket(len(buckets), tuple(names), lo, hi))
    return buckets


def start_allreduce(comm: Any, grads: Any, b: Bucket, algorithm: str) -> Any:
    """Start the sum of bucket ``b``'s span of the flat ``grads`` over the ranks, in place: a
    request in flight (``"ring"``, ``"mpi"``: tag ``TAG_BASE + b.index``, one per bucket) or
    one already done (``"recursive_doubling"``: blocking, for a small latency-bound bucket)."""
    buf = grads[b.lo:b.hi]
    if algorithm == "recursive_doubling":
        return BlockingAllreduceRequest(comm, buf, algorithm, name=OP_GRADS)
    return iallreduce(comm, buf, TAG_BASE + b.index, algorithm,
                      name=OP_GRADS if algorithm == "ring" else "mpi_" + OP_GRADS)


class DDPHooks(executor.Hooks):
    """The executor's hooks for one DDP step: parameters are views of the replica's flat
    buffer; a unit's gradients go into the flat gradient buffer ``grads``, and every bucket
    whose gradients are all there starts its all-reduce (buckets in order, as backward
    fills them).  ``start(bucket) -> request``: :func:`start_allreduce` on this replica's
    buffer; ``overlap=False`` starts nothing before :meth:`finish_grad_sync`."""

    def __init__(self, views: dict[str, Any], grads: Any, layout: FlatParams,
                 buckets: Sequence[Bucket], start: Callable[[Bucket], Any],
                 overlap: bool = True) -> None:
        super().__init__(views)
        self.grad_views = layout.unflatten(grads)
        self.buckets, self.start, self.overlap = buckets, start, overlap
        self.ready: set[str] = set()
        self.inflight: list[Any] = []  # one request per started bucket, in bucket order

    def on_grads(self, unit: Any, grads: dict[str, Any]) -> None:
        for k, g in grads.items():
            self.grad_views[unit.prefix + k][...] = g
        self.ready.update(unit.full_names)
        buckets = self.buckets
        while (self.overlap and len(self.inflight) < len(buckets)
               and self.ready.issuperset(buckets[len(self.inflight)].names)):
            self.inflight.append(self.start(buckets[len(self.inflight)]))
        for req in self.inflight:
            req.progress()

    def finish_grad_sync(self) -> None:
        """Start the buckets not started yet (all of them without overlap) and wait for all."""
        for b in self.buckets[len(self.inflight):]:
            self.inflight.append(self.start(b))
        for req in self.inflight:
            req.wait()


def ddp_step(units: Sequence[Any], hooks: DDPHooks, states: ModelStates, x: Any, y: Any,
             weight: float, walk: executor.Hooks | None = None,
             records: list[Any] | None = None) -> tuple[float, bool]:
    """One DDP step on this rank's rows ``x``, ``y`` (weight b_r / B): forward, backward with
    ``hooks`` (the buckets' all-reduces start as it goes), wait for every bucket, the
    optimizer step.  Returns this rank's loss (unweighted) and whether the step was taken
    (False: a mixed-fp16 overflow, alike on every rank: the gradients are equal).

    The gradients are those of b_r / B x loss, so the all-reduce's *sum* is the serial
    mean: no division after it.  ``walk``: the hooks the executor runs (``hooks``, or
    ``hooks`` wrapped by remat / offload, which pass the gradients on); ``records``: the
    executor's ``(what, unit, t0, t1)`` of each unit."""
    loss = executor.loss_and_grads(units, hooks if walk is None else walk, x, y,
                                   weight * states.loss_scale, records)
    hooks.finish_grad_sync()
    done = states.step(found_inf=states.local_found_inf() if states.scaler else None)
    return loss, done
