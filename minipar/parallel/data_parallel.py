"""Data parallelism (DDP) — параллелизм по данным — 数据并行.

Li et al. 2020, "PyTorch Distributed: Experiences on Accelerating Data
Parallel Training", arXiv 2006.15704; Sergeev & Del Balso 2018, "Horovod",
arXiv 1802.05799.  Every rank holds a full replica of the model states; rank
r computes the gradients of its rows of the global batch
(:func:`minipar.parallel.common.local_rows`), weighted by b_r / B so that the
*sum* over ranks is the serial mean gradient, and the ranks sum them with a
ring all-reduce.  Then every rank takes the same optimizer step on the same
gradient: the replicas stay identical, and equal to the serial run.

**Buckets, overlapped with backward** (DDP's ``bucket_cap_mb``).  The
gradients are grouped, in *reverse* parameter order (the order backward
produces them: ``lm_head`` first, ``tok_emb`` last), into buckets of at least
``bucket_bytes`` bytes; a bucket is a contiguous span of the flat gradient
buffer.  As soon as a bucket's last gradient exists its ring all-reduce
starts, non-blocking (:mod:`minipar.collectives.nonblocking`), while backward
goes on with earlier layers; between the per-block backward computations the
rank calls ``progress()`` on the reductions in flight.  :class:`Timeline`
records, per rank, the compute intervals per piece and the communication
interval per bucket — the overlap, measured.

Formula the tests check (bytes per rank per step, S = Ψ x itemsize): each
bucket b of n_b elements costs its ring figure, so rank r sends exactly

    Σ_b ring_allreduce_bytes_sent(n_b, itemsize, N, r)  ≈  2(N-1)/N x S,

counted under ``"dp_grad_allreduce"`` (the loss, one number, under
``"dp_loss_allreduce"``).  This is the ZeRO paper's "2Ψ" per step for DP
(Rajbhandari et al. 2019, arXiv 1910.02054, §7: reduce-scatter Ψ + all-gather Ψ
elements, i.e. 2Ψ x (N-1)/N elements sent per rank on a ring).  Model states
per rank: the replica's (2 + 2 + K)Ψ bytes under mixed precision (K = 12).
"""

from __future__ import annotations

import argparse
import time
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from minipar.collectives import ring_allreduce
from minipar.collectives.cost import ring_allreduce_bytes_sent
from minipar.collectives.nonblocking import TAG_BASE, iallreduce
from minipar.comm.traced import TracedComm, traced
from minipar.nn.gpt import block_backward, embed_backward, head_backward, sub
from minipar.nn.loss import cross_entropy_backward, cross_entropy_forward
from minipar.optim import FlatParams
from minipar.parallel.common import RunSpec, check_world, local_rows, loss_weight
from minipar.precision import ModelStates

ALGORITHMS = ("ring", "mpi")
OP_GRADS = "dp_grad_allreduce"
OP_LOSS = "dp_loss_allreduce"
DEFAULT_BUCKET_MB = 25.0  # PyTorch DDP's bucket_cap_mb


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
    if not isinstance(bucket_bytes, (int, np.integer)) or bucket_bytes <= 0:
        raise ValueError(f"bucket size must be a positive number of bytes, got {bucket_bytes!r}")
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


def bucket_bytes_formula(buckets: list[Bucket], itemsize: int, world: int, rank: int) -> int:
    """Bytes rank ``rank`` sends per step: the exact ring figure summed over buckets."""
    return sum(ring_allreduce_bytes_sent(b.size, itemsize, world, rank) for b in buckets)


@dataclass
class Timeline:
    """One step on one rank, seconds from the step's start (after a barrier):
    ``compute`` = [(piece, t0, t1)], ``comm`` = [(bucket index, t0, t1)]."""

    rank: int
    compute: list[tuple[str, float, float]] = field(default_factory=list)
    comm: list[tuple[int, float, float]] = field(default_factory=list)

    def as_dict(self) -> dict[str, Any]:
        return {"rank": self.rank, "compute": self.compute, "comm": self.comm}


class DataParallel:
    """A DDP replica on this rank: ``train_step(step) -> global loss`` (same on every rank).

    ``comm``: a TracedComm (or plain communicator) over the data-parallel ranks;
    ``bucket_bytes``: bucket capacity in bytes; ``algorithm``: ``"ring"`` (ours) or
    ``"mpi"`` (MPI's Iallreduce); ``overlap``: start each bucket during backward
    (True) or all of them after backward (False).  Every argument is checked on
    every rank before any message.
    """

    def __init__(self, comm: Any, spec: RunSpec, bucket_bytes: int = int(DEFAULT_BUCKET_MB * 2**20),
                 algorithm: str = "ring", overlap: bool = True) -> None:
        if algorithm not in ALGORITHMS:
            raise ValueError(f"unknown data-parallel algorithm {algorithm!r}; one of {', '.join(ALGORITHMS)}")
        self.comm: TracedComm = traced(comm)
        self.rank, self.world = self.comm.rank, self.comm.size
        check_world(spec.batch, self.world)
        self.spec, self.algorithm, self.overlap = spec, algorithm, bool(overlap)
        self.model = spec.model()
        self.states = ModelStates(spec.precision, spec.initial_params(), spec.optimizer,
                                  **spec.opt_kwargs())
        self.layout = self.states.layout
        self.itemsize = self.states.grads.itemsize
        self.buckets = make_buckets(self.layout, bucket_bytes, self.itemsize)
        self.rows = local_rows(spec.batch, self.rank, self.world)
        self.weight = loss_weight(spec.batch, self.rank, self.world)
        self.timelines: list[Timeline] = []

    # -- one step -------------------------------------------------------------
    def _backward_pieces(self, params: dict[str, Any], cache: dict[str, Any], dlogits: Any):
        """Yield (piece name, {param name: grad}) in backward order, as GPT.loss_and_grads runs them."""
        dx, g = head_backward(cache["head"], dlogits)
        yield "head", g
        for i in reversed(range(self.model.cfg.n_layer)):
            prefix = f"blocks.{i}."
            dx, g = block_backward(sub(params, prefix), cache["blocks"][i], dx)
            yield f"block {i}", {prefix + k: v for k, v in g.items()}
        yield "embed", embed_backward(cache["embed"], dx)

    def train_step(self, step: int) -> float:
        """Forward, bucketed and overlapped backward + all-reduce, optimizer step."""
        c, st = self.comm, self.states
        c.Barrier()  # align the ranks' clocks for the timeline (not counted as gradient bytes)
        t0 = time.perf_counter()
        tl = Timeline(self.rank)
        x, y = self.spec.local_batch(step, self.rank, self.world)
        params = st.param_views()
        logits, cache = self.model.forward(params, x)
        loss, s_ce = cross_entropy_forward(logits, y)
        dlogits = cross_entropy_backward(s_ce, self.weight * st.loss_scale)
        tl.compute.append(("forward", 0.0, time.perf_counter() - t0))
        grad_views = self.layout.unflatten(st.grads)
        ready: set[str] = set()
        inflight: list[Any] = []
        next_bucket = 0
        t_piece = time.perf_counter()
        for piece, grads in self._backward_pieces(params, cache, dlogits):
            for name, g in grads.items():
                grad_views[name][...] = g
            ready.update(grads)
            tl.compute.append((piece, t_piece - t0, time.perf_counter() - t0))
            while (self.overlap and next_bucket < len(self.buckets)
                   and ready.issuperset(self.buckets[next_bucket].names)):
                inflight.append(self._start(self.buckets[next_bucket]))
                next_bucket += 1
            for req in inflight:
                req.progress()
            t_piece = time.perf_counter()
        for b in self.buckets[next_bucket:]:  # overlap=False: all buckets now
            inflight.append(self._start(b))
        for req in inflight:
            req.wait()
        for b, req in zip(self.buckets, inflight):
            tl.comm.append((b.index, req.t_start - t0, req.t_end - t0))
        t_opt = time.perf_counter()
        st.step(found_inf=st.local_found_inf() if st.scaler else None)  # grads equal on all ranks
        tl.compute.append(("optimizer", t_opt - t0, time.perf_counter() - t0))
        self.timelines.append(tl)
        with c.operation(OP_LOSS):
            total = ring_allreduce(c, np.array([self.weight * loss]))
        return float(total[0])

    def _start(self, b: Bucket) -> Any:
        buf = self.states.grads[b.lo:b.hi]
        return iallreduce(self.comm, buf, TAG_BASE + b.index, self.algorithm,
                          name=OP_GRADS if self.algorithm == "ring" else "mpi_" + OP_GRADS)

    def train(self) -> list[float]:
        """``spec.steps`` steps; the global losses."""
        return [self.train_step(s) for s in range(self.spec.steps)]

    # -- evidence -------------------------------------------------------------
    def bytes_formula(self) -> int:
        """Exact bytes this rank sends per step (sum of the buckets' ring figures)."""
        return bucket_bytes_formula(self.buckets, self.itemsize, self.world, self.rank)

    def bytes_sent_per_step(self) -> float:
        """Bytes this rank sent in gradient all-reduces, per step (counted)."""
        return self.comm.stats.bytes_sent(OP_GRADS) / max(1, len(self.timelines))


def replica_model_state_bytes(psi: int, precision: str, optimizer: str = "adamw") -> int:
    """Bytes of one full replica's model states: params + grads + optimizer states.

    Mixed precision with Adam: (2 + 2 + K)Ψ, K = 12 (ZeRO's 16Ψ); float64 with Adam:
    (8 + 8 + 16)Ψ.  The formula :mod:`minipar.precision` measures."""
    from minipar.precision import get

    pol = get(precision)
    moments = (2 if optimizer == "adamw" else 1) * pol.state_dtype.itemsize
    master = pol.master_dtype.itemsize if pol.master_dtype is not None else 0
    return psi * (2 * pol.param_dtype.itemsize + moments + master)


# ---------------------------------------------------------------- minipar run dp
def add_run_arguments(parser: argparse.ArgumentParser) -> None:
    from minipar.parallel.common import add_model_arguments

    add_model_arguments(parser)
    g = parser.add_argument_group("data parallelism")
    g.add_argument("--bucket-mb", type=float, default=DEFAULT_BUCKET_MB,
                   help=f"bucket capacity in MiB (default {DEFAULT_BUCKET_MB:g}, as PyTorch DDP)")
    g.add_argument("--bucket-bytes", type=int, default=None, help="bucket capacity in bytes (overrides --bucket-mb)")
    g.add_argument("--algorithm", default="ring", help="ring (from scratch) or mpi (MPI's Iallreduce)")
    g.add_argument("--no-overlap", action="store_true", help="all-reduce every bucket after backward")


def bucket_bytes_option(options: dict[str, Any]) -> int:
    """Bucket capacity in bytes from ``--bucket-bytes`` or ``--bucket-mb``; ValueError if <= 0."""
    if options.get("bucket_bytes") is not None:
        b = options["bucket_bytes"]
    else:
        mb = float(options.get("bucket_mb", DEFAULT_BUCKET_MB))
        if not mb > 0:
            raise ValueError(f"bucket size must be > 0 MiB, got {mb}")
        b = max(1, int(mb * 2**20))
    if not isinstance(b, int) or b <= 0:
        raise ValueError(f"bucket size must be a positive number of bytes, got {b!r}")
    return b


def run_worker(options: dict[str, Any]) -> dict[str, Any] | None:
    """Train ``--steps`` steps with DDP; the summary of :mod:`minipar.run` on rank 0."""
    from minipar.parallel.common import max_abs_diff, parity, serial_reference

    spec = RunSpec.from_options(options)
    dp = DataParallel(TracedComm(), spec, bucket_bytes_option(options),
                      options.get("algorithm", "ring"), not options.get("no_overlap", False))
    losses = dp.train()
    held = sum(dp.states.bytes_by_category().values())
    mine = (dp.bytes_sent_per_step(), dp.bytes_formula(), held, dp.timelines[-1].as_dict())
    everyone = dp.comm.comm.gather(mine, root=0)  # reporting only: MPI's pickled gather
    if dp.rank != 0:
        return None
    serial = serial_reference(spec)
    psi = dp.layout.size
    S = psi * dp.itemsize
    N = dp.world
    return {
        "strategy": "dp", "ranks": N, "steps": spec.steps, "psi": psi,
        "losses": losses, "serial_losses": serial["losses"],
        "parity_expected": spec.precision == "float64",
        "parity": parity(losses, serial["losses"], dp.states.params, serial["params"]),
        "max_param_diff": max_abs_diff(dp.states.params, serial["params"]),
        "bytes_sent_per_rank": [e[0] for e in everyone],
        "bytes_exact_per_rank": [e[1] for e in everyone],
        "bytes_formula": 2 * (N - 1) / N * S,
        "bytes_formula_text": f"2(N-1)/N x S (S = Ψ x {dp.itemsize} B = {S:,} B)",
        "model_state_bytes_per_rank": [e[2] for e in everyone],
        "model_state_formula": replica_model_state_bytes(psi, spec.precision, spec.optimizer),
        "model_state_formula_text": ("(2+2+K)Ψ, K = 12" if spec.precision.startswith("mixed")
                                     else f"params + grads + optimizer states of {spec.precision}"),
        "buckets": [list(b.names) for b in dp.buckets],
        "timeline": [e[3] for e in everyone],
        "notes": [f"Ψ = {psi:,} parameters in {len(dp.buckets)} bucket(s), algorithm "
                  f"{dp.algorithm}, overlap {'on' if dp.overlap else 'off'}; "
                  f"exact ring bytes per rank (sum over buckets): "
                  + ", ".join(f"{e[1]:,}" for e in everyone)],
    }
