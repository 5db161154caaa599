"""``minipar bench ep``: expert parallelism's step time, and dropped tokens against capacity.

EN expert-parallelism benchmark · RU замер параллелизма экспертов · ZH 专家并行基准测试

One launch of N ranks (default 2) times, in interleaved rounds (so drift on
a shared machine hits all alike; median of ``--steps``, after a warm-up):

* **MoE, 1 rank**: the MoE GPT (E = ``--experts``, top-k, capacity factor)
  on rank 0 alone, the whole global batch (:class:`ExpertParallel` on
  ``COMM_SELF``: the serial computation);
* **dense, 1 rank**: the same GPT with one MLP per block instead of E
  experts (the serial engine) — equal *active* parameters per token for top-1 (a token passes
  through one expert of the same shape as the MLP; the MoE holds E times the
  FFN parameters but computes about the same per token, plus the router);
* **MoE, EP on N ranks**: :class:`~minipar.parallel.expert_parallel.engine.ExpertParallel`
  with ep = N (E/N experts per rank, tokens by all-to-all; the dense layers
  data-parallel), the slowest rank's step;
* **MoE, DP on N ranks**: the same with ep = 1, every rank all E experts
  (no all-to-all; the experts' gradients all-reduced like the dense ones).

The speed-up EP(N) / MoE(1) is the figure the issue targets (>= 1.5x on 2
ranks where the experts dominate).  Most of it is the batch split over N
ranks, which pure data parallelism gets too: the row "DP on N ranks" says
what expert parallelism adds to it (EP sends tokens instead of all-reducing
the experts' gradients, and each rank updates E/N experts, not E).  Each
step is timed in wall-clock and in CPU seconds of the slowest rank (waits poll
with sleeps, so CPU time counts a rank's own work even when other jobs share
the cores); the runs measured so far are in docs/PERFORMANCE.md ("Expert
parallelism").  Then, in this process, the capacity table of
:func:`load_study`: dropped tokens per capacity factor 0.5 … 2.0 at
initialisation and after training with each auxiliary-loss coefficient
(``--capacity-steps 0`` skips it; :func:`format_study` prints it).

:func:`measure_traffic` runs a few EP steps in one launch and returns every
rank's counted bytes per grid axis next to the formulas (notebook 08).
"""

from __future__ import annotations

import json
import statistics
import sys
import time
from typing import Any

from minipar.bench.dp import add_bench_arguments, check_bench_options
from minipar.cli.options import ArgumentParser, integer, number

PROG = "minipar bench ep"


def _traffic(comm: Any, spec: Any, ep: int | None) -> dict[str, Any] | None:
    from minipar.comm.topology import Grid
    from minipar.parallel import loop, strategies
    from minipar.plan.moe import moe_alltoall_bytes_per_rank

    grid = Grid(comm, dp=comm.size, ep=ep or comm.size)
    eng = strategies.build("ep", spec, grid)
    loop.train(eng, spec.batch_at, spec.steps)
    lo, hi = eng.rows
    plan = spec.layers * moe_alltoall_bytes_per_rank(
        (hi - lo) * spec.seq, spec.d_model, grid.size("ep"), spec.top_k, spec.experts,
        spec.capacity_factor, bytes_per_elem=eng.itemsize, backward=True)
    row = {"bytes_by_axis": eng.bytes_by_axis(), "bytes_formula": eng.bytes_formula(),
           "alltoall_data_bytes": eng.alltoall_data_bytes(), "plan_formula": plan,
           "capacity": eng.caps[grid.coord("ep")], "experts": eng.experts,
           "tokens_per_expert": [s["tokens_per_expert"] for s in eng.stats[-1]],
           "dropped": sum(s["dropped"] for s in eng.stats[-1])}
    eng.close()
    grid.free()
    rows = comm.comm.gather(row)
    return {"ranks": comm.size, "ep": grid.size("ep"), "per_rank": rows} if comm.rank == 0 \
        else None


def _worker(o: dict[str, Any]) -> dict[str, Any] | None:
    """Rank side: ``o["mode"]`` "traffic" (:func:`measure_traffic`) or "time"."""
    from mpi4py import MPI

    from minipar.comm import TracedComm
    from minipar.comm.topology import Grid
    from minipar.parallel import strategies
    from minipar.parallel.common import RunSpec

    comm = TracedComm()
    spec = RunSpec(**o["spec"])
    if o["mode"] == "traffic":
        return _traffic(comm, spec, o.get("ep"))
    if o["mode"] == "balance":
        return _balance(comm, spec, o.get("progress"))
    from minipar.progress import tick

    ep = strategies.build("ep", spec, Grid(comm, dp=comm.size, ep=comm.size))
    # ep = 1: every rank holds every expert, no all-to-all
    dp = strategies.build("ep", spec, Grid(comm, dp=comm.size, ep=1))
    alone: dict[str, Any] = {}
    if comm.rank == 0:  # the 1-rank runs, on rank 0 while the others wait
        moe = strategies.build("ep", spec, Grid(MPI.COMM_SELF))
        alone["MoE, 1 rank"] = lambda r: moe.step(spec.batch_at(r))
        dense = strategies.build("serial", spec.with_(experts=0))
        alone["dense, 1 rank"] = lambda r: dense.step(spec.batch_at(r))
    names = ["MoE, 1 rank", "dense, 1 rank", f"MoE, EP on {comm.size} ranks",
             f"MoE, DP on {comm.size} ranks"]
    times: dict[str, list[tuple[float, float]]] = {k: [] for k in names}
    for r in range(o["steps"] + 1):  # interleaved rounds; round 0 is the warm-up
        row = {names[2]: _timed(lambda r=r: ep.step(spec.batch_at(r)), comm),
               names[3]: _timed(lambda r=r: dp.step(spec.batch_at(r)), comm)}
        for name in names[:2]:
            comm.Barrier()
            if comm.rank == 0:
                row[name] = _timed(lambda name=name, r=r: alone[name](r))
        if r and comm.rank == 0:
            for k, v in row.items():
                times[k].append(v)
        if comm.rank == 0:
            tick(o.get("progress"))
    comm.Barrier()
    if comm.rank != 0:
        return None
    return {"seconds": {k: statistics.median(w for w, _ in v) for k, v in times.items()},
            "cpu_seconds": {k: statistics.median(c for _, c in v) for k, v in times.items()},
            "psi": {"MoE": ep_psi(spec), "dense": ep_psi(spec.with_(experts=0))},
            "active_psi": {"MoE": active_psi(spec), "dense": ep_psi(spec.with_(experts=0))}}


#: the balance study's configurations: (load balance, capacity factor), name
BALANCE_RUNS = (("aux", 1.25), ("loss-free", 1.25), ("none", 1.25),
                ("aux", None), ("loss-free", None), ("none", None))


def _balance(comm: Any, spec: Any, progress: Any = None) -> dict[str, Any] | None:
    """Rank side of :func:`balance_study`: every configuration of :data:`BALANCE_RUNS` on the
    same model, data and grid (ep = all ranks), one after the other."""
    from minipar.comm.topology import Grid
    from minipar.parallel import strategies
    from minipar.progress import tick

    out = []
    for lb, cf in BALANCE_RUNS:
        s = spec.with_(load_balance=lb, capacity_factor=cf)
        grid = Grid(comm, dp=comm.size, ep=comm.size)
        eng = strategies.build("ep", s, grid)
        seconds, losses = [], []
        for step in range(s.steps):
            w, _ = _timed(lambda step=step: losses.append(eng.step(s.batch_at(step)).loss), comm)
            seconds.append(w)
        val = sum(eng.evaluate(s.eval_batch_at(k)) for k in range(2)) / 2
        dropped = comm.comm.allreduce(sum(x["dropped"] for st in eng.stats for x in st))
        a2a = comm.comm.allreduce(eng.bytes_by_axis()["ep"])  # all ranks, per step
        vio = [sum(v.values()) / len(v) for v in eng.bias.max_vio]
        out.append({"load_balance": lb, "capacity_factor": cf, "max_vio": vio,
                    "val_loss": float(val), "train_loss": losses, "dropped": int(dropped),
                    "assignments": s.batch * s.seq * s.top_k * len(eng.bias.moe_blocks)
                    * s.steps, "alltoall_bytes_per_step": float(a2a),
                    "step_seconds": statistics.median(seconds[1:] or seconds)})
        eng.close()
        grid.free()
        if comm.rank == 0:
            tick(progress)
    return {"runs": out} if comm.rank == 0 else None


def balance_study(n: int = 2, steps: int = 100, experts: int = 8, top_k: int = 2,
                  timeout: float = 900.0, progress: Any = None, **spec: Any) -> dict[str, Any]:
    """Aux loss vs loss-free vs none, capacity 1.25 vs dropless, on the embedded text and the
    same MoE GPT (sigmoid router, E = ``experts``, top-``top_k``), ep = ``n`` ranks in one
    launch: per configuration MaxVio per step (mean over the MoE layers), the validation
    loss, the dropped assignments, the all-to-all bytes of all ranks per step and the
    median step time."""
    from minipar import launch
    from minipar.parallel.common import EMBEDDED, RunSpec

    s = RunSpec(**{"text": EMBEDDED, "vocab": 256, "seq": 32, "batch": 16, "d_model": 32,
                   "layers": 2, "heads": 2, "lr": 3e-3, "router": "sigmoid",
                   "bias_update_rate": 1e-3, **spec, "experts": experts, "top_k": top_k,
                   "steps": steps})
    out, _ = launch.run_json(n, "minipar.bench.ep", {"mode": "balance", "spec": s.as_dict(),
                                                     "progress": progress},
                             timeout=timeout, check=True)
    out["config"] = {k: v for k, v in s.as_dict().items() if k != "text"} | {"ranks": n}
    return out


def format_balance(study: dict[str, Any]) -> str:
    """The balance study as a table, one row per configuration: MaxVio (mean over the MoE
    layers) averaged over the first and the last tenth of the steps, and the rest."""
    lines = [f"{'balance':>10} {'capacity':>9} {'MaxVio 1st 10%':>14} {'last 10%':>9} "
             f"{'val loss':>9} {'dropped':>8} {'a2a B/step':>11} {'s/step':>7}"]
    for r in study["runs"]:
        cf = "dropless" if r["capacity_factor"] is None else f"{r['capacity_factor']:g}"
        v = r["max_vio"]
        n = max(1, len(v) // 10)
        lines.append(f"{r['load_balance']:>10} {cf:>9} {sum(v[:n]) / n:>14.3f} "
                     f"{sum(v[-n:]) / n:>9.3f} {r['val_loss']:>9.4f} "
                     f"{100 * r['dropped'] / r['assignments']:>7.2f}% "
                     f"{r['alltoall_bytes_per_step']:>11,.0f} {r['step_seconds']:>7.3f}")
    return "\n".join(lines)


def _timed(fn: Any, comm: Any = None) -> tuple[float, float]:
    """(wall, CPU) seconds of ``fn()``; with ``comm``, the ranks start together and each
    figure is the slowest rank's.  CPU time counts only this process's work (waits poll
    with sleeps), so it stays meaningful when other jobs share the cores."""
    if comm is not None:
        comm.Barrier()
    t0, c0 = time.perf_counter(), time.process_time()
    fn()
    t = (time.perf_counter() - t0, time.process_time() - c0)
    if comm is not None:
        from mpi4py import MPI

        t = tuple(comm.comm.allreduce(v, op=MPI.MAX) for v in t)
    return t


def ep_psi(spec: Any) -> int:
    """All parameters of ``spec``'s GPT."""
    from minipar.nn import GPT

    return GPT(spec.config()).n_params()


def active_psi(spec: Any) -> int:
    """Parameters one token uses: all but the experts it is not routed to (k of E)."""
    if not spec.experts:
        return ep_psi(spec)
    d, f = spec.d_model, 4 * spec.d_model
    expert = d * f + f + f * d + d
    return ep_psi(spec) - spec.layers * (spec.experts - spec.top_k) * expert


def measure_traffic(n: int, ep: int | None = None, experts: int = 4, top_k: int = 1,
                    capacity_factor: float = 1.25, steps: int = 1, timeout: float = 120.0,
                    **spec: Any) -> dict[str, Any]:
    """A few EP steps on ``n`` ranks in one launch; per rank the bytes counted per grid axis
    per step, the exact formula, ``minipar.plan.moe``'s figure and the routing of the last
    step.  ``spec``: other :class:`~minipar.parallel.common.RunSpec` fields."""
    from minipar import launch
    from minipar.parallel.common import RunSpec
    from minipar.parallel.expert_parallel.options import check_ep

    s = RunSpec(**{"batch": max(8, n), **spec, "experts": experts, "top_k": top_k,
                   "capacity_factor": capacity_factor, "steps": steps})
    check_ep(experts, top_k, capacity_factor, n if ep is None else ep, n)
    out, _ = launch.run_json(n, "minipar.bench.ep", {"mode": "traffic", "spec": s.as_dict(),
                                                     "ep": ep}, timeout=timeout, check=True)
    return out


def load_study(experts: int = 4, top_k: int = 1, steps: int = 150,
               aux_loss_coefs: tuple[float, ...] = (0.0, 0.01),
               factors: tuple[float, ...] | None = None,
               train_capacity_factor: float = 1.25, d_model: int = 32, layers: int = 2,
               heads: int = 2, vocab: int = 10, seq: int = 16, batch: int = 32,
               lr: float = 3e-3, seed: int = 0, eval_step: int = 10_000) -> dict[str, Any]:
    """Routing tables before and after training the serial MoE GPT (float64, AdamW) with
    each auxiliary-loss coefficient α in ``aux_loss_coefs``, on the held-out batch of
    step ``eval_step`` of the modular-sum data; ``factors``: the capacity factors of the
    tables (default :data:`~minipar.parallel.expert_parallel.measure.CAPACITY_FACTORS`).

    The tables are :func:`minipar.parallel.expert_parallel.measure.routing_table`'s, the
    training the serial loop's (:func:`minipar.train.train`).  Returns ``{"config",
    "before", "after": {α: table}, "losses": {α: [float]}, "drop_rate_at_1.25":
    {"before": x, α: x}}`` (the last only if 1.25 is a factor)."""
    from dataclasses import asdict, replace

    from minipar.data import synthetic
    from minipar.nn import GPT, GPTConfig
    from minipar.parallel.expert_parallel.measure import CAPACITY_FACTORS, routing_table
    from minipar.train import gpt_task, train

    factors = CAPACITY_FACTORS if factors is None else factors
    base = GPTConfig(vocab_size=vocab, block_size=seq, n_layer=layers, n_head=heads,
                     d_model=d_model, n_experts=experts, top_k=top_k,
                     capacity_factor=train_capacity_factor)
    tokens, _ = synthetic.modular_sum(0, eval_step, batch, seq, vocab)
    out: dict[str, Any] = {"config": {**asdict(base), "steps": steps, "lr": lr, "batch": batch,
                                      "seed": seed, "eval_step": eval_step},
                           "before": routing_table(base, GPT(base).init(seed), tokens, factors),
                           "after": {}, "losses": {}}
    for alpha in aux_loss_coefs:
        cfg = replace(base, aux_loss_coef=float(alpha))
        run = train(GPT(cfg), gpt_task(vocab, seq, batch), steps, "float64", "adamw", seed,
                    lr=lr)
        out["after"][float(alpha)] = routing_table(cfg, run["states"].param_views(), tokens,
                                                   factors)
        out["losses"][float(alpha)] = [float(v) for v in run["losses"]]
    if 1.25 in factors:
        i = list(factors).index(1.25)
        out["drop_rate_at_1.25"] = {"before": out["before"][i]["drop_rate"],
                                    **{a: t[i]["drop_rate"] for a, t in out["after"].items()}}
    return out


def format_study(study: dict[str, Any]) -> str:
    """The study as a table: drop rate and imbalance per capacity factor, per state."""
    states = [("init", study["before"])] + [(f"a={a:g}", t) for a, t in study["after"].items()]
    factors = [r["capacity_factor"] for r in study["before"]]
    lines = [("dropped tokens (% of assignments) by capacity factor; imbalance = max/mean "
             "first choices per expert (1 = balanced), worst MoE block"),
             f"{'router':>8} {'imbalance':>9} " + " ".join(f"{f'cf {f:g}':>8}" for f in factors)]
    for name, table in states:
        lines.append(f"{name:>8} {table[0]['imbalance']:>9.2f} "
                     + " ".join(f"{100 * r['drop_rate']:>7.2f}%" for r in table))
    return "\n".join(lines)


def _parser() -> ArgumentParser:
    p = ArgumentParser(prog=PROG, description=__doc__.split("\n")[0])
    add_bench_arguments(p)
    p.add_argument("--experts", type=integer(1), default=4,
                   help="experts per MoE block, divisible by -n (default %(default)s)")
    p.add_argument("--top-k", type=int, choices=(1, 2), default=1,
                   help="experts per token, 1 (Switch) or 2 (GShard); default %(default)s")
    p.add_argument("--capacity-factor", type=number(greater_than=0), default=1.25,
                   help="expert capacity factor (default %(default)s)")
    p.add_argument("--balance", action="store_true",
                   help="instead: DeepSeek-V3's balancing study on the embedded text: aux loss "
                        "vs loss-free vs none, capacity 1.25 vs dropless (MaxVio, validation "
                        "loss, dropped tokens, bytes, step time); --steps steps each")
    p.add_argument("--bias-update-rate", type=number(greater_than=0), default=1e-3,
                   help="with --balance: the loss-free bias step u (default %(default)s)")
    p.add_argument("--capacity-steps", type=integer(0), default=400,
                   help="training steps of the capacity table's model, per aux-loss "
                        "coefficient (0: no table; default %(default)s)")
    return p


def main(argv: list[str]) -> int:
    from minipar import launch

    p = _parser()
    a = p.parse_args(argv)
    if a.balance:
        return _main_balance(a, p)
    try:
        spec = check_bench_options(vars(a)).with_(
            experts=a.experts, top_k=a.top_k, capacity_factor=a.capacity_factor)
        from minipar.parallel.expert_parallel.options import check_ep

        check_ep(a.experts, a.top_k, a.capacity_factor, a.ranks, a.ranks)
    except ValueError as e:
        p.error(str(e).replace("--ep", "-n"))
    from minipar.progress import watched

    try:
        with watched(a.steps + 1, "round") as progress:
            out, _ = launch.run_json(a.ranks, "minipar.bench.ep",
                                     {"mode": "time", "spec": spec.as_dict(), "steps": a.steps,
                                      "progress": progress}, timeout=a.timeout, check=True)
    except launch.LaunchError as e:
        return launch.report(PROG, e, a.debug)
    study = None
    if a.capacity_steps:
        study = load_study(a.experts, a.top_k, a.capacity_steps,
                           aux_loss_coefs=(0.0, 0.01, 0.1))
        out["capacity"] = {k: study[k] for k in ("config", "before", "drop_rate_at_1.25")}
        out["capacity"]["after"] = {str(k): v for k, v in study["after"].items()}
        out["capacity"]["drop_rate_at_1.25"] = {
            str(k): v for k, v in study["drop_rate_at_1.25"].items()}
    sec, cpu = out["seconds"], out["cpu_seconds"]
    ep_name = f"MoE, EP on {a.ranks} ranks"
    out["speedup"] = sec["MoE, 1 rank"] / sec[ep_name]
    out["cpu_speedup"] = cpu["MoE, 1 rank"] / cpu[ep_name]
    dp_name = f"MoE, DP on {a.ranks} ranks"
    out["ep_vs_dp"] = sec[dp_name] / sec[ep_name]
    out["cpu_ep_vs_dp"] = cpu[dp_name] / cpu[ep_name]
    if a.json:
        print(json.dumps(out, indent=2))
        return 0
    print(f"GPT d_model {a.d_model}, {a.layers} layers, T {a.seq}, global batch {a.batch}, "
          f"{a.precision}; E = {a.experts}, top-{a.top_k}, capacity factor "
          f"{a.capacity_factor:g}; median of {a.steps} steps, slowest rank")
    print(f"parameters: MoE {out['psi']['MoE']:,} ({out['active_psi']['MoE']:,} active per "
          f"token), dense {out['psi']['dense']:,}")
    print(f"{'':>20} {'wall s/step':>12} {'speed-up':>9} {'CPU s/step':>11} {'speed-up':>9}")
    for name in sec:
        print(f"{name:>20} {sec[name]:>12.3f} {sec['MoE, 1 rank'] / sec[name]:>8.2f}x "
              f"{cpu[name]:>11.3f} {cpu['MoE, 1 rank'] / cpu[name]:>8.2f}x")
    print(f"speed-up of expert parallelism on {a.ranks} ranks: {out['speedup']:.2f}x wall, "
          f"{out['cpu_speedup']:.2f}x CPU of the slowest rank (ideal {a.ranks}x on {a.ranks} ranks; "
          "wall time needs idle cores, CPU time does not count other jobs)")
    print(f"each of the {a.ranks} ranks trains on 1/{a.ranks} of the batch in both N-rank runs: "
          f"EP against pure data parallelism (every rank all {a.experts} experts, no "
          f"all-to-all): {out['ep_vs_dp']:.2f}x wall, {out['cpu_ep_vs_dp']:.2f}x CPU: EP sends "
          f"tokens instead of all-reducing the experts' gradients, and each rank holds and "
          f"updates 1/{a.ranks} of the experts")
    if study is not None:
        print(f"\nserial MoE GPT (d 32, {a.capacity_steps} steps per router, E = {a.experts}, "
              f"top-{a.top_k}), a held-out batch of 512 tokens as one group:")
        print(format_study(study))
    return 0


def _main_balance(a: Any, p: Any) -> int:
    """``minipar bench ep --balance``: :func:`balance_study`, printed or as JSON."""
    from minipar import launch
    from minipar.progress import watched

    experts = a.experts if a.experts != 4 else 8
    top_k = max(2, a.top_k)
    if experts % a.ranks:
        p.error(f"-n {a.ranks} does not divide --experts {experts}")
    try:
        with watched(len(BALANCE_RUNS), "run") as progress:
            out = balance_study(a.ranks, a.steps, experts, top_k, a.timeout, progress,
                                bias_update_rate=a.bias_update_rate)
    except launch.LaunchError as e:
        return launch.report(PROG, e, a.debug)
    if a.json:
        print(json.dumps(out, indent=2))
        return 0
    c = out["config"]
    print(f"embedded text, GPT d_model {c['d_model']}, {c['layers']} layers, T {c['seq']}, "
          f"batch {c['batch']}; E = {experts}, top-{top_k}, sigmoid router, ep = {a.ranks}; "
          f"{a.steps} steps each (bias rate {c['bias_update_rate']:g}, aux α "
          f"{c['aux_loss_coef']:g})")
    print(format_balance(out))
    return 0


if __name__ == "__main__":
    from minipar import launch

    if launch.is_worker(sys.argv[1:]):
        sys.exit(launch.serve(_worker, sys.argv[1:]))
    sys.exit(main(sys.argv[1:]))
