"""``minipar bench zero``: ZeRO step time against data parallelism, side by side.

EN ZeRO benchmark · RU замер ZeRO · ZH ZeRO 基准测试

One launch on N ranks (default 2) trains the same GPT with DDP
(:class:`minipar.parallel.data_parallel.engine.DataParallel`: bucketed all-reduce
started as backward fills the buckets) and with ZeRO stages 0-3
(:class:`minipar.parallel.zero.engine.ZeRO`), both with their default all-reduce,
``auto``, in interleaved rounds (one step of each,
repeated, so drift on a shared machine hits all alike), ZeRO-3 also prefetching K
units ahead (``--prefetch K[,K...]``, default 1; ``--no-reshard``: without resharding
after forward too), and reports each median
step time (slowest rank, after a warm-up round;
:func:`minipar.bench.dp.measure_step_time`) as a ratio to DDP's.  What the
ratios show (Rajbhandari et al. 2019, arXiv 1910.02054): stages 1 and 2 move
the same 2Ψ as DP, so they cost about what DP costs; stage 3 moves 3Ψ (1.5x)
and cannot start a unit's forward before its all-gather, so it is slower.
Bytes sent per rank per step are counted in the same run, and for ZeRO-3 the share
of its communication hidden behind the units' computation (``hidden_fraction``) and
the most parameters it held gathered (the price of prefetching).  A progress bar
on stderr counts the rounds (:mod:`minipar.progress`).

The module also measures memory and traffic for the notebook:
:func:`measure_stages` runs every stage in one launch of N ranks and returns
each rank's model-state bytes (ledger by category, tracemalloc) and bytes sent.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from typing import Any

from minipar.bench.dp import add_bench_arguments, check_bench_options
from minipar.cli.options import ArgumentParser

PROG = "minipar bench zero"


def _worker(o: dict[str, Any]) -> dict[str, Any] | None:
    """Rank side: ``o["mode"]`` is "measure" (memory and bytes of every stage, the
    notebook's figures) or "time" (step times); the result on rank 0."""
    from minipar.comm import TracedComm
    from minipar.comm.topology import Grid
    from minipar.parallel.common import RunSpec
    from minipar.parallel.zero.engine import STAGES, ZeRO
    from minipar.parallel.zero.measure import measure_stage, step_bytes

    comm = TracedComm()
    grid = Grid(comm, dp=comm.size)
    spec = RunSpec(**o["spec"])
    if o["mode"] == "measure":
        out = {}
        for stage in o.get("stages", STAGES):
            m = measure_stage(grid, spec, stage, allreduce=o.get("allreduce", "auto"))
            rows = comm.comm.gather({k: m[k] for k in ("ledger", "tracemalloc_bytes", "shard",
                                                       "bytes_sent_per_step", "step_peak_bytes")})
            out[stage] = {"psi": m["engine"].layout.size, "ranks": rows}
            del m
        return out if comm.rank == 0 else None
    from minipar.bench.dp import measure_step_time
    from minipar.parallel.data_parallel.engine import DataParallel

    from mpi4py import MPI

    from minipar.overlap import hidden_fraction

    dp = DataParallel(grid, spec)
    runners: dict[str, Any] = {"DDP": lambda s: dp.step(spec.batch_at(s))}
    engines: dict[str, Any] = {}
    variants = [(f"ZeRO-{stage}", {"stage": stage}) for stage in o["stages"]]
    if 3 in o["stages"]:  # ZeRO-3 that prefetches, beside the blocking one
        variants += [(f"ZeRO-3 K={k}", {"stage": 3, "prefetch": k}) for k in o.get("prefetch", [])]
        if o.get("no_reshard"):
            k = max(o.get("prefetch") or [0])
            variants.append((f"ZeRO-3 K={k} keep", {"stage": 3, "prefetch": k,
                                                    "reshard_after_forward": False}))
    for name, kw in variants:
        eng = engines[name] = ZeRO(grid, spec, timeline=kw["stage"] == 3, **kw)
        runners[name] = lambda s, eng=eng: eng.step(spec.batch_at(s))
    from minipar.progress import tick

    from minipar.overlap import total

    res: dict[str, Any] = {k: {"times": [], "bytes": 0.0, "hidden": [], "comm": []}
                           for k in runners}
    for r in range(o["steps"] + 1):  # interleaved rounds: drift hits every strategy alike
        for name, fn in runners.items():
            sent = step_bytes(comm.stats)  # not ZeRO's sum of the loss (DDP's is counted)
            t = measure_step_time(lambda s, fn=fn, r=r: fn(r), 1, comm, warmup=0)
            if r:  # round 0 is the warm-up
                res[name]["times"].append(t)
                res[name]["bytes"] = step_bytes(comm.stats) - sent
                records = getattr(engines.get(name), "records", None) or []
                h = hidden_fraction([x[2:] for x in records if x[0] != "comm"],
                                    [x[2:] for x in records if x[0] == "comm"])
                if h is not None:
                    res[name]["hidden"].append(h)
                    res[name]["comm"].append(total(x[2:] for x in records if x[0] == "comm"))
        if comm.rank == 0:
            tick(o.get("progress"))
    for name, v in res.items():
        v["seconds"] = statistics.median(v.pop("times"))
        mine = statistics.median(v.pop("hidden")) if v["hidden"] else None
        secs = statistics.median(v.pop("comm")) if v["comm"] else None
        every = comm.comm.gather(mine)  # each rank's median share, averaged below
        in_msgs = comm.comm.gather(secs)
        peak = engines[name].zero_hooks.peak_gathered_bytes if name in engines else 0
        peak = comm.comm.allreduce(peak, op=MPI.MAX)
        if comm.rank == 0:
            shares = [h for h in every if h is not None]
            v["hidden_fraction"] = sum(shares) / len(shares) if shares else None
            v["peak_gathered_bytes"] = peak
            got = [c for c in in_msgs if c is not None]
            v["comm_seconds"] = sum(got) / len(got) if got else None
    if comm.rank:
        return None
    plan_here(res)
    return {"psi": dp.layout.size, "results": res}


def plan_here(res: dict[str, Any]) -> None:
    """The planner's "minipar on this machine" term (:mod:`minipar.plan.here`): each ZeRO-3
    row that prefetches and reshards gets ``plan_seconds``, blocking ZeRO-3's step minus
    the recorded hidden share of the seconds blocking ZeRO-3 spent in its messages."""
    from minipar.plan.here import overlapped_step

    block = res.get("ZeRO-3")
    if not block or block.get("comm_seconds") is None:
        return
    for name, v in res.items():
        if name.startswith("ZeRO-3 K=") and not name.endswith("keep"):
            v["plan_seconds"] = overlapped_step(
                block["seconds"], min(block["comm_seconds"], block["seconds"]), "zero3")


def measure_stages(n: int, stages: tuple[int, ...] = (0, 1, 2, 3), timeout: float = 120.0,
                   allreduce: str = "ring", **spec: Any) -> dict[int, dict[str, Any]]:
    """Every stage on ``n`` ranks in one launch: {stage: {"psi", "ranks": [per-rank dict]}}.

    The paper's setting, for figures set next to its formulas: ``spec`` are
    :class:`~minipar.parallel.common.RunSpec` fields (default: the mixed-precision
    GPT of Ψ ≈ 52 thousand the tests use, one step) and stage 0 all-reduces on the
    ring (``allreduce``; ZeRO's own default, ``"auto"``, would take recursive
    doubling for this small model on 2, 4 or 8 ranks, the α–β–γ model's choice:
    log2 N x S instead of 2(N-1)/N x S).  Raises
    :class:`minipar.launch.RanksFailed` (one line) if the ranks fail."""
    from minipar import launch

    base = {"vocab": 16, "seq": 8, "d_model": 32, "layers": 4, "heads": 2, "batch": 8,
            "steps": 1, "precision": "mixed"}
    base.update(spec)
    base["batch"] = max(base["batch"], n)
    out, _ = launch.run_json(n, "minipar.bench.zero", {"mode": "measure", "spec": base,
                                                       "stages": list(stages),
                                                       "allreduce": allreduce},
                             timeout=timeout, check=True)
    return {int(k): v for k, v in out.items()}


def stages_option(text: str) -> list[int]:
    """An argparse ``type``: comma-separated ZeRO stages, e.g. ``0,1,2,3``."""
    from minipar.run.zero import STAGES

    try:
        stages = [int(t) for t in text.split(",")]
    except ValueError:
        stages = []
    if not stages or any(s not in STAGES for s in stages):
        raise argparse.ArgumentTypeError(
            f"must be ZeRO stages from {STAGES[0]} to {STAGES[-1]}, comma-separated, got {text!r}")
    return stages


def _parser() -> ArgumentParser:
    p = ArgumentParser(prog=PROG, description=__doc__.split("\n")[0])
    add_bench_arguments(p)
    p.add_argument("--stages", type=stages_option, default=[0, 1, 2, 3],
                   help="ZeRO stages to time, comma-separated (default 0,1,2,3)")
    p.add_argument("--prefetch", type=prefetch_option, default=[1], metavar="K[,K...]",
                   help="with stage 3: also ZeRO-3 prefetching K units ahead, for each K "
                        "(comma-separated; default 1; 0: none)")
    p.add_argument("--no-reshard", action="store_true",
                   help="with stage 3: also ZeRO-3 at the largest K without resharding "
                        "after forward (FSDP2)")
    return p


def prefetch_option(text: str) -> list[int]:
    """An argparse ``type``: comma-separated prefetch depths K >= 0 (0 alone: none)."""
    try:
        ks = [int(t) for t in text.split(",")]
    except ValueError:
        ks = []
    if not ks or any(k < 0 for k in ks):
        raise argparse.ArgumentTypeError(
            f"must be prefetch depths K >= 0, comma-separated, got {text!r}")
    return [k for k in ks if k > 0]


def main(argv: list[str]) -> int:
    from minipar import launch

    p = _parser()
    a = p.parse_args(argv)
    try:
        spec = check_bench_options(vars(a))
    except ValueError as e:
        p.error(str(e))
    from minipar.progress import watched

    try:
        with watched(a.steps + 1, "round") as progress:  # the warm-up round, then the timed
            out, _ = launch.run_json(a.ranks, "minipar.bench.zero",
                                     {"mode": "time", "spec": spec.as_dict(), "steps": a.steps,
                                      "stages": a.stages, "progress": progress,
                                      "prefetch": a.prefetch, "no_reshard": a.no_reshard},
                                     timeout=a.timeout, check=True)
    except launch.LaunchError as e:  # any failure of the launch
        return launch.report(PROG, e, a.debug)
    res, base = out["results"], out["results"]["DDP"]["seconds"]
    if a.json:
        print(json.dumps(out, indent=2))
        return 0
    print(f"GPT d_model {a.d_model}, {a.layers} layers, T {a.seq}, global batch {a.batch}, "
          f"{a.precision}, {a.ranks} ranks: Ψ = {out['psi']:,}; median of {a.steps} steps, "
          "slowest rank")
    print(f"{'':>16} {'s/step':>8} {'vs DDP':>7} {'bytes sent/rank/step':>22} "
          f"{'hidden':>7} {'gathered peak B':>16} {'plan s':>7}")
    for name, r in res.items():
        hidden = r.get("hidden_fraction")
        peak = r.get("peak_gathered_bytes") or 0
        plan = r.get("plan_seconds")
        print(f"{name:>16} {r['seconds']:>8.3f} {r['seconds'] / base:>6.2f}x "
              f"{r['bytes']:>22,.0f} {'-' if hidden is None else f'{hidden:.0%}':>7} "
              f"{f'{peak:,}' if peak else '-':>16} {'-' if plan is None else f'{plan:.3f}':>7}")
    print("hidden: the share of ZeRO-3's all-gather / reduce-scatter time covered by the "
          "units' forward and backward (minipar.overlap.hidden_fraction, last steps' median, "
          "mean of the ranks)")
    if "ZeRO-3" in res and res["ZeRO-3"].get("comm_seconds") is not None:
        from minipar.plan.here import HERE_OVERLAP

        print(f"plan s: the planner's minipar-on-this-machine term (minipar.plan.here): "
              f"blocking ZeRO-3's {res['ZeRO-3']['seconds']:.3f} s minus "
              f"{HERE_OVERLAP['zero3']:.0%} (hidden as recorded) of the "
              f"{res['ZeRO-3']['comm_seconds']:.3f} s it spent in messages; beside the "
              "measured s/step")
    return 0


if __name__ == "__main__":
    from minipar import launch

    if launch.is_worker(sys.argv[1:]):
        sys.exit(launch.serve(_worker, sys.argv[1:]))
    sys.exit(main(sys.argv[1:]))
