"""``minipar run pp``: pipeline parallelism, its options and its measurements.

EN pipeline parallelism · RU конвейерный параллелизм · ZH 流水线并行

    minipar run pp --schedule gpipe|1f1b|interleaved --micro-batches M [--chunks V]
                   [--balance 2,2] [--dp D] [--remat [K]] [--offload host|disk]
                   [--timeline FILE.json] -n P·D

``--remat`` alone is GPipe's re-materialisation (each stage keeps only its input
per micro-batch and recomputes its layers in backward); ``--remat K``: Chen et
al.'s segments of K units inside each stage.

Launcher side: every check of :func:`minipar.parallel.pipeline.partition.check_pipeline`
(more stages than layers, m < 1, a balance that does not sum to the layers,
interleaving with m not a multiple of p or layers not divisible by p·v) plus
``-n`` divisible by ``--dp``, before MPI starts.  Rank side:
:class:`~minipar.parallel.pipeline.engine.PipelineParallel` (GPipe, Huang et
al. 2018, arXiv 1811.06965; 1F1B and interleaved, Narayanan et al. 2021, arXiv
2104.04473) trains on a dp x pp grid, and the summary adds

* ``bubble_measured``: the last step's bubble fraction, wall clock and rebuilt on a
  dedicated machine from the measured costs (:mod:`minipar.parallel.pipeline.measure`;
  ``rebuilt_median``: each cost the median of its kind; ``rebuilt_cpu``: costs in CPU
  seconds), next to ``bubble_formula`` (r/(1 + r), r = (1/v)(p − 1)/m);
* ``activation_peak_bytes_per_stage`` (the stage's activation ledger) and
  ``in_flight_per_stage`` (micro-batches held at the peak);
* ``bytes_by_axis``: bytes per step each rank sent on ``pp_p2p`` (activations and
  their gradients) and ``dp`` (gradient all-reduce across pipeline replicas), the
  point-to-point bytes next to their exact figure and the schedule's figure: the busiest
  stage's sends counted from its instruction lists times b·s·h·bytes (1F1B 2·m, the
  plan's 2·m·v·b·s·h·bytes for interleaving; DualPipe 2·m, DualPipe-V and ZB-V 4·m on a
  middle stage: :func:`schedule_sends`).
"""

from __future__ import annotations

import argparse
import os
from typing import Any

from minipar.cli.options import integer, output_file

#: the schedules (:data:`minipar.parallel.pipeline.schedule.KINDS`)
SCHEDULES = ("naive", "gpipe", "1f1b", "interleaved", "zb-h1", "zb-h2", "zb-v", "dualpipe",
             "dualpipev")
#: the schedules whose ranks hold exactly 2 model chunks (``--chunks`` left out: 2)
TWO_CHUNKS = ("zb-v", "dualpipe", "dualpipev")
#: the model a pipeline needs by default: 4 blocks, so ``-n 4`` gives one block per stage
#: (RunSpec's default of 2 would refuse more than 2 stages)
MODEL_DEFAULTS = {"layers": 4}
#: r, the bubble over the ideal time, as the summary line writes it
_RATIO = {"naive": "p-1 (one micro-batch at a time)", "gpipe": "(p-1)/m", "1f1b": "(p-1)/m",
          "interleaved": "(1/v)(p-1)/m", "zb-h1": "(p-1)/(3m), T_F = T_B = T_W",
          "zb-h2": "0 for m >= 2p-1, T_F = T_B = T_W", "zb-v": "0 for m >= 2p-1, T_F = T_B = T_W",
          "dualpipe": "(PP/2-1)(F&B+B-3W) over m(F+B), F&B = F+B", "dualpipev":
          "(PP/2-1)(F&B+B-3W) over m(F+B), PP = 2p, F&B = F+B"}
#: how far above the formula the rebuilt bubble (median costs) may lie before a note says why
GAP = 0.02


def add_arguments(parser: argparse.ArgumentParser) -> None:
    from minipar.run import remat_offload

    g = parser.add_argument_group("pipeline parallelism")
    g.add_argument("--schedule", choices=SCHEDULES, default="1f1b",
                   help="gpipe (all forwards, then all backwards), 1f1b (PipeDream-Flush, "
                        "default), interleaved (v chunks per stage), naive (one at a time), "
                        "zb-h1, zb-h2, zb-v (zero bubble: backward split into B and W; zb-v: "
                        "2 chunks per stage in a V), dualpipe (DeepSeek-V3: micro-batches from "
                        "both ends, 2 copies of the model; -n and m even, m >= 2 x stages), "
                        "dualpipev (its V: PP = 2 x stages, m >= PP, --layers >= PP)")
    g.add_argument("--micro-batches", type=integer(1), default=None, metavar="M",
                   help="micro-batches per step (default 4; dualpipe, dualpipev: 2 x stages, "
                        "the fewest they run with)")
    g.add_argument("--chunks", type=integer(1), default=1, metavar="V",
                   help="model chunks per stage, with --schedule interleaved (default 1)")
    g.add_argument("--balance", default=None, metavar="L0,L1,...",
                   help="transformer blocks per (virtual) stage, e.g. 2,2 (default: even)")
    g.add_argument("--dp", type=integer(1), default=1, metavar="D",
                   help="data-parallel pipeline replicas; stages p = ranks / D (default 1)")
    g.add_argument("--timeline", type=output_file, default=None, metavar="FILE.json",
                   help="write the last step's recorded timeline (minipar bubble --from-run)")
    remat_offload.add_arguments(
        parser, remat_alone="each stage keeps only its input per micro-batch, GPipe's")


def _sizes(options: dict[str, Any]) -> tuple[int, int]:
    from minipar import checks

    n, dp = options["ranks"], options.get("dp", 1)
    checks.divides("--dp", dp, "-n", n, f"the pipeline replicas take equal numbers of ranks; "
                   f"use -n a multiple of {dp}")
    return n // dp, dp


def _cut(batch: int, dp: int, m: int) -> list[int]:
    from minipar import spans

    return [k for b in spans.counts(batch, dp) for k in spans.counts(b, m)]


def check(options: dict[str, Any], spec: Any) -> None:
    """Launcher side: the grid, the partition, the micro-batches; MoE's serial groups."""
    from minipar import spans
    from minipar.parallel.common import check_world
    from minipar.parallel.pipeline.partition import check_pipeline, parse_balance
    from minipar.run import remat_offload

    p, dp = _sizes(options)
    check_world(spec.batch, dp)
    m = micro_batches(options)
    remat = options.get("remat")
    check_pipeline(spec.layers, p, m, options.get("schedule", "1f1b"), _chunks(options),
                   parse_balance(options.get("balance")), spans.counts(spec.batch, dp)[-1],
                   True if remat == 0 else remat)
    remat_offload.check(options, spec)
    if spec.experts and _cut(spec.batch, dp, m) != spans.counts(spec.batch, dp * m):
        raise ValueError(f"with --experts each micro-batch routes its rows as one group, and "
                         f"the serial run cuts --batch {spec.batch} into {dp * m} groups "
                         f"another way: use a --batch divisible by --dp {dp}")


def micro_batches(options: dict[str, Any]) -> int:
    """--micro-batches, or its default: 4, and 2p (p = ranks / dp) for dualpipe and
    dualpipev, the fewest micro-batches they run with (DeepSeek's m >= 2p)."""
    if options.get("micro_batches") is not None:
        return options["micro_batches"]
    return 2 * _sizes(options)[0] if options.get("schedule") in ("dualpipe", "dualpipev") else 4


def _chunks(options: dict[str, Any]) -> int:
    """--chunks, or 2 for zb-v, dualpipe, dualpipev when it is left at its default (they
    hold 2 chunks a rank)."""
    v = options.get("chunks", 1)
    return 2 if options.get("schedule") in TWO_CHUNKS and v == 1 else v


def grid_sizes(options: dict[str, Any], spec: Any) -> dict[str, int]:
    """The grid: dp pipeline replicas of p = ranks / dp stages."""
    p, dp = _sizes(options)
    return {"dp": dp, "pp": p}


def engine_options(options: dict[str, Any], spec: Any) -> dict[str, Any]:
    """The pipeline engine's options (``--remat`` alone: GPipe's, ``True``)."""
    from minipar.parallel.pipeline.partition import parse_balance

    remat = options.get("remat")
    return {"schedule": options.get("schedule", "1f1b"),
            "micro_batches": micro_batches(options), "chunks": _chunks(options),
            "balance": parse_balance(options.get("balance")),
            "remat": True if remat == 0 else remat, "offload": options.get("offload"),
            "offload_dir": options.get("offload_dir") if options.get("offload") == "disk"
            else None}


def oversubscribed_note(ranks: int, cores: int, kind: str, p: int, m: int) -> str | None:
    """Why a measured bubble can contradict the lesson when the ranks outnumber the cores
    (None when they do not): what the rebuilt timeline removes, what it cannot, and where
    the schedule shows its gain."""
    if ranks <= cores:
        return None
    where = (f"`minipar bubble --schedule {kind} --stages {p} --micro-batches {m}` draws the "
             f"schedule with equal costs; `minipar run pp --schedule {kind} -n {cores}` or "
             "`minipar bench pp` (stages of >= 50 ms) measure it where it can win")
    return (f"{ranks} ranks on {cores} cores: a stage waits for a core as well as for its "
            "neighbours. The rebuilt timeline places each operation at its measured duration "
            "in the schedule's order, so it removes the waits between operations, but not the "
            "time-slicing inside them: every F, B and W is measured slower and unevenly, and a "
            "schedule that fills the bubble with more, smaller pieces (zero bubble's W's, "
            "interleaving's chunks) can measure above 1F1B here. " + where)


def report(pp: Any, grid: Any, options: dict[str, Any], spec: Any,
           history: Any) -> dict[str, Any] | None:
    """Rank side, after training: every rank's figures, gathered; rank 0 returns them."""
    from minipar.parallel.pipeline.measure import measured_bubble, write_timeline
    from minipar.parallel.pipeline.partition import chunk_units
    from minipar.parallel.pipeline.measure import in_flight
    from minipar.parallel.pipeline.schedule import stage_schedule
    from minipar.run.ep import balance_of, balance_report

    p, dp = grid.size("pp"), grid.size("dp")
    kind, m, v = pp.kind, pp.m, pp.v
    remat = options.get("remat")
    records = pp.gather_records()
    cpu = pp.gather_records(clock="cpu")  # durations in CPU seconds: free of waiting for a core
    steps = len(history.losses)
    mine = {"stage": pp.stage, "replica": pp.replica, "peak": pp.activation_peak_bytes,
            "w_peak": pp.w_peak_bytes,
            "axes": {k: b / steps for k, b in pp.traffic().items() if k in ("pp_p2p", "dp")},
            "exact": _exact_p2p(pp), "held": sum(pp.states.bytes_by_category().values()),
            "hidden": pp.hidden_fraction(), "in_flight": pp.comm_intervals[-1],
            "offload": pp.offload_stats, "balance": balance_of(pp.bias)}
    everyone = grid.world.comm.gather(mine, root=0)
    if grid.rank != 0:
        return None
    b = measured_bubble(records, kind, p, m, v)
    b["rebuilt_cpu"] = measured_bubble(cpu, kind, p, m, v)["rebuilt"]
    if options.get("timeline"):
        write_timeline(options["timeline"], records, kind, p, m, v)
    stages = sorted((e for e in everyone if e["replica"] == 0), key=lambda e: e["stage"])
    itemsize = pp.act_dtype.itemsize
    rows = spec.batch / dp / m
    sends = max(schedule_sends(kind, p, m, v))  # the busiest stage's, from the schedule
    formula = sends * rows * spec.seq * spec.d_model * itemsize
    notes = [(f"grid dp {dp} x pp {p}; schedule {kind}, m = {m} micro-batch{'es' * (m != 1)}"
              + (f", v = {v} chunks per stage" if v > 1 else "")
              + f"; blocks per {'virtual ' if v > 1 else ''}stage {pp.balance}"),
             (f"bubble (last step): rebuilt from measured costs {float(b['rebuilt']):.3f} "
              f"(from median costs {float(b['rebuilt_median']):.3f}, CPU times "
              f"{float(b['rebuilt_cpu']):.3f}), wall clock "
              f"{float(b['wall_clock']):.3f}, formula {float(b['formula']):.3f} "
              f"(r/(1+r), r = {_RATIO[kind]} = {float(b['formula_ratio']):.3f})"),
             ("activation bytes held at the peak per stage: "
              + ", ".join(f"{s['peak']:,}" for s in stages) + " (in flight: "
              + ", ".join(str(in_flight(stage_schedule(kind, s, p, m, v))) for s in range(p)) + ")"
              + (f"; on the device: what is on {options['offload']} is not counted"
                 if options.get("offload") else ""))]
    if kind.startswith("zb"):
        notes.append(f"zero bubble (Qi et al. 2023): iteration = the longest stage's span; "
                     f"rebuilt with every stage waiting for all before its step (minipar "
                     f"keeps the loss all-reduce after the step, a barrier before the next "
                     f"and, with a loss scaler, the found-inf check before it): "
                     f"{float(b['rebuilt_synced']):.3f}; bytes kept only for W (B done, W "
                     f"not), peak per stage: " + ", ".join(f"{s['w_peak']:,}" for s in stages))
    crowded = oversubscribed_note(grid.world.size, os.cpu_count() or 1, kind, p, m)
    if crowded:
        notes.append(crowded)
    if float(b["rebuilt_median"]) - float(b["formula"]) > GAP:
        notes.append("the rebuilt bubble is above the formula, which assumes equal stages: "
                     "here stage 0 also embeds the tokens and the last stage computes the loss, "
                     "and a tiny model's steps take well under a millisecond (stalls show); "
                     "minipar bench pp measures stages of >= 50 ms")
    if options.get("offload"):
        o = stages[0]["offload"]
        notes.append(f"activation offload to {options['offload']} (stage 0): "
                     f"{o['bytes_out']:,} bytes out, {o['bytes_back']:,} back, at most "
                     f"{o['peak_bytes']:,} there, {o['seconds'] * 1e3:.1f} ms moving")
    if remat == 0:
        notes.append("remat: GPipe's re-materialisation, each stage keeps only its input per "
                     "micro-batch and recomputes its layers in backward")
    elif remat is not None:
        fewest = min(chunk_units(pp.balance))
        notes.append(f"remat: segments of {remat} unit{'s' * (remat != 1)} in each stage, each "
                     "keeping only its input but the last, kept whole (Chen et al.)"
                     + (f"; a stage of {fewest} unit{'s' * (fewest != 1)} is one segment: "
                        "nothing recomputed there (--remat alone: GPipe's, keeps only its input)"
                        if remat >= fewest else ""))
    balance: dict[str, Any] = {}
    if spec.experts:
        notes.append(f"mixture of experts: every micro-batch routes its rows as one group, so "
                     f"the serial run accumulates dp·m = {dp * m} micro-batches cut the same way")
        balance = balance_report([e["balance"] for e in everyone], spec)
        notes += balance.pop("notes")
    hidden = [s["hidden"] for s in stages]
    if kind in ("dualpipe", "dualpipev"):
        notes.append("DualPipe's overlapped pairs (DeepSeek-AI 2024): each pair's receives "
                     "posted before it, its forward's send started before its backward, "
                     "messages tested between units; share of each rank's message time "
                     "hidden behind its computing (hidden_fraction): " + ", ".join(
                         "-" if h is None else f"{h:.2f}" for h in hidden))
    if options.get("timeline"):
        notes.append(f"timeline written to {options['timeline']} (minipar bubble --from-run)")
    return {
        "ranks": grid.world.size, "data_parallel_ranks": dp * m if spec.experts else dp,
        "schedule": kind, "stages": p, "dp": dp, **balance,
        "micro_batches": m, "chunks": v, "balance": pp.balance,
        "bubble_measured": {k: float(b[k]) for k in ("rebuilt", "rebuilt_median", "rebuilt_cpu",
                                                      "wall_clock", "rebuilt_ratio",
                                                      "wall_clock_ratio")},
        "bubble_formula": float(b["formula"]), "bubble_formula_ratio": float(b["formula_ratio"]),
        "activation_peak_bytes_per_stage": [s["peak"] for s in stages],
        "w_peak_bytes_per_stage": [s["w_peak"] for s in stages],
        "in_flight_per_stage": [in_flight(stage_schedule(kind, s, p, m, v)) for s in range(p)],
        "bytes_by_axis": [e["axes"] for e in everyone],
        "bytes_sent_per_rank": [e["axes"]["pp_p2p"] for e in everyone],
        "bytes_exact_per_rank": [e["exact"] for e in everyone],
        "bytes_exact_text": "activations forward + their gradients backward, every send",
        "bytes_formula": formula,
        "bytes_formula_text": _figure_text(kind, p, m, v, sends),
        "model_state_bytes_per_rank": [e["held"] for e in everyone],
        "records": [list(r) for r in records],
        "hidden_fraction_per_rank": hidden,
        "hidden_fraction": (None if all(h is None for h in hidden) else
                            sum(h for h in hidden if h is not None)
                            / sum(h is not None for h in hidden)),
        "messages_in_flight": [[s["stage"], a, b] for s in stages for a, b in s["in_flight"]],
        "notes": notes,
    }


def trace_events(summary: dict[str, Any]) -> list[dict[str, Any]]:
    """``--trace FILE.json``: the last step's records (every stage of replica 0) as
    Chrome trace events (:mod:`minipar.trace`)."""
    from minipar.trace import pipeline_events

    events = pipeline_events(summary["records"], name=f"pipeline {summary['schedule']}")
    t0 = min(r[4] for r in summary["records"])
    flights = [(st, "step start", None, None, t0, t0) for st in range(summary["stages"])] + \
        [(st, "message in flight", None, None, a, b)
         for st, a, b in summary.get("messages_in_flight", [])]
    return events + pipeline_events(flights, pid=1, name="messages in flight (sends and "
                                    "receives, from post to completion; hidden_fraction)")


def schedule_sends(kind: str, p: int, m: int, v: int = 1) -> list[int]:
    """Per stage, the activations and gradients it sends to another rank per step, counted
    from ``kind``'s instruction lists (a hand-off to itself not counted): 1F1B and GPipe
    2·m on a middle stage, interleaved 2·m·v, DualPipe 2·m (each micro-batch runs one of a
    rank's two chunks), DualPipe-V and ZB-V 4·m."""
    from minipar.parallel.pipeline.schedule import placement, stage_schedule
    from minipar.parallel.pipeline.simulate import message_key
    from minipar.parallel.pipeline.stage_loop import SendAct, SendGrad, rank_of

    place = placement(kind)
    return [sum(isinstance(i, (SendAct, SendGrad))
                and rank_of(message_key(i, st, p, place)[3], p, place) != st
                for i in stage_schedule(kind, st, p, m, v)) if p > 1 else 0 for st in range(p)]


def _figure_text(kind: str, p: int, m: int, v: int, sends: int) -> str:
    """The figure's formula in words: what the schedule sends on its busiest stage."""
    why = {"dualpipe": "DualPipe: each micro-batch runs one of a rank's two chunks",
           "dualpipev": "DualPipe-V: the V's two chunks, the turn at rank p − 1 in memory",
           "zb-v": "ZB-V: the V's two chunks, the turn at rank p − 1 in memory",
           "interleaved": "interleaved 1F1B: v chunks per rank (Narayanan et al. 2021)"}
    return (f"{sends} sends (= {sends / m:g}·m) of b·s·h x bytes, the busiest stage's, counted "
            f"from the {kind} schedule" + (f" ({why[kind]})" if kind in why else
                                          " (a middle stage's; the first and last send less)"))


def _exact_p2p(pp: Any) -> int:
    """Bytes this rank's sends carry per step: its micro-batch's rows x T x d x itemsize
    (a hand-off to itself — ZB-V's turn on the last rank — carries none)."""
    from minipar import spans
    from minipar.parallel.pipeline.stage_loop import SendAct, SendGrad, rank_of
    from minipar.parallel.pipeline.simulate import message_key

    rows = spans.counts(pp.spec.batch, pp.dp)[pp.replica]
    per_row = pp.spec.seq * pp.spec.d_model * pp.act_dtype.itemsize

    def remote(i: Any) -> bool:
        to = message_key(i, pp.stage, pp.p, pp.place)[3]
        return rank_of(to, pp.p, pp.place) != pp.stage
    half = pp.m // 2 if pp.place == "dual" else 0  # dualpipe: chunk 1 has the 2nd half

    def rows_of(i: Any) -> int:
        lo, hi = spans.span(rows, pp.m, i.mb + i.chunk * half)
        return hi - lo
    return sum(rows_of(i) * per_row for i in pp.instructions
               if isinstance(i, (SendAct, SendGrad)) and pp.p > 1 and remote(i))
