"""Data parallelism, measured: bytes and model states next to their formulas, and the
overlap of the gradient all-reduce with backward, measured and rebuilt with a separate link.

EN computation-communication overlap · RU перекрытие вычислений и обмена · ZH 计算与通信重叠

The formulas of a DDP replica (:mod:`minipar.parallel.data_parallel.ddp`,
:mod:`~minipar.parallel.data_parallel.engine`):
:func:`bucket_bytes_formula` (bytes a rank sends per step: each bucket's
all-reduce's exact figure, summed), :func:`bytes_formula` (the same for one
engine's buckets and algorithms) and :func:`replica_model_state_bytes` (one
full replica's params, grads and optimizer states).

DDP starts a bucket's all-reduce as soon as backward has produced the
bucket's last gradient, so the buckets of the last layers travel while the
first layers still compute (Li et al. 2020, "PyTorch Distributed", arXiv
2006.15704, §3.2.3 and Fig. 3).  That buys time only when *something else*
moves the bytes: a NIC with its own DMA engines, NVLink, NCCL kernels on
spare streaming multiprocessors.  Here every rank is a Python process and the
"link" is shared memory copied by the same CPU cores that run backward; with
more busy processes than cores the transfer and the computation take turns on
a core, and the non-blocking ring advances only when a rank calls
``progress()`` between units.  So this module gives two views of one step:

* :func:`measure_overlap` (rank side, launched as ``minipar.bench.dp_overlap``
  through :func:`minipar.launch.run_json`): the step time of
  DDP with and without overlap, the two steps alternating ``repeats`` times in
  one launch so both see the same load; the last step's timelines; and α, β of
  this machine's ring all-reduce.
* :func:`separate_link` (pure): the measured compute of one rank replayed
  with the all-reduces moved onto a link of their own, costed by the α-β
  (Hockney) model (Thakur, Rabenseifner & Gropp 2005, IJHPCA 19(1)): a ring
  all-reduce of S bytes on N ranks sends 2(N-1) messages of S/N bytes in
  sequence, so

      t_ring(S) = 2(N-1)·α + 2(N-1)/N · S / β.

  Each bucket starts when the backward unit that completes it ends
  (:func:`completing_pieces`) and the link is free (one bucket at a time, in
  order); the optimizer starts when backward is done and the last bucket has
  arrived.  Without overlap every bucket waits for the end of backward.

:func:`fit_alpha_beta` solves the model for α and β from two measured
all-reduce times (a tiny message: nearly all α; the whole gradient: mostly
S/β).  On a loaded machine the two times can come out in the wrong order (a
descheduled rank makes the 16-byte all-reduce the slower one): then
:func:`measure_overlap` still returns the measurement, with α and β None and
the reason in ``fit_error``, rather than failing the whole run.  The tests
check the model's arithmetic, the placement rule and that
the measured overlap-on and overlap-off runs give bit-identical losses.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from minipar import checks

if TYPE_CHECKING:
    from minipar.parallel.data_parallel.ddp import Bucket
    from minipar.parallel.data_parallel.engine import DataParallel

#: ``engine.Timeline.as_dict()``: {"rank", "compute": [(piece, t0, t1)], "comm": [(bucket, t0, t1)]}
TimelineDict = Mapping[str, Any]


# ---------------------------------------------------------------------- formulas
def bucket_bytes_formula(buckets: list[Bucket], itemsize: int, world: int, rank: int,
                         algorithms: str | Sequence[str] = "ring") -> int:
    """Bytes rank ``rank`` sends per step: the exact figure of each bucket's algorithm, summed.

    ``algorithms``: one name for every bucket (``"auto"`` chooses per bucket) or one
    name per bucket.  ``"mpi"`` counts as the ring: MPI does not tell its own bytes,
    and the ring's is the figure it is compared with."""
    from minipar.collectives.cost import allreduce_bytes_sent

    names = [algorithms] * len(buckets) if isinstance(algorithms, str) else list(algorithms)
    if len(names) != len(buckets):
        raise ValueError(f"{len(names)} algorithms for {len(buckets)} buckets")
    return sum(allreduce_bytes_sent(b.size, itemsize, world, rank, "ring" if a == "mpi" else a)
               for b, a in zip(buckets, names))


def bytes_formula(dp: DataParallel) -> int:
    """Exact bytes ``dp``'s rank sends per step: each bucket's algorithm's figure, summed."""
    return bucket_bytes_formula(dp.buckets, dp.itemsize, dp.world, dp.rank, dp.bucket_algorithms)


def replica_model_state_bytes(psi: int, precision: str, optimizer: str = "adamw") -> int:
    """Bytes of one full replica's model states: params + grads + optimizer states.

    Mixed precision with Adam: (2 + 2 + K)Ψ, K = 12 (ZeRO's 16Ψ); float64 with Adam:
    (8 + 8 + 16)Ψ.  The formula :mod:`minipar.precision` measures."""
    from minipar.precision import get

    pol = get(precision)
    moments = (2 if optimizer == "adamw" else 1) * pol.state_dtype.itemsize
    master = pol.master_dtype.itemsize if pol.master_dtype is not None else 0
    return psi * (2 * pol.param_dtype.itemsize + moments + master)


# ---------------------------------------------------------------------- overlap, rebuilt


def ring_seconds(nbytes: float, world: int, alpha: float, beta: float) -> float:
    """α-β cost of a ring all-reduce of ``nbytes`` bytes on ``world`` ranks, in seconds:
    2(N-1)·α + 2(N-1)/N · nbytes / β (α in s, β in bytes/s); 0 on one rank."""
    checks.integer("world size", world, 1)
    if nbytes < 0 or alpha < 0 or not beta > 0:
        raise ValueError(f"need nbytes >= 0, alpha >= 0 and beta > 0, got {nbytes}, {alpha}, "
                         f"{beta}")
    if world == 1:
        return 0.0
    return 2 * (world - 1) * alpha + 2 * (world - 1) / world * nbytes / beta


def fit_alpha_beta(small: tuple[float, float], large: tuple[float, float],
                   world: int) -> tuple[float, float]:
    """(α seconds, β bytes/s) of :func:`ring_seconds` through two measured points
    ``(nbytes, seconds)``: the small message fixes α, the difference fixes β."""
    (s0, t0), (s1, t1) = small, large
    if world < 2 or not s1 > s0 >= 0:
        raise ValueError(f"need 2+ ranks and a large message bigger than the small one, got "
                         f"world {world}, sizes {s0}, {s1}")
    if not t1 > t0 > 0:
        raise ValueError(f"the {s1:,.0f}-byte all-reduce ({t1:.2e} s) was not slower than the "
                         f"{s0:,.0f}-byte one ({t0:.2e} s): too noisy to fit, measure again")
    f = 2 * (world - 1) / world
    beta = f * (s1 - s0) / (t1 - t0)
    alpha = max(0.0, (t0 - f * s0 / beta) / (2 * (world - 1)))
    return alpha, beta


def completing_pieces(buckets: Sequence[Sequence[str]],
                      units: Sequence[tuple[str, Sequence[str]]]) -> list[str]:
    """For each bucket (its parameter names), the backward piece after which all its
    gradients exist.  ``units``: (piece name, parameter full names) in *forward* order;
    backward runs them in reverse, so it is the bucket's unit that comes first forward."""
    where = {n: i for i, (_, names) in enumerate(units) for n in names}
    out = []
    for b, names in enumerate(buckets):
        missing = [n for n in names if n not in where]
        if missing or not names:
            raise ValueError(f"bucket {b} names parameters of no unit: {missing or 'none at all'}")
        out.append(units[min(where[n] for n in names)][0])
    return out


def separate_link(timeline: TimelineDict, ready_after: Sequence[str],
                  bucket_bytes: Sequence[float], world: int, alpha: float, beta: float,
                  overlap: bool = True) -> dict[str, Any]:
    """One rank's step rebuilt as if the all-reduces ran on a link with its own hardware.

    The measured compute pieces keep their times (take them from a run *without*
    overlap: nothing else was interleaved with them); bucket b starts at
    max(end of piece ``ready_after[b]`` — or of all backward without ``overlap`` —,
    end of bucket b-1) and lasts :func:`ring_seconds`; the optimizer, as long as
    measured, starts when backward and the last bucket are done.  Returns a
    timeline (``rank``, ``compute``, ``comm``) and ``step_s``, the step's length."""
    if len(ready_after) != len(bucket_bytes):
        raise ValueError(f"{len(ready_after)} completing pieces for {len(bucket_bytes)} buckets")
    pieces = [tuple(p) for p in timeline["compute"] if p[0] != "optimizer"]
    optimizer = [tuple(p) for p in timeline["compute"] if p[0] == "optimizer"]
    if not pieces or len(optimizer) != 1:
        raise ValueError("the timeline needs compute pieces and exactly one 'optimizer' piece")
    end = {name: t1 for name, _, t1 in pieces}
    unknown = sorted(set(ready_after) - set(end))
    if unknown:
        raise ValueError(f"no compute piece named {', '.join(map(repr, unknown))} in the timeline")
    backward_end = max(t1 for _, _, t1 in pieces)
    comm, link_free = [], 0.0
    for b, (piece, nbytes) in enumerate(zip(ready_after, bucket_bytes)):
        t0 = max(end[piece] if overlap else backward_end, link_free)
        link_free = t0 + ring_seconds(nbytes, world, alpha, beta)
        comm.append((b, t0, link_free))
    _, o0, o1 = optimizer[0]
    start = max(backward_end, link_free)
    compute = pieces + [("optimizer", start, start + (o1 - o0))]
    return {"rank": timeline.get("rank", 0), "compute": compute, "comm": comm,
            "step_s": start + (o1 - o0)}


# ---------------------------------------------------------------------- rank side
def _median_allreduce_seconds(comm: Any, nbytes: int, repeats: int) -> float:
    """Median seconds (slowest rank) of a blocking ring all-reduce of ``nbytes`` float64 bytes."""
    from mpi4py import MPI

    from minipar.backend import synchronize, xp
    from minipar.collectives.ring import ring_allreduce

    x = xp.ones(max(1, nbytes // 8))  # where DDP's buckets live (device memory on a GPU)
    times = []
    for _ in range(repeats + 1):  # the first one warms up
        comm.Barrier()
        t0 = time.perf_counter()
        ring_allreduce(comm, x)
        synchronize()  # the device's queued work done before the clock is read
        times.append(comm.comm.allreduce(time.perf_counter() - t0, op=MPI.MAX))  # reporting only
    return statistics.median(times[1:])


def measure_overlap(grid: Any, spec: Any, bucket_bytes: int, repeats: int = 5,
                    algorithm: str = "ring") -> dict[str, Any] | None:
    """Rank side: DDP with and without overlap on ``grid`` (dp ranks), alternating
    ``repeats`` times; rank 0 returns
    ``step_s`` {"overlap": [...], "no_overlap": [...]} (seconds, slowest rank, after one
    warm-up step each), ``timeline`` (every rank's last step, per mode), ``buckets``
    (names), ``bucket_bytes``, ``ready_after``, ``alpha_s``, ``beta_bytes_per_s``,
    ``allreduce_s`` (the two measured points), ``losses_equal`` (bit for bit).
    ``alpha_s`` and ``beta_bytes_per_s`` are None when the two points cannot be
    fitted (the large message not slower: timing noise), ``fit_error`` says why
    (None when they were fitted)."""
    from mpi4py import MPI

    from minipar.parallel.data_parallel.engine import DataParallel

    checks.integer("repeats", repeats, 1)
    engines = {"overlap": DataParallel(grid, spec, bucket_bytes, algorithm, overlap=True),
               "no_overlap": DataParallel(grid, spec, bucket_bytes, algorithm, overlap=False)}
    comm = grid.comm("dp")
    losses: dict[str, list[float]] = {k: [] for k in engines}
    step_s: dict[str, list[float]] = {k: [] for k in engines}
    for r in range(repeats + 1):
        order = list(engines) if r % 2 == 0 else list(reversed(engines))  # neither always first
        batch = spec.batch_at(r)
        for mode in order:
            comm.Barrier()
            t0 = time.perf_counter()
            losses[mode].append(engines[mode].step(batch).loss)
            dt = comm.comm.allreduce(time.perf_counter() - t0, op=MPI.MAX)  # reporting only
            if r > 0:
                step_s[mode].append(dt)
    dp = engines["overlap"]
    S = dp.layout.size * dp.itemsize
    small, large = 8 * dp.world, S
    points = [(small, _median_allreduce_seconds(dp.comm, small, 5)),
              (large, _median_allreduce_seconds(dp.comm, large, 5))]
    alpha: float | None
    beta: float | None
    fit_error = None
    try:
        alpha, beta = (fit_alpha_beta(points[0], points[1], dp.world) if dp.world > 1
                       else (0.0, 1.0))
    except ValueError as e:  # noise, not a bad argument: the sizes are ours (small < large)
        alpha, beta, fit_error = None, None, str(e)
    timelines = {k: e.timelines[-1].as_dict() for k, e in engines.items()}
    everyone = dp.comm.comm.gather(timelines, root=0)  # reporting only: MPI's pickled gather
    if dp.rank != 0:
        return None
    units = [(u.name, u.full_names) for u in dp.model.units()]
    names = [list(b.names) for b in dp.buckets]
    return {"world": dp.world, "psi": dp.layout.size, "itemsize": dp.itemsize,
            "algorithm": algorithm, "buckets": names,
            "bucket_bytes": [b.size * dp.itemsize for b in dp.buckets],
            "ready_after": completing_pieces(names, units),
            "step_s": step_s, "timeline": {k: [e[k] for e in everyone] for k in engines},
            "alpha_s": alpha, "beta_bytes_per_s": beta, "fit_error": fit_error,
            "allreduce_s": points,
            "losses_equal": losses["overlap"] == losses["no_overlap"]}
