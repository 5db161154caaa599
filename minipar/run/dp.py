"""``minipar run dp``: data parallelism (DDP), its options and its measurements.

EN data parallelism · RU параллелизм по данным · ZH 数据并行

Launcher side: the bucket and algorithm options and their checks.  Rank
side (:mod:`minipar.run.worker` trains the engine): :func:`grid_sizes` (every
rank on the dp axis), :func:`engine_options` (the keywords of
:class:`minipar.parallel.data_parallel.engine.DataParallel`, Li et al. 2020, PyTorch
DDP, arXiv 2006.15704: gradient buckets all-reduced as backward fills them)
and :func:`report`, which gathers, per rank, the bytes sent per step next to
the exact figure of what each bucket ran and the ring's 2(N-1)/N x S (the
paper's figure), the model-state bytes held and the timeline.  ``--algorithm auto`` (the default)
runs each bucket by what the α–β–γ model says is faster for its size on N
ranks: the overlapped ring (from a few hundred KB up) or blocking recursive
doubling (a note lists which bucket ran which, and the model's times).
``--remat [K]`` and ``--offload host|disk`` wrap each step's DDP hooks
(:mod:`minipar.run.remat_offload`).
"""

from __future__ import annotations

import argparse
from typing import Any

from minipar.cli.options import integer, number

#: the all-reduce algorithms of :class:`~minipar.parallel.data_parallel.engine.DataParallel`
#: (its ``ALGORITHMS``; repeated here because importing it would start MPI; a test
#: checks that the two agree)
ALGORITHMS = ("auto", "ring", "mpi")
DEFAULT_BUCKET_MB = 25.0  # PyTorch DDP's bucket_cap_mb


def add_arguments(parser: argparse.ArgumentParser) -> None:
    g = parser.add_argument_group("data parallelism")
    g.add_argument("--bucket-mb", type=number(greater_than=0), default=DEFAULT_BUCKET_MB,
                   help=f"bucket capacity in MiB (default {DEFAULT_BUCKET_MB:g}, as PyTorch DDP)")
    g.add_argument("--bucket-bytes", type=integer(1), default=None,
                   help="bucket capacity in bytes (overrides --bucket-mb)")
    g.add_argument("--algorithm", choices=ALGORITHMS, default="auto",
                   help="auto (per bucket, the alpha-beta-gamma model's pick: overlapped ring "
                        "or blocking recursive doubling; default), ring (every bucket "
                        "overlapped), mpi (MPI's Iallreduce)")
    g.add_argument("--no-overlap", action="store_true",
                   help="all-reduce every bucket after backward")
    from minipar.run import remat_offload

    remat_offload.add_arguments(parser)


def check(options: dict[str, Any], spec: Any) -> None:
    """Launcher side: every rank needs a row of the batch; a bucket holds >= 1 byte."""
    from minipar.parallel.common import check_world

    check_world(spec.batch, options["ranks"])
    bucket_bytes_option(options)
    from minipar.run import remat_offload

    remat_offload.check(options, spec)


def bucket_bytes_option(options: dict[str, Any]) -> int:
    """Bucket capacity in bytes from ``--bucket-bytes`` or ``--bucket-mb``; ValueError if <= 0."""
    from minipar import checks

    if options.get("bucket_bytes") is not None:
        return checks.integer("--bucket-bytes", options["bucket_bytes"], 1)
    mb = checks.real("--bucket-mb", options.get("bucket_mb", DEFAULT_BUCKET_MB), greater_than=0)
    return max(1, int(mb * 2**20))


def grid_sizes(options: dict[str, Any], spec: Any) -> dict[str, int]:
    """Every rank a data-parallel replica."""
    return {"dp": options["ranks"]}


def engine_options(options: dict[str, Any], spec: Any) -> dict[str, Any]:
    """:class:`~minipar.parallel.data_parallel.engine.DataParallel`'s keywords: buckets,
    algorithm, overlap, and the remat / offload wrapper of its hooks."""
    from minipar.run import remat_offload

    return {"bucket_bytes": bucket_bytes_option(options),
            "algorithm": options.get("algorithm", "auto"),
            "overlap": not options.get("no_overlap", False),
            "wrap_hooks": remat_offload.wrapper(options)}


def report(dp: Any, grid: Any, options: dict[str, Any], spec: Any,
           history: Any) -> dict[str, Any] | None:
    """Rank side, after training: every rank's bytes per step next to the exact figure of
    what each bucket ran and the ring's 2(N-1)/N x S, the model-state bytes held and the
    last step's timeline; rank 0 returns them (None elsewhere)."""
    from minipar.parallel.common import OP_FP8_AMAX
    from minipar.parallel.data_parallel.measure import bytes_formula, replica_model_state_bytes
    from minipar.run import remat_offload

    held = sum(dp.memory().values())
    amax = dp.comm.stats.bytes_sent(OP_FP8_AMAX) / max(1, len(dp.timelines))
    mine = (dp.bytes_sent_per_step(), bytes_formula(dp), held, dp.timelines[-1].as_dict(),
            amax)
    everyone = dp.comm.comm.gather(mine, root=0)  # reporting only: MPI's pickled gather
    memory, memory_notes = remat_offload.summary_notes(dp.wrap_hooks)
    if dp.rank != 0:
        return None
    psi, n = dp.layout.size, dp.world
    S = psi * dp.itemsize
    return {
        "ranks": n, "data_parallel_ranks": n, "psi": psi,
        "headline": headline(everyone[0][0], 2 * (n - 1) / n * S, dp.algorithm,
                             dp.bucket_algorithms),
        "bytes_sent_per_rank": [e[0] for e in everyone],
        "bytes_exact_per_rank": [e[1] for e in everyone],
        "bytes_exact_text": ("MPI's Iallreduce: the ring's figure, for comparison"
                             if dp.algorithm == "mpi" else "sum over buckets of " + " + ".join(
                                 f"{dp.bucket_algorithms.count(a)} x {a.replace('_', ' ')}"
                                 for a in dict.fromkeys(dp.bucket_algorithms))),
        "bytes_counted": dp.algorithm != "mpi",
        "bytes_formula": 2 * (n - 1) / n * S,
        "bytes_formula_text": f"2(N-1)/N x S, the ring's (S = Ψ x {dp.itemsize} B = {S:,} B)",
        "model_state_bytes_per_rank": [e[2] for e in everyone],
        "model_state_formula": replica_model_state_bytes(psi, spec.precision, spec.optimizer),
        "model_state_formula_text": ("(2+2+K)Ψ, K = 12" if spec.precision.startswith("mixed")
                                     else "FP32 params (the master weights) + grads + "
                                     "AdamW's m and v: fp8 runs only the GEMMs in FP8"
                                     if spec.precision == "fp8" else
                                     f"params + grads + optimizer states of {spec.precision}"),
        "buckets": [list(b.names) for b in dp.buckets],
        "timeline": [e[3] for e in everyone],
        "bucket_algorithms": dp.bucket_algorithms,
        "notes": [(f"Ψ = {psi:,} parameters in {len(dp.buckets)} bucket(s), algorithm "
                   f"{dp.algorithm}, overlap {'on' if dp.overlap else 'off'}"),
                  algorithm_note(dp.algorithm, dp.bucket_algorithms, n, dp.overlap,
                                 dp.choice_note)]
        + memory_notes + _fp8_amax_notes(spec, n, [e[4] for e in everyone]),
        **({"memory": memory} if memory else {}),
    }


def _fp8_amax_notes(spec: Any, n: int, sent: list[float]) -> list[str]:
    """Per-tensor FP8 (:func:`minipar.parallel.common.fp8_rows`): the amax all-reduces'
    bytes per step, counted, against 4 per linear layer (x and dy of the forward, the
    input gradient and the weight gradient's two) x 4 layers a block, one FP32 each."""
    if not any(sent):
        return []
    from minipar.collectives import allreduce_bytes_sent
    from minipar.parallel.common import OP_FP8_AMAX

    calls = 16 * spec.layers
    exact = [calls * allreduce_bytes_sent(1, 4, n, r, "ring") for r in range(n)]
    return [f"fp8 per-tensor amax all-reduces (op {OP_FP8_AMAX}) per rank per step: "
            f"{', '.join(f'{b:,.0f}' for b in sent)} B; exact {', '.join(map(str, exact))}: "
            f"{calls} ring all-reduces of one FP32 number (16 per block)"]


def trace_events(summary: dict[str, Any]) -> list[dict[str, Any]]:
    """``--trace FILE.json``: every rank's last-step timeline (backward pieces and bucket
    all-reduces) as Chrome trace events (:mod:`minipar.trace`)."""
    from minipar.trace import ddp_events

    return ddp_events(summary["timeline"])


def headline(sent: float, ring: float, algorithm: str, per_bucket: list[str]) -> str:
    """The number to look at first: the bytes a rank sent per step, against the ring's
    2(N-1)/N x S, and when they differ, why (the all-reduce auto chose) in the same line."""
    if algorithm == "mpi":
        return (f"bytes not counted (MPI's own all-reduce); the ring would send {ring:,.0f} B "
                "per rank per step, 2(N-1)/N x S")
    if round(sent) == round(ring):
        return f"{sent:,.0f} B sent per rank per step = the ring's 2(N-1)/N x S, the paper's figure"
    chosen = ", ".join(a.replace("_", " ") for a in dict.fromkeys(per_bucket))
    why = "auto chose it for small buckets" if algorithm == "auto" else f"--algorithm {algorithm}"
    return (f"{sent:,.0f} B sent per rank per step, not the paper's 2(N-1)/N x S = {ring:,.0f}: "
            f"the buckets ran {chosen} ({why}; --algorithm ring gives the paper's figure)")


def algorithm_note(algorithm: str, per_bucket: list[str], world: int, overlap: bool,
                   why: str = "") -> str:
    """One line: which all-reduce the buckets ran, why (the α–β–γ model's times, ``why``), and
    where the paper's figure is."""
    when = "overlapped with backward" if overlap else "after backward (--no-overlap)"
    if algorithm != "auto":
        return f"every bucket: {algorithm} (--algorithm {algorithm}), {when}"
    rd, ring = per_bucket.count("recursive_doubling"), per_bucket.count("ring")
    parts = []
    if ring:
        parts.append(f"{ring} bucket(s) on the ring, {when}")
    if rd:
        parts.append(f"{rd} bucket(s) by recursive doubling, blocking "
                     + ("when ready (only the ring is overlapped; the model found these too "
                        "small for it)" if overlap else "after backward"))
    tail = "" if not rd else "; the formula is the ring's: --algorithm ring"
    return "auto: " + "; ".join(parts) + tail + (f"\n{why}" if why else "")
