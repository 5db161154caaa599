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
moment of a shared machine slows all of them alike.  float32 data.  ``x_mpi``
is this algorithm's busbw over MPI's own collective measured at the same size
in the same run (1.00: as fast as MPI; above 1: faster; the table says so
under its blocks and gives, per collective, the best and the worst ratio and
where).  The ``auto`` rows (:mod:`minipar.collectives.auto`) also
say which algorithm auto chose; the table ends with auto against MPI's
Allreduce: the smallest ``x_mpi`` from 64 KiB up and from 1 MiB up (the project aims at
0.8 and 1.0) and the small-message latency ratio (time of auto / time of MPI
at the smallest size).  ``auto`` chooses by the α–β–γ model; this bench
(``--algorithms ring recursive_doubling``) checks its choices (``auto.py``),
and ``--calibrate`` measures the model's constants.

One rank is refused (``-n 1``): a collective on one rank moves no byte
between ranks, busbw = algbw x 2(N-1)/N is 0 for every algorithm, and a ratio
of zeros means nothing (the time ratio would only measure Python's call
overhead against C's, which ``minipar bench model`` already shows).
``--plot FILE.png`` draws busbw against size, log-log, one panel per
collective and one line per algorithm (:mod:`minipar.bench.collectives_plot`).
Progress: a bar on stderr, one step per size (:mod:`minipar.progress`).

    minipar bench collectives -n 4                  # 8 B .. 64 MiB, every algorithm
    minipar bench collectives -n 4 --algorithms mpi auto --collectives allreduce
    minipar bench collectives -n 4 --sizes 8 1024 --iters 2 --json
    minipar bench collectives -n 4 --plot busbw.png
"""

from __future__ import annotations

import json
import sys
import time
from collections.abc import Callable
from typing import Any

from minipar.cli.options import ArgumentParser, integer, output_file, seconds

#: (collective, algorithm) in the order they are measured at each size
CASES = [
    ("allreduce", "mpi"), ("allreduce", "auto"), ("allreduce", "ring"),
    ("allreduce", "recursive_doubling"), ("allreduce", "tree"), ("allreduce", "naive"),
    ("reduce_scatter", "mpi"), ("reduce_scatter", "ring"),
    ("all_gather", "mpi"), ("all_gather", "ring"),
]
DEFAULT_SIZES = [8] + [16 * 4**k for k in range(12)]  # 8 B, 16 B, 64 B, ..., 64 MiB
#: auto vs MPI's Allreduce: (from this many bytes up, the busbw ratio aimed at)
FROM_SIZES = (64 << 10, 1 << 20)  # the worst auto/MPI ratio is reported from these sizes up
#: the line under the table that says what ``x_mpi`` is
#: fewer timed calls per size than this and the table says its ratios are rough
NOISY_BELOW_ITERS = 10
LEGEND = ("# x_mpi = busbw / MPI's own busbw, same size, same run: 1.00 as fast as MPI, "
          "2.00 twice as fast, 0.50 half")
ONE_RANK = ("-n 1: a collective on one rank moves no data between ranks: bus bandwidth "
            "busbw = algbw x 2(N-1)/N is 0 for every algorithm, so there is no ratio to MPI to "
            "show; use -n 2 or more (ranks on one machine talk through shared memory)")


PROG = "minipar bench collectives"


def _parser() -> ArgumentParser:
    p = ArgumentParser(prog=PROG, description=__doc__.split("\n")[0])
    p.add_argument("-n", "--ranks", type=integer(1, 64), default=4,
                   help="number of ranks, 2 or more: a collective needs company "
                   "(default %(default)s)")
    p.add_argument("--sizes", type=integer(1, 1 << 30), nargs="+", default=DEFAULT_SIZES,
                   help="buffer sizes in bytes, multiples of 4 (default "
                   f"{' '.join(map(str, DEFAULT_SIZES))}: 8 B to 64 MiB, powers of 4)")
    p.add_argument("--iters", type=integer(1), default=20,
                   help="timed calls per size up to 1 MiB; fewer above, at least 3 "
                   "(default %(default)s)")
    p.add_argument("--warmup", type=integer(0), default=2,
                   help="untimed calls first (default %(default)s)")
    everything = sorted({c for c, _ in CASES})
    p.add_argument("--collectives", nargs="+", choices=everything, default=everything,
                   help=f"which collectives (default {' '.join(everything)})")
    p.add_argument("--algorithms", nargs="+", choices=list(dict.fromkeys(a for _, a in CASES)),
                   default=None, help="which algorithms (default all; mpi, the reference, "
                   "is always measured)")
    p.add_argument("--json", action="store_true", help="print JSON rows instead of a table")
    p.add_argument("--plot", metavar="FILE.png", type=output_file,
                   help="also draw busbw against size (log-log): one panel per collective, "
                   "one line per algorithm and MPI")
    p.add_argument("--calibrate", metavar="FILE.json", type=output_file,
                   help="instead of the table: measure the alpha-beta-gamma constants (8-byte "
                   "and 4 MiB exchanges between ranks 0 and 1, a 4 MiB float32 add) and write "
                   "them into FILE.json, the format of minipar/collectives/calibration.json")
    p.add_argument("--timeout", type=seconds, default=600.0,
                   help="seconds before all ranks are killed (default %(default)s)")
    p.add_argument("--debug", action="store_true", help="on failure, show every rank's output")
    return p


def _iters_for(size: int, iters: int) -> int:
    return max(min(iters, 3), min(iters, iters * (1 << 20) // max(size, 1)))


def cases(collectives: list[str], algorithms: list[str] | None) -> list[tuple[str, str]]:
    """The (collective, algorithm) pairs to measure, MPI's own always among them."""
    keep = None if algorithms is None else {"mpi", *algorithms}
    return [(c, a) for c, a in CASES if c in collectives and (keep is None or a in keep)]


def _call(comm: Any, coll: str, algo: str, x: Any, chunk: Any) -> Callable[[], Any]:
    from minipar import collectives as C

    if coll == "allreduce":
        return lambda: C.allreduce(comm, x, algorithm=algo)
    if coll == "reduce_scatter":
        return lambda: C.reduce_scatter(comm, x, algorithm=algo)
    return lambda: C.all_gather(comm, chunk, algorithm=algo)


def worker(o: dict[str, Any]) -> list[dict[str, Any]] | None:
    """Rank side: every (collective, algorithm) at every size; rank 0 returns the rows."""
    import numpy as np
    from mpi4py import MPI

    from minipar.collectives.auto import choose_allreduce
    from minipar.comm import TracedComm
    from minipar.plan.collectives import busbw_factor
    from minipar.progress import tick

    world = MPI.COMM_WORLD
    comm = TracedComm(world)
    n, rank = comm.size, comm.rank
    if o.get("calibrate"):
        from minipar.collectives.cost_model import measure_costs

        costs = measure_costs(comm)
        return None if costs is None else [costs.as_dict()]
    todo = cases(o["collectives"], o["algorithms"])
    rows = []
    for size in o["sizes"]:
        count = max(size // 4, 1)
        x = (np.arange(count, dtype=np.float32) % 7) + rank
        chunk = np.array_split(x, n)[rank].copy()
        iters = _iters_for(size, o["iters"])
        fns = [_call(comm, coll, algo, x, chunk) for coll, algo in todo]
        for fn in fns:
            for _ in range(o["warmup"]):
                fn()
        totals = [0.0] * len(todo)
        for _ in range(iters):  # interleaved: a slow moment of the machine hits all alike
            for i, fn in enumerate(fns):
                world.Barrier()
                t0 = time.perf_counter()
                fn()
                totals[i] += time.perf_counter() - t0
        for (coll, algo), total in zip(todo, totals):
            t = world.allreduce(total / iters, op=MPI.MAX)
            factor = busbw_factor(coll, n)  # 2(N-1)/N or (N-1)/N, from minipar.plan
            algbw = count * 4 / t / 1e9
            row = {"collective": coll, "algorithm": algo, "size": count * 4,
                   "count": count, "dtype": "float32", "ranks": n, "iters": iters,
                   "time_us": t * 1e6, "algbw_GBs": algbw, "busbw_GBs": algbw * factor}
            if algo == "auto":
                row["chosen"] = choose_allreduce(count * 4, n)
            rows.append(row)
        comm.stats.reset()
        if rank == 0:
            tick(o.get("progress"))
    if rank != 0:
        return None
    for row in rows:
        ref = next(r for r in rows if r["collective"] == row["collective"]
                   and r["size"] == row["size"] and r["algorithm"] == "mpi")
        row["x_mpi"] = row["busbw_GBs"] / ref["busbw_GBs"] if ref["busbw_GBs"] else 0.0
        row["x_mpi_time"] = ref["time_us"] / row["time_us"]
    return rows


def auto_summary(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """auto vs MPI's Allreduce in one run: worst busbw ratio from each of FROM_SIZES up,
    and the latency ratio t_auto / t_mpi at the smallest size measured."""
    auto = sorted((r for r in rows if r["collective"] == "allreduce"
                   and r["algorithm"] == "auto"), key=lambda r: r["size"])
    mpi = {r["size"]: r for r in rows if r["collective"] == "allreduce" and r["algorithm"] == "mpi"}
    if not auto:
        return {}
    out: dict[str, Any] = {"latency_size": auto[0]["size"],
                           "latency_ratio": auto[0]["time_us"] / mpi[auto[0]["size"]]["time_us"]}
    for lo in FROM_SIZES:
        above = [r["x_mpi"] for r in auto if r["size"] >= lo]
        out[f"min_x_mpi_from_{lo}"] = min(above) if above else None
    return out


def human_size(size: int) -> str:
    """8 -> '8 B', 65536 -> '64 KiB', 4194304 -> '4 MiB' (powers of 1024; else bytes)."""
    for shift, unit in ((30, "GiB"), (20, "MiB"), (10, "KiB")):
        if size >= 1 << shift and size % (1 << shift) == 0:
            return f"{size >> shift} {unit}"
    return f"{size} B"


def collective_summary(rows: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """Per collective, over the algorithms that are not MPI's own: the best and the worst
    ``x_mpi`` and where, ``{coll: {"best": row, "worst": row}}``."""
    out = {}
    for coll in dict.fromkeys(r["collective"] for r in rows):
        ours = [r for r in rows if r["collective"] == coll and r["algorithm"] != "mpi"]
        if ours:
            out[coll] = {"best": max(ours, key=lambda r: r["x_mpi"]),
                         "worst": min(ours, key=lambda r: r["x_mpi"])}
    return out


def format_table(rows: list[dict[str, Any]]) -> str:
    """nccl-tests style: one block per collective, one line per (size, algorithm)."""
    n = rows[0]["ranks"] if rows else 0
    out = [f"# minipar bench collectives: {n} ranks, float32, time = max over ranks of the mean",
           "# busbw = algbw x 2(N-1)/N (all-reduce), x (N-1)/N (reduce-scatter, all-gather)"]
    head = (f"{'size(B)':>10} {'count':>10} {'type':>7} {'algorithm':>18} {'time(us)':>11} "
            f"{'algbw(GB/s)':>11} {'busbw(GB/s)':>11} {'x_mpi':>6}  chosen")
    for coll in dict.fromkeys(r["collective"] for r in rows):
        out += ["", f"# {coll}", head]
        for r in (r for r in rows if r["collective"] == coll):
            out.append(f"{r['size']:>10} {r['count']:>10} {r['dtype']:>7} {r['algorithm']:>18} "
                       f"{r['time_us']:>11.1f} {r['algbw_GBs']:>11.3f} {r['busbw_GBs']:>11.3f} "
                       f"{r['x_mpi']:>6.2f}  {r.get('chosen', '')}".rstrip())
    out += ["", LEGEND]
    for coll, s in collective_summary(rows).items():
        b, w = s["best"], s["worst"]
        out.append(f"# {coll}: best x_mpi {b['x_mpi']:.2f} ({b['algorithm']} at "
                   f"{human_size(b['size'])}), worst {w['x_mpi']:.2f} ({w['algorithm']} at "
                   f"{human_size(w['size'])})")
    few = min((r["iters"] for r in rows), default=0)
    if few < NOISY_BELOW_ITERS:
        out.append(f"# only {few} timed call(s) per size: on a shared machine one slow moment "
                   "moves a ratio by several times; read these as rough (--iters 20 or more)")
    s = auto_summary(rows)
    if s:
        out += ["", ("# auto vs MPI's Allreduce (same run): busbw ratio, 1.00 = as fast as "
                     "MPI's own collective, above 1 faster")]
        for lo in FROM_SIZES:
            got = s[f"min_x_mpi_from_{lo}"]
            where = f"{lo >> 20} MiB" if lo >= 1 << 20 else f"{lo >> 10} KiB"
            out.append(f"#   busbw ratio from {where} up: " + (
                "no size measured" if got is None else
                f"min {got:.2f} ({'at or above' if got >= 1 else 'below'} MPI's speed)"))
        out.append(f"#   latency at {s['latency_size']} B: auto takes {s['latency_ratio']:.2f}x "
                   "MPI's time (Python per message + the polling wait, see auto.py)")
        out.append("#   " + auto_rule(rows[0]["ranks"]))
    return "\n".join(out)


def auto_rule(n: int) -> str:
    """One line: where auto switches on ``n`` ranks, and why (the model, the committed file)."""
    from minipar.collectives.auto import ring_threshold

    edge = ring_threshold(n)
    where = ("recursive doubling at every size" if edge == float("inf") else
             f"recursive doubling below {int(edge):,} B, the ring from there")
    return (f"auto on {n} ranks: {where} (the alpha-beta-gamma model with the constants of "
            "minipar/collectives/calibration.json; minipar/collectives/auto.py)")


def _calibrate(args: Any, payload: dict[str, Any]) -> int:
    """``--calibrate FILE``: measure alpha, beta, gamma on the launched ranks and write them."""
    from minipar import launch
    from minipar.collectives.cost_model import CALIBRATION

    try:
        rows, _ = launch.run_json(args.ranks, "minipar.bench.collectives",
                                  {**payload, "calibrate": True}, timeout=args.timeout,
                                  check=True)
    except launch.LaunchError as e:
        return launch.report(PROG, e, args.debug)
    (costs,) = rows
    try:
        with open(args.calibrate, "w", encoding="utf-8") as f:
            json.dump(costs, f, indent=1)
            f.write("\n")
    except OSError as e:
        print(f"{PROG}: cannot write {args.calibrate}: {e.strerror or e}", file=sys.stderr)
        return 1
    print(f"alpha = {costs['alpha_s'] * 1e6:.2f} us per message, "
          f"1/beta = {1e-9 / costs['beta_s_per_byte']:.2f} GB/s sent, "
          f"1/gamma = {1e-9 / costs['gamma_s_per_byte']:.2f} GB/s reduced; wrote "
          f"{args.calibrate} (the committed constants: minipar/collectives/{CALIBRATION.name})")
    return 0


def main(argv: list[str]) -> int:
    from minipar import launch

    p = _parser()
    args = p.parse_args(argv)
    odd = [s for s in args.sizes if s % 4]
    if odd:
        p.error(f"--sizes must be multiples of 4 bytes (float32 elements), got {odd[0]}")
    if args.ranks == 1:
        p.error(ONE_RANK)
    if all(a == "mpi" for _, a in cases(args.collectives, args.algorithms)):
        p.error(f"--algorithms {' '.join(args.algorithms or [])}: no algorithm to compare "
                f"with MPI's own for {' '.join(args.collectives)}")
    from minipar.progress import watched

    payload = {k: getattr(args, k) for k in ("sizes", "iters", "warmup", "collectives",
                                            "algorithms")}
    if args.calibrate:
        return _calibrate(args, payload)
    try:
        with watched(len(args.sizes), "size") as progress:
            rows, _ = launch.run_json(args.ranks, "minipar.bench.collectives",
                                      {**payload, "progress": progress},
                                      timeout=args.timeout, check=True)
    except launch.LaunchError as e:  # any failure of the launch
        return launch.report(PROG, e, args.debug)
    print(json.dumps(rows) if args.json else format_table(rows))
    if args.plot:
        from minipar.bench.collectives_plot import plot_busbw

        try:
            plot_busbw(rows, args.plot)
        except OSError as e:
            print(f"{PROG}: cannot write {args.plot}: {e.strerror or e}", file=sys.stderr)
            return 1
        print(f"wrote {args.plot} (bus bandwidth against size, one panel per collective)",
              file=sys.stderr)
    return 0


if __name__ == "__main__":
    from minipar import launch

    if launch.is_worker(sys.argv[1:]):
        sys.exit(launch.serve(worker, sys.argv[1:]))
    sys.exit(main(sys.argv[1:]))
