"""``minipar bench pp``: pipeline throughput against the serial run, and the bubble measured.

EN pipeline-parallel throughput · RU пропускная способность конвейера · ZH 流水线并行吞吐量

The same GPT and global batch, one BLAS thread per process: once as the
serial training step, once as a pipeline of p stages on p ranks
(:class:`minipar.parallel.pipeline.engine.PipelineParallel`, default 2
stages, m = 8 micro-batches, 1F1B).  A stage computes half the model, so
with no bubble the pipeline would be p times faster; GPipe and 1F1B idle the
share (p − 1)/(m + p − 1) of the step (Huang et al. 2018, arXiv 1811.06965;
Narayanan et al. 2021, arXiv 2104.04473), so the best a 2-stage, 8-micro-batch
pipeline can do is

    speed-up = t_serial / t_pp  ≈  p · m/(m + p − 1) = 1.78      (target >= 1.5)

less what the messages and the smaller matrix products of a micro-batch cost.
The bubble is measured on each timed step from the recorded timeline
(:mod:`minipar.parallel.pipeline.measure`): the wall-clock trace and the
dedicated-machine timeline rebuilt from the measured costs, next to the
formula.  The default model (d_model 256, 4 layers, T 64, batch 32, a small
vocabulary so that the head does not unbalance the stages) gives each stage
well over 50 ms of compute per step.  Serial and pipeline launches alternate
``--rounds`` times; the best time of each is compared (noise only adds time).

On a machine shared with other work the wall-clock ratio measures the load as
much as the pipeline, so a second figure is made of CPU seconds, which waiting
for a core does not inflate: the serial step's ``process_time``, against the
pipeline's timeline rebuilt from each instruction's ``process_time`` (what a
dedicated core per stage would take, messages free) — the speed-up on a
dedicated machine, measured.  The serial step is also timed as m micro-batches
with their gradients added (the pipeline's own arithmetic): on a CPU a
micro-batch's activations fit the caches better than the whole batch's, which
the pipeline gains as well, and this second ratio leaves that gain out.

``--experts E --ep K`` (a mixture of experts over K pipeline replicas, the hybrid's EP
stages: -n × K ranks): the experts' all-to-all joins the messages of ``hidden_fraction``
and is reported alone (``hidden_fraction_a2a``, with ``overlapped_pairs``): in DualPipe's
overlapped pair one micro-batch's all-to-all travels while the other computes; 1F1B and
ZB-H1, run beside it, wait for theirs.
"""

from __future__ import annotations

import json
import os
import statistics
import sys
import time
from typing import Any

from minipar.cli.options import ArgumentParser, integer

PROG = "minipar bench pp"
#: the formula each schedule's bubble fraction is set against (equal stages)
FORMULAS = {"naive": "(p-1)/p", "interleaved": "(p-1)/(v·m+p-1)",
            "zb-h1": "(p-1)/(3m+p-1)", "zb-h2": "0 (m >= 2p-1)", "zb-v": "0 (m >= 2p-1)",
            "dualpipe": "(PP/2-1)(F&B+B-3W)/(that + m(F+B))",
            "dualpipev": "(PP/2-1)(F&B+B-3W)/(that + 2m(F+B))"}
#: DeepSeek-V3's schedules: measured against 1F1B and ZB-H1 in the same launch
DUALPIPE = ("dualpipe", "dualpipev")


def _spec(o: dict[str, Any]) -> Any:
    from minipar.parallel.common import RunSpec

    return RunSpec(vocab=o["vocab"], seq=o["seq"], d_model=o["d_model"], layers=o["layers"],
                   heads=o["heads"], batch=o["batch"], steps=o["steps"] + 1, lr=1e-3,
                   precision=o["precision"], experts=o.get("experts", 0),
                   top_k=o.get("top_k", 1))


def _serial(spec: Any, steps: int, m: int) -> dict[str, float]:
    """The serial step's wall and CPU seconds, on the whole batch (``""``) and as m
    micro-batches whose gradients are added (``"_accum"``: the pipeline's arithmetic)."""
    from minipar import spans
    from minipar.bench.dp import measure_step_time
    from minipar.precision import ModelStates

    model = spec.model()
    states = ModelStates(spec.precision, spec.initial_params(), spec.optimizer,
                         **spec.opt_kwargs())
    out: dict[str, float] = {}
    for name, parts in (("", 1), ("_accum", m)):
        cpu: list[float] = []

        def step(s: int, parts: int = parts, cpu: list[float] = cpu) -> None:
            c0 = time.process_time()
            x, y = spec.global_batch(s)
            states.grads[...] = 0
            for i in range(parts):
                lo, hi = spans.span(len(x), parts, i)
                _, g = model.loss_and_grads(states.param_views(), x[lo:hi], y[lo:hi],
                                            (hi - lo) / len(x))
                states.grads += states.layout.flatten(g)
            states.step()
            cpu.append(time.process_time() - c0)
        out["seconds" + name] = measure_step_time(step, steps)
        out["cpu_seconds" + name] = statistics.median(cpu[1:])
    return out


def _chunks(kind: str, v: int | None) -> int:
    """Model chunks per rank: ``--chunks`` for interleaved (default 2), 2 for zb-v, dualpipe
    and dualpipev, else 1."""
    if kind in ("zb-v", *DUALPIPE):
        return 2
    if kind == "interleaved":
        return 2 if v is None else v
    return 1


def _worker(o: dict[str, Any]) -> dict[str, Any] | None:
    """Rank side: time the serial step (1 rank) or the pipeline (p ranks); rank 0's figures."""
    from minipar.bench.dp import measure_step_time

    spec = _spec(o)
    if o["mode"] == "serial":
        return _serial(spec, o["steps"], o["micro_batches"])
    from minipar.comm import TracedComm
    from minipar.comm.topology import Grid
    from minipar.parallel.hybrid.engine import build
    from minipar.parallel.pipeline.engine import PipelineParallel
    from minipar.parallel.pipeline.measure import measured_bubble, rebuild
    from minipar.parallel.pipeline.simulate import COMPUTE_WHAT

    ep = o.get("ep", 1)  # the experts over ep pipeline replicas: the hybrid's EP stages
    grid = Grid(TracedComm(), pp=o["ranks"], dp=ep, ep=ep)
    out: dict[str, Any] = {}
    # the schedule asked for, and 1F1B on the same model in the same launch (the baseline)
    also = ("1f1b", "zb-h1") if o["schedule"] in DUALPIPE else ("1f1b",)
    for kind in dict.fromkeys((o["schedule"], *also)):
        v = _chunks(kind, o.get("chunks"))
        before, a2a_before = grid.bytes_by_axis()["pp_p2p"], grid.bytes_by_axis()["ep"]
        pp = (build(spec, grid, schedule=kind, micro_batches=o["micro_batches"], chunks=v)
              if ep > 1 else PipelineParallel(grid, spec, kind, o["micro_batches"], v))
        t = measure_step_time(lambda s, pp=pp: pp.step(spec.batch_at(s)), o["steps"],
                              grid.world)
        bubbles, work, spans, hidden, hidden_a2a = [], [], [], [], []
        args = (kind, o["ranks"], o["micro_batches"], v)
        for s in range(1, len(pp.records)):  # the timed steps (after the warm-up)
            recs = pp.gather_records(s)
            b = {k: float(x) for k, x in measured_bubble(recs, *args).items()
                 if k != "costs"}
            cpu = pp.gather_records(s, clock="cpu")  # durations free of waiting for a core
            mc = measured_bubble(cpu, *args)
            b["rebuilt_cpu"] = float(mc["rebuilt"])
            b["rebuilt_cpu_compute"] = float(mc["rebuilt_compute"])
            if "formula_measured" in mc:
                b["formula_measured_cpu"] = float(mc["formula_measured"])
            dedicated = rebuild(cpu, *args)
            spans.append(max(r.end for r in dedicated) - min(r.start for r in dedicated))
            bubbles.append(b)
            hidden.append(grid.world.comm.allgather(pp.hidden_fraction(s)))
            hidden_a2a.append(grid.world.comm.allgather(pp.hidden_fraction(s, a2a=True)))
            work.append([sum(r.end - r.start for r in cpu if r.stage == st
                             and r.what in COMPUTE_WHAT) for st in range(o["ranks"])])
        w_peak = grid.world.comm.allgather(pp.w_peak_bytes)
        act = grid.world.comm.allgather(pp.activation_peak_bytes)
        out[kind] = {"seconds": t, "bubbles": bubbles, "chunks": v,
                     "cpu_step_seconds": statistics.median(spans),
                     "stage_compute_s": [statistics.median(w[st] for w in work)
                                         for st in range(o["ranks"])],
                     "w_peak_bytes": w_peak, "activation_peak_bytes": act,
                     "hidden_fraction": _hidden(hidden),
                     "hidden_fraction_a2a": _hidden(hidden_a2a),
                     "overlapped_pairs": pp.overlapped_pairs[-1],
                     "bytes_a2a_per_step": (grid.bytes_by_axis()["ep"] - a2a_before)
                     / len(pp.records),
                     "bytes_p2p_per_step": (grid.bytes_by_axis()["pp_p2p"] - before)
                     / len(pp.records)}
        del pp
    if grid.rank != 0:
        return None
    return {**out[o["schedule"]], "baseline": out.get("1f1b"), "baseline_zb": out.get("zb-h1")}


def _hidden(steps: list[list[float | None]]) -> float | None:
    """The median over the timed steps of the ranks' mean share of message time hidden
    behind computing (:func:`minipar.overlap.hidden_fraction`; None: nothing sent)."""
    means = [sum(h for h in hs if h is not None) / sum(h is not None for h in hs)
             for hs in steps if any(h is not None for h in hs)]
    return statistics.median(means) if means else None


def _median(rows: list[dict[str, Any]], key: str) -> float | None:
    """The median of ``key`` over the rounds that sent something (None: none did)."""
    return statistics.median([r[key] for r in rows if r[key] is not None] or [None])


def run_bench(o: dict[str, Any]) -> dict[str, Any]:
    """Serial and pipeline launches, alternating ``o["rounds"]`` times; the figures."""
    from minipar import launch

    res: dict[str, list[dict[str, Any]]] = {"serial": [], "pp": []}
    load0 = os.getloadavg()[0]
    for _ in range(o["rounds"]):
        for mode, n in (("serial", 1), ("pp", o["ranks"] * o.get("ep", 1))):
            row, _ = launch.run_json(n, "minipar.bench.pp", {**o, "mode": mode}, check=True,
                                     timeout=o["timeout"])
            res[mode].append(row)
    ts = min(r["seconds"] for r in res["serial"])
    best = min(res["pp"], key=lambda r: r["seconds"])
    bubbles = [b for r in res["pp"] for b in r["bubbles"]]
    med = {k: statistics.median(b[k] for b in bubbles) for k in bubbles[0]}
    base = [r["baseline"] for r in res["pp"] if r.get("baseline")]
    base_b = [b for r in base for b in r["bubbles"]]
    base_med = {k: statistics.median(b[k] for b in base_b) for k in base_b[0]} if base_b else None
    B = o["batch"]
    return {"stages": o["ranks"], "micro_batches": o["micro_batches"],
            "schedule": o["schedule"], "batch": B, "serial_s": ts, "pp_s": best["seconds"],
            "serial_samples_per_s": B / ts, "pp_samples_per_s": B / best["seconds"],
            "speedup": ts / best["seconds"],
            "speedup_dedicated": (min(r["cpu_seconds"] for r in res["serial"])
                                  / min(r["cpu_step_seconds"] for r in res["pp"])),
            "speedup_dedicated_vs_accum": (min(r["cpu_seconds_accum"] for r in res["serial"])
                                           / min(r["cpu_step_seconds"] for r in res["pp"])),
            "round_speedups": [a["seconds"] / b["seconds"] for a, b in zip(res["serial"],
                                                                           res["pp"])],
            "serial_accum_s": min(r["seconds_accum"] for r in res["serial"]),
            "serial_cpu_s": min(r["cpu_seconds"] for r in res["serial"]),
            "serial_accum_cpu_s": min(r["cpu_seconds_accum"] for r in res["serial"]),
            "pp_cpu_rebuilt_s": min(r["cpu_step_seconds"] for r in res["pp"]),
            "bubble_rebuilt": med["rebuilt"], "bubble_rebuilt_median": med["rebuilt_median"],
            "bubble_rebuilt_cpu": med["rebuilt_cpu"],
            "bubble_wall_clock": med["wall_clock"],
            "bubble_formula": med["formula"],
            "bubble_synced": med["rebuilt_synced"],
            "bubble_rebuilt_cpu_compute": med["rebuilt_cpu_compute"],
            "bubble_formula_measured": med.get("formula_measured_cpu"),
            "chunks": best["chunks"],
            "w_peak_bytes": best["w_peak_bytes"],
            "activation_peak_bytes": best["activation_peak_bytes"],
            "baseline_1f1b": None if base_med is None else {
                "pp_s": min(r["seconds"] for r in base),
                "bubble_wall_clock": base_med["wall_clock"],
                "bubble_rebuilt": base_med["rebuilt"],
                "bubble_rebuilt_cpu": base_med["rebuilt_cpu"],
                "bubble_rebuilt_cpu_compute": base_med["rebuilt_cpu_compute"],
                "bubble_formula": base_med["formula"],
                "activation_peak_bytes": base[0]["activation_peak_bytes"]},
            "hidden_fraction": _median(res["pp"], "hidden_fraction"),
            "hidden_fraction_a2a": _median(res["pp"], "hidden_fraction_a2a"),
            "overlapped_pairs": best["overlapped_pairs"], "ep": o.get("ep", 1),
            "experts": o.get("experts", 0), "bytes_a2a_per_step": best["bytes_a2a_per_step"],
            "baselines": {k: {"pp_s": min(r[key]["seconds"] for r in res["pp"]),
                              "hidden_fraction": _median([r[key] for r in res["pp"]],
                                                         "hidden_fraction"),
                              "hidden_fraction_a2a": _median([r[key] for r in res["pp"]],
                                                             "hidden_fraction_a2a"),
                              "overlapped_pairs": res["pp"][0][key]["overlapped_pairs"]}
                          for k, key in (("1f1b", "baseline"), ("zb-h1", "baseline_zb"))
                          if all(r.get(key) for r in res["pp"])},
            "stage_compute_s": best["stage_compute_s"],
            "bytes_p2p_per_step": best["bytes_p2p_per_step"],
            "load_average": [load0, os.getloadavg()[0]]}


def _parser() -> ArgumentParser:
    from minipar.bench.dp import add_bench_arguments
    from minipar.run.pp import SCHEDULES

    p = ArgumentParser(prog=PROG, description=__doc__.split("\n")[0])
    add_bench_arguments(p)
    p.set_defaults(vocab=64)
    p.add_argument("--micro-batches", type=integer(1), default=8, metavar="M",
                   help="micro-batches per step (default %(default)s)")
    p.add_argument("--schedule", choices=SCHEDULES, default="1f1b",
                   help="pipeline schedule (default %(default)s); any but 1f1b also runs "
                        "1f1b in the same launch, side by side (dualpipe, dualpipev: 1f1b and "
                        "zb-h1)")
    p.add_argument("--chunks", type=integer(1), default=None, metavar="V",
                   help="model chunks per rank: interleaved (default 2); zb-v has 2")
    p.add_argument("--rounds", type=integer(1), default=2,
                   help="alternating serial/pipeline rounds (default %(default)s)")
    p.add_argument("--experts", type=integer(0), default=0, metavar="E",
                   help="experts per block, a mixture of experts (default 0: dense)")
    p.add_argument("--top-k", type=integer(1), default=1, metavar="K",
                   help="with --experts: experts per token (default %(default)s)")
    p.add_argument("--ep", type=integer(1), default=1,
                   help="with --experts: expert parallelism over EP pipeline replicas, "
                        "-n x EP ranks (default 1: the experts in each stage); the "
                        "experts' all-to-all is in hidden_fraction, and alone in "
                        "hidden_fraction_a2a")
    return p


def check_options(o: dict[str, Any]) -> None:
    """The model and the partition, before MPI starts (ValueError naming the option)."""
    from minipar.parallel.pipeline.partition import check_pipeline

    spec = _spec(o)
    ep = o.get("ep", 1)
    if ep > 1 and (not o.get("experts") or o["experts"] % ep):
        raise ValueError(f"--ep {ep} must divide --experts {o.get('experts', 0)} (each "
                         "expert-parallel rank holds E/ep experts; try --experts "
                         f"{2 * ep} --ep {ep})")
    if o.get("top_k", 1) > max(o.get("experts", 0), 1):
        raise ValueError(f"--top-k {o['top_k']} is more than --experts {o.get('experts', 0)}")
    if o.get("chunks") is not None and o["schedule"] != "interleaved":
        raise ValueError(f"--chunks is for --schedule interleaved (zb-v has 2 chunks, the "
                         f"others 1), not {o['schedule']}")
    rows = spec.batch // ep  # a pipeline replica's rows
    check_pipeline(spec.layers, o["ranks"], o["micro_batches"], o["schedule"],
                   _chunks(o["schedule"], o.get("chunks")), rows=rows)
    if o["schedule"] != "1f1b":  # the baseline run in the same launch
        check_pipeline(spec.layers, o["ranks"], o["micro_batches"], "1f1b", rows=rows)


def main(argv: list[str]) -> int:
    from minipar import launch

    p = _parser()
    a = p.parse_args(argv)
    try:
        check_options(vars(a))
    except ValueError as e:
        p.error(str(e))
    try:
        row = run_bench(vars(a))
    except launch.LaunchError as e:
        return launch.report(PROG, e, a.debug)
    if a.json:
        print(json.dumps(row, indent=2))
        return 0
    p_, m = a.ranks, a.micro_batches
    print(f"GPT d_model {a.d_model}, {a.layers} layers, T {a.seq}, global batch {a.batch}, "
          f"vocab {a.vocab}, {a.precision}; {a.schedule}, {p_} stages, m = {m}")
    print(f"{'':>16} {'s/step':>8} {'samples/s':>10}")
    print(f"{'serial':>16} {row['serial_s']:>8.3f} {row['serial_samples_per_s']:>10.1f}")
    print(f"{'serial, ' + str(m) + ' parts':>16} {row['serial_accum_s']:>8.3f} "
          f"{a.batch / row['serial_accum_s']:>10.1f}")
    ranks = f"{p_} ranks" if row["ep"] == 1 else f"{p_}x{row['ep']} ranks"  # x ep replicas
    print(f"{'pipeline, ' + ranks:>16} {row['pp_s']:>8.3f} "
          f"{row['pp_samples_per_s']:>10.1f}")
    print(f"speed-up {row['speedup']:.2f}x (best of {a.rounds}; ideal p·m/(m+p-1) = "
          f"{p_ * m / (m + p_ - 1):.2f}, GPipe's bubble on {p_} ranks); per round: "
          + ", ".join(f"{x:.2f}" for x in row["round_speedups"]))
    print(f"on a dedicated machine (CPU seconds: the serial step {row['serial_cpu_s']:.3f}, "
          f"with {m} micro-batches accumulated {row['serial_accum_cpu_s']:.3f}; the pipeline's "
          f"timeline rebuilt from each instruction's CPU time {row['pp_cpu_rebuilt_s']:.3f}): "
          f"speed-up {row['speedup_dedicated']:.2f}x, {row['speedup_dedicated_vs_accum']:.2f}x "
          f"against the same micro-batches run serially")
    print(f"bubble (median of the timed steps): rebuilt {row['bubble_rebuilt']:.3f} (from "
          f"median costs {row['bubble_rebuilt_median']:.3f}, from CPU times "
          f"{row['bubble_rebuilt_cpu']:.3f}), wall clock {row['bubble_wall_clock']:.3f}, "
          f"formula {FORMULAS.get(a.schedule, '(p-1)/(m+p-1)')} = "
          f"{row['bubble_formula']:.3f}; above it by "
          + ", ".join(f"{row[k] - row['bubble_formula']:+.3f} {w}" for k, w in (
              ("bubble_rebuilt", "rebuilt"), ("bubble_rebuilt_median", "from median costs"),
              ("bubble_rebuilt_cpu", "from CPU times")))
          + " (the formula's stages are equal and never stall; unequal stages and stalls add to "
             "it)")
    if a.schedule.startswith("zb"):
        from minipar.plan.pipeline import zero_bubble_holds

        if not zero_bubble_holds(a.schedule, p_, m):
            need = "m >= p" if a.schedule == "zb-h1" else "m >= 2p-1"
            print(f"(Table 2 holds for {need} only: with m = {m} on {p_} stages its formula "
                  f"does not apply; compare with `minipar bubble --schedule {a.schedule} "
                  f"--stages {p_} --micro-batches {m}`, the simulator's bubble)")
        fm = row["bubble_formula_measured"]
        print(f"zero bubble (Qi et al. 2023; iteration = the longest stage's span): rebuilt "
              f"from median CPU compute costs, messages free, "
              f"{row['bubble_rebuilt_cpu_compute']:.3f}; Table 2 with the measured T_F, T_B, "
              f"T_W: " + (f"{fm:.3f} (gap {row['bubble_rebuilt_cpu_compute'] - fm:+.3f})"
                          if fm is not None else "given for equal costs only (0)")
              + f"; with every stage synchronised before the step: {row['bubble_synced']:.3f}"
              f" (what minipar keeps: each step ends with a loss all-reduce over every stage "
              f"and the next starts with a barrier; the found-inf check before the step only "
              f"with a loss scaler, mixed-fp16; the dp all-reduce joins one stage's replicas)")
        print("bytes kept only for W, peak per stage: "
              + ", ".join(f"{x:,}" for x in row["w_peak_bytes"])
              + "; activations, peak per stage: "
              + ", ".join(f"{x:,}" for x in row["activation_peak_bytes"]))
    b1 = row.get("baseline_1f1b")
    if b1:
        print(f"1F1B on the same launch: {b1['pp_s']:.3f} s/step; bubble wall clock "
              f"{b1['bubble_wall_clock']:.3f}, rebuilt {b1['bubble_rebuilt']:.3f}, from CPU "
              f"compute costs {b1['bubble_rebuilt_cpu_compute']:.3f}, formula "
              f"{b1['bubble_formula']:.3f}; activations, peak per stage: "
              + ", ".join(f"{x:,}" for x in b1["activation_peak_bytes"]))
    hf = row["hidden_fraction"]
    print(f"messages hidden behind computing (hidden_fraction, {a.schedule}): "
          + ("nothing sent" if hf is None else f"{hf:.2f}") + "".join(
              f"; {k}: {v['pp_s']:.3f} s/step, hidden " + (
                  "-" if v["hidden_fraction"] is None else f"{v['hidden_fraction']:.2f}")
              for k, v in row["baselines"].items()))
    if row["ep"] > 1:
        def share(x: float | None) -> str:
            return "-" if x is None else f"{x:.2f}"
        print(f"the experts' all-to-all alone ({row['experts']} experts over ep {row['ep']}, "
              f"{row['bytes_a2a_per_step']:,.0f} bytes per step from rank 0): hidden "
              f"{share(row['hidden_fraction_a2a'])} with {row['overlapped_pairs']} overlapped "
              "pairs taking turns per step" + "".join(
                  f"; {k}: {share(v['hidden_fraction_a2a'])}"
                  for k, v in row["baselines"].items())
              + " (one micro-batch's all-to-all in flight while the pair's other computes; "
                "outside a pair the layer waits for it)")
    print("compute per stage per step (CPU s): "
          + ", ".join(f"{x:.3f}" for x in row["stage_compute_s"])
          + f"; {row['bytes_p2p_per_step']:,.0f} bytes point-to-point sent by rank 0 per step; load "
          f"average {row['load_average'][0]:.1f} before, {row['load_average'][1]:.1f} after "
          f"(on {os.cpu_count()} cores)")
    return 0


if __name__ == "__main__":
    from minipar import launch

    if launch.is_worker(sys.argv[1:]):
        sys.exit(launch.serve(_worker, sys.argv[1:]))
    sys.exit(main(sys.argv[1:]))
