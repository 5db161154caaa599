"""``minipar run ps``: the parameter server, its options and its measurements.

EN parameter server · RU сервер параметров · ZH 参数服务器

Launcher side: ``--servers``, ``--async``, ``--staleness``, ``--straggler-ms``
and their checks (a worker must remain; ``--staleness`` only means something
with ``--async``).  Rank side (:mod:`minipar.run.worker` trains the engine):
:func:`grid_sizes` (servers and workers on the dp axis), :func:`engine_options`
(the keywords of
:class:`minipar.parallel.data_parallel.ps_engine.ParameterServer`, Li et
al. 2014, OSDI; stale-synchronous parallel: Ho et al. 2013, NeurIPS) and
:func:`report`, which gathers the bytes each rank sent and received: a
server's link carries W x S_shard per step, where a ring all-reduce rank would
send 2(W-1)/W x S.
"""

from __future__ import annotations

import argparse
from typing import Any

from minipar.cli.options import integer, number


def add_arguments(parser: argparse.ArgumentParser) -> None:
    g = parser.add_argument_group("parameter server")
    g.add_argument("--servers", type=integer(1), default=1,
                   help="server ranks (each owns a shard; default 1)")
    g.add_argument("--async", dest="asynchronous", action="store_true",
                   help="workers do not wait for each other: the server takes each gradient "
                   "as it arrives, from whichever worker, and applies an update once it "
                   "holds W of them (one step's worth, W = workers); it answers a push with the "
                   "current parameters as soon as that worker is at most --staleness steps "
                   "ahead of the slowest. With --staleness 0 (the default) this is the "
                   "synchronous run exactly")
    g.add_argument("--staleness", type=integer(0), default=None,
                   help="with --async: steps a worker may run ahead of the slowest; a gradient "
                   "is then applied at most 2 x staleness updates after the parameters it "
                   "was computed on (default 0)")
    g.add_argument("--straggler-ms", type=number(minimum=0), default=0.0,
                   help="worker 0 sleeps this many milliseconds per step, to show what "
                   "--async buys (default %(default)s)")


def check(options: dict[str, Any], spec: Any) -> None:
    """Launcher side: servers plus at least one worker, one row per worker, no fp16."""
    from minipar.parallel.common import check_world

    n, servers = options["ranks"], options.get("servers", 1)
    if n < servers + 1:
        raise ValueError(f"-n {n} is too few ranks for a parameter server with --servers "
                         f"{servers}: it needs the servers plus at least one worker, "
                         f"-n >= {servers + 1}")
    if options.get("staleness") is not None and not options.get("asynchronous"):
        raise ValueError(f"--staleness {options['staleness']} needs --async: synchronous workers "
                         "all wait for the same update, their staleness is 0")
    if spec.precision == "mixed-fp16":
        raise ValueError("--precision mixed-fp16 is not supported by the parameter server (its "
                         "loss scaling would need every shard to agree on overflow); use float64, "
                         "float32 or mixed")
    check_world(spec.batch, n - servers)


def not_comparable(options: dict[str, Any]) -> str | None:
    s = options.get("staleness") or 0
    workers = options.get("ranks", 2) - (options.get("servers") or 1)
    if options.get("asynchronous") and s > 0 and workers > 1:  # one worker: never stale
        return (f"asynchronous updates with staleness {s} apply gradients to newer parameters "
                "than they were computed on")
    return None


def grid_sizes(options: dict[str, Any], spec: Any) -> dict[str, int]:
    """Servers and workers, all on the dp axis."""
    return {"dp": options["ranks"]}


def engine_options(options: dict[str, Any], spec: Any) -> dict[str, Any]:
    """:class:`~minipar.parallel.data_parallel.ps_engine.ParameterServer`'s keywords."""
    return {"servers": options.get("servers", 1),
            "mode": "async" if options.get("asynchronous") else "sync",
            "staleness": options.get("staleness") or 0,
            "straggler_s": options.get("straggler_ms", 0.0) / 1e3}


def report(ps: Any, grid: Any, options: dict[str, Any], spec: Any,
           history: Any) -> dict[str, Any] | None:
    """Rank side, after training: every rank's role, bytes sent and received per step and
    model-state bytes; rank 0 (a server) returns them (None elsewhere).  Under ``--async``
    the losses are the ones server 0 received, by the step they were computed for (the
    loop's are NaN: a step's loss is complete only when every worker has pushed it)."""
    from minipar.plan.collectives import parameter_server_bytes_at_server, ring_allreduce_volume

    mine = (ps.is_server, ps.bytes_per_step(len(history.losses)), ps.model_state_bytes(),
            ps.max_delay, None if ps.is_server else dict(ps.timings))
    everyone = ps.comm.comm.gather(mine, root=0)  # reporting only: MPI's pickled gather
    if ps.rank != 0:
        return None
    itemsize = ps.states.params.itemsize
    S, W = ps.layout.size * itemsize, ps.workers
    S0 = (ps.spans[0][1] - ps.spans[0][0]) * itemsize
    roles = ["server" if e[0] else "worker" for e in everyone]
    timings = [dict(e[4], rank=r) for r, e in enumerate(everyone) if e[4] is not None]
    staleness = f" (staleness {ps.staleness})" if ps.mode == "async" else ""
    return {
        "ranks": len(everyone), "data_parallel_ranks": W,
        **({"losses": ps.pushed_losses()} if ps.mode == "async" else {}),
        "psi": ps.layout.size, "mode": ps.mode, "staleness": ps.staleness, "servers": ps.servers,
        "workers": W, "roles": roles,
        "bytes_sent_per_rank": [e[1][0] for e in everyone],
        "bytes_recv_per_rank": [e[1][1] for e in everyone],
        "bytes_formula": parameter_server_bytes_at_server(S0, W),
        "bytes_formula_text": f"server 0: W x S_shard (W = {W} workers, S_shard = {S0:,} B)",
        "ring_rank_bytes": ring_allreduce_volume(S, W),
        "model_state_bytes_per_rank": [e[2] for e in everyone],
        "max_delay": max(e[3] for e in everyone),
        "worker_timings": timings,
        "notes": [(f"roles: {', '.join(f'{r}:{x}' for r, x in enumerate(roles))}; "
                   f"{ps.mode}{staleness}"),
                  (f"a ring all-reduce rank would send 2(W-1)/W x S = "
                   f"{ring_allreduce_volume(S, W):,.0f} B per step (S = {S:,} B); "
                   f"each worker sends S = {S:,} B")]
        + [timing_line(t, i, ps.straggler_s) for i, t in enumerate(timings)],
    }


def timing_line(t: dict[str, Any], worker: int, straggler_s: float) -> str:
    """One worker's measured seconds in words: computing, waiting for the pull, steps done."""
    slow = f" (the straggler: +{straggler_s * 1e3:g} ms per step)" if straggler_s and worker == 0 else ""
    total = t["computing_s"] + t["waiting_s"]
    share = t["waiting_s"] / total if total > 0 else 0.0
    return (f"worker {worker} (rank {t['rank']}){slow}: {t['steps']} steps, computing "
            f"{t['computing_s'] * 1e3:,.1f} ms, waiting for the pull {t['waiting_s'] * 1e3:,.1f} ms "
            f"({share:.0%} of its time; measured)")
