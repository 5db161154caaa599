"""``minipar bench collectives``: the from-scratch collectives vs MPI's own, one run.

EN collective bandwidth benchmark · RU замер пропускной способности коллективов ·
ZH 集合通信带宽基准

Convention of nccl-tests (NVIDIA, ``doc/PERFORMANCE.md``): for a buffer of S
bytes and time t, ``algbw = S / t`` and ``busbw = algbw x 2(N-1)/N`` for
all-reduce, ``x (N-1)/N`` for reduce-scatter and all-gather (S is the full
buffer: reduce-scatter's input, all-gather's output).  busbw is comparable to
the link's bandwidth whatever N: a bandwidth-optimal algorithm approaches it.

Time = max over ranks of the mean time per call, after warm-up, with an MPI
Barrier before each call; the algorithms take turns call by call, so a busy
moment of a shared machine slows all of them alike.  float32 data.  ``x_mpi`` is this algorithm's busbw
over MPI's own collective measured at the same size in the same run.

    minipar bench collectives -n 4                  # 8 B .. 64 MiB
    minipar bench collectives -n 4 --sizes 8 1024 --iters 2 --json
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Callable
from typing import Any

#: (collective, algorithm) in the order they are measured at each size
CASES = [
    ("allreduce", "mpi"), ("allreduce", "ring"), ("allreduce", "recursive_doubling"),
    ("allreduce", "tree"), ("allreduce", "naive"),
    ("reduce_scatter", "mpi"), ("reduce_scatter", "ring"),
    ("all_gather", "mpi"), ("all_gather", "ring"),
]
DEFAULT_SIZES = [8] + [16 * 4**k for k in range(12)]  # 8 B, 16 B, 64 B, ..., 64 MiB


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="minipar bench collectives", description=__doc__.split("\n")[0])
    p.add_argument("-n", "--ranks", type=int, default=4, help="number of ranks (default 4)")
    p.add_argument("--sizes", type=int, nargs="+", default=DEFAULT_SIZES,
                   help="buffer sizes in bytes (default 8 B to 64 MiB, powers of 4)")
    p.add_argument("--iters", type=int, default=20,
                   help="timed calls per size up to 1 MiB; fewer above (at least 3)")
    p.add_argument("--warmup", type=int, default=2, help="untimed calls first (default 2)")
    p.add_argument("--collectives", nargs="+", choices=sorted({c for c, _ in CASES}),
                   default=sorted({c for c, _ in CASES}), help="which collectives (default all)")
    p.add_argument("--json", action="store_true", help="print JSON rows instead of a table")
    p.add_argument("--timeout", type=float, default=600.0, help="seconds before all ranks are killed")
    p.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    return p


def _iters_for(size: int, iters: int) -> int:
    return max(min(iters, 3), min(iters, iters * (1 << 20) // max(size, 1)))


def _call(comm: Any, coll: str, algo: str, x: Any, chunk: Any) -> Callable[[], Any]:
    from minipar import collectives as C

    if coll == "allreduce":
        return lambda: C.allreduce(comm, x, algorithm=algo)
    if coll == "reduce_scatter":
        return lambda: C.reduce_scatter(comm, x, algorithm=algo)
    return lambda: C.all_gather(comm, chunk, algorithm=algo)


def worker(args: argparse.Namespace) -> int:
    import numpy as np
    from mpi4py import MPI

    from minipar.comm import TracedComm
    from minipar.plan.collectives import busbw_factor

    world = MPI.COMM_WORLD
    comm = TracedComm(world)
    n, rank = comm.size, comm.rank
    rows = []
    for size in args.sizes:
        count = max(size // 4, 1)
        x = (np.arange(count, dtype=np.float32) % 7) + rank
        chunk = np.array_split(x, n)[rank].copy()
        iters = _iters_for(size, args.iters)
        cases = [(c, a) for c, a in CASES if c in args.collectives]
        fns = [_call(comm, coll, algo, x, chunk) for coll, algo in cases]
        for fn in fns:
            for _ in range(args.warmup):
                fn()
        totals = [0.0] * len(cases)
        for _ in range(iters):  # interleaved: a slow moment of the machine hits all alike
            for i, fn in enumerate(fns):
                world.Barrier()
                t0 = time.perf_counter()
                fn()
                totals[i] += time.perf_counter() - t0
        for (coll, algo), total in zip(cases, totals):
            t = world.allreduce(total / iters, op=MPI.MAX)
            factor = busbw_factor(coll, n)  # 2(N-1)/N or (N-1)/N, from minipar.plan
            algbw = count * 4 / t / 1e9
            rows.append({"collective": coll, "algorithm": algo, "size": count * 4,
                         "count": count, "dtype": "float32", "ranks": n, "iters": iters,
                         "time_us": t * 1e6, "algbw_GBs": algbw, "busbw_GBs": algbw * factor})
        comm.stats.reset()
    if rank == 0:
        for row in rows:
            ref = next(r for r in rows if r["collective"] == row["collective"]
                       and r["size"] == row["size"] and r["algorithm"] == "mpi")
            row["x_mpi"] = row["busbw_GBs"] / ref["busbw_GBs"] if ref["busbw_GBs"] else 0.0
        if args.json:
            print(json.dumps(rows))
        else:
            print(format_table(rows))
    return 0


def format_table(rows: list[dict[str, Any]]) -> str:
    """nccl-tests style: one block per collective, one line per (size, algorithm)."""
    n = rows[0]["ranks"] if rows else 0
    out = [f"# minipar bench collectives: {n} ranks, float32, time = max over ranks of the mean",
           "# busbw = algbw x 2(N-1)/N (all-reduce), x (N-1)/N (reduce-scatter, all-gather)"]
    head = (f"{'size(B)':>10} {'count':>10} {'type':>7} {'algorithm':>18} {'time(us)':>11} "
            f"{'algbw(GB/s)':>11} {'busbw(GB/s)':>11} {'x_mpi':>6}")
    for coll in dict.fromkeys(r["collective"] for r in rows):
        out += ["", f"# {coll}", head]
        for r in (r for r in rows if r["collective"] == coll):
            out.append(f"{r['size']:>10} {r['count']:>10} {r['dtype']:>7} {r['algorithm']:>18} "
                       f"{r['time_us']:>11.1f} {r['algbw_GBs']:>11.3f} {r['busbw_GBs']:>11.3f} "
                       f"{r['x_mpi']:>6.2f}")
    return "\n".join(out)


def main(argv: list[str]) -> int:
    args = _parser().parse_args(argv)
    if any(s < 1 for s in args.sizes) or args.iters < 1 or args.warmup < 0:
        print("minipar bench collectives: sizes and iters must be positive", file=sys.stderr)
        return 2
    if args.worker:
        return worker(args)
    from minipar import launch

    rest = ["--worker", "--iters", str(args.iters), "--warmup", str(args.warmup),
            "--sizes", *map(str, args.sizes), "--collectives", *args.collectives] + (["--json"] if args.json else [])
    proc = launch.run(args.ranks, "minipar.bench.collectives", *rest, timeout=args.timeout)
    sys.stdout.write(proc.stdout)
    if proc.returncode:
        sys.stderr.write(proc.stderr)
    return proc.returncode


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
