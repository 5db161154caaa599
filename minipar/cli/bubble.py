"""``minipar bubble``: a pipeline schedule's bubble, drawn and set against the papers' formula.

EN pipeline bubble · RU пузырь конвейера · ZH 流水线气泡

    minipar bubble --stages 4 --micro-batches 8 --schedule 1f1b
    minipar bubble --stages 4 --micro-batches 8 --schedule interleaved --chunks 2 --json
    minipar bubble --stages 4 --micro-batches 8 --schedule gpipe -o gpipe.png --trace gpipe.json
    minipar bubble --stages 4 --micro-batches 8 --schedule dualpipe --costs 1,2,1,2 --json
    minipar bubble --from-run timeline.json        # written by minipar run pp --timeline

From the theory, the schedule (:mod:`minipar.parallel.pipeline.schedule`) is
replayed by the simulator (:mod:`minipar.parallel.pipeline.simulate`) with
equal costs — a forward 1, a backward 2 per stage (per chunk 1/v and 2/v) —
and the bubble is exact.  Over P stages, with T
the time until the pipeline flush and C the summed forwards and backwards::

    bubble fraction = (P·T − C)/(P·T) = (p − 1)/(v·m + p − 1)
    bubble / ideal  = (P·T − C)/C     = (1/v)(p − 1)/m

GPipe (Huang et al. 2018, arXiv 1811.06965): (p − 1)/(m + p − 1);
1F1B and interleaved 1F1B (Narayanan et al. 2021, arXiv 2104.04473): the
same with v = 1 and v chunks per rank; the naive pipeline: (p − 1)/p.

From a recorded run (``--from-run FILE``: the JSON of ``minipar run pp
--timeline``; format in :func:`load_run`), two views: the wall clock, and
the timeline a dedicated machine would have, rebuilt by the simulator from
each instruction's measured cost and the schedule's dependencies
(:func:`minipar.parallel.pipeline.measure.rebuild`) — the one compared with
the formula — and, less sensitive to a core shared with other processes,
the same with each stage's fastest forward and backward (:func:`rebuild_fastest`).

``--costs F,B,W[,FB]`` sets the costs of one stage (one chunk for dualpipe and
dualpipev, each chunk a stage of their PP): F a forward, B the *whole* backward (its
input part B − W, its weight part W), FB DeepSeek's F&B, an overlapped forward and
backward (default F + B: one core computes one at a time); default ``1,2,1``.

Prints the text chart, the bubble and the formula; ``--json`` the numbers
(``bubble_fraction``, ``formula``, ``in_flight_max``, ``idle_per_rank`` in cost units,
...; for dualpipe and dualpipev ``formula`` is the DualPipe table's bubble
(PP/2 − 1)(F&B + B − 3W) and ``formula_value`` its value in cost units, ``formula_holds``
whether it is this schedule's idle, ``formula_gap`` the largest rank's idle minus it);
``-o FILE.png``
the Gantt chart (:mod:`minipar.viz.pipeline`); ``--trace FILE.json`` the
timeline as Chrome trace events for Perfetto (:mod:`minipar.trace`).  Bad
input is one line and exit 2.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Sequence
from fractions import Fraction
from pathlib import Path
from typing import Any

from minipar.cli.options import ArgumentParser, error_line, integer, output_file
from minipar.parallel.pipeline.schedule import KINDS

PROG = "minipar bubble"
MAX_STAGES, MAX_MICRO_BATCHES, MAX_CHUNKS = 64, 1024, 16
#: the text chart is printed up to this many time cells (two characters each)
MAX_CHART_CELLS = 120
NAMES = {"naive": "naive pipeline", "gpipe": "GPipe", "1f1b": "1F1B (PipeDream-Flush)",
         "interleaved": "interleaved 1F1B", "zb-h1": "ZB-H1 (zero bubble, handcrafted 1)",
         "zb-h2": "ZB-H2 (zero bubble, handcrafted 2)", "zb-v": "ZB-V (zero bubble, a V of 2 "
         "chunks)", "dualpipe": "DualPipe (DeepSeek-V3, both directions)",
         "dualpipev": "DualPipe-V (DeepSeek-V3's DualPipe cut in half, a V)"}
#: bubble fraction and bubble / ideal time, as the papers write them
FORMULA = {"naive": ("(p - 1)/p", "p - 1"),
           "gpipe": ("(p - 1)/(m + p - 1)", "(p - 1)/m"),
           "1f1b": ("(p - 1)/(m + p - 1)", "(p - 1)/m"),
           "interleaved": ("(p - 1)/(v*m + p - 1)", "(p - 1)/(v*m)"),
           # Qi et al. 2023, Table 2 with T_F = T_B = T_W (bubble (p-1)(T_F+T_B-T_W) for ZB-H1)
           "zb-h1": ("(p - 1)/(3m + p - 1)", "(p - 1)/(3m)"),
           "zb-h2": ("0 (m >= 2p - 1)", "0"), "zb-v": ("0 (m >= 2p - 1)", "0"),
           # the DualPipe repository's table: the bubble itself, in cost units
           "dualpipe": ("(PP/2 - 1)(F&B + B - 3W), PP = p", "bubble / m(F + B)"),
           "dualpipev": ("(PP/2 - 1)(F&B + B - 3W), PP = 2p", "bubble / 2m(F + B)")}
PAPER = {"naive": "Huang et al. 2018", "gpipe": "Huang et al. 2018",
         "1f1b": "Narayanan et al. 2021", "interleaved": "Narayanan et al. 2021",
         "zb-h1": "Qi et al. 2023, Table 2", "zb-h2": "Qi et al. 2023, Table 2",
         "zb-v": "Qi et al. 2023", "dualpipe": "DeepSeek's DualPipe table",
         "dualpipev": "DeepSeek's DualPipe table"}
#: the schedules whose ranks hold exactly 2 chunks
TWO = ("zb-v", "dualpipe", "dualpipev")
DUAL = ("dualpipe", "dualpipev")
#: --costs left out: F 1, B 2 (whole backward), W 1
COSTS = (1, 2, 1, None)


def formula(kind: str, p: int, m: int, v: int = 1) -> tuple[Fraction, Fraction]:
    """(bubble fraction, bubble / ideal time) of ``kind``, exact
    (:func:`minipar.plan.pipeline.bubble_formula`)."""
    from minipar.plan.pipeline import bubble_formula

    f = bubble_formula(kind, p, m, v)
    return f["fraction"], f["ratio"]


def check_args(kind: str, p: int, m: int, v: int) -> None:
    """ValueError naming the options and numbers, before anything is simulated."""
    from minipar.parallel.pipeline.schedule import stage_schedule

    if kind in TWO and v != 2:
        raise ValueError(f"--chunks {v}: {kind} holds exactly 2 chunks per rank; leave "
                         "--chunks out")
    if kind not in ("interleaved", *TWO) and v != 1:
        raise ValueError(f"--chunks {v} needs --schedule interleaved (the {kind} schedule has "
                         "one chunk per rank)")
    if kind == "interleaved" and m % p:
        raise ValueError(f"--micro-batches {m} is not a multiple of --stages {p}: interleaved "
                         "1F1B sends micro-batches in groups of p")
    stage_schedule(kind, 0, p, m, v)  # anything else, in the schedule's own words


def parse_costs(text: str | None) -> tuple:
    """``--costs F,B,W[,FB]`` -> (F, B, W, FB or None), exact ``Fraction`` values; one-line
    ValueError unless F, B > 0, 0 <= W <= B and FB > 0."""
    if text is None:
        return COSTS
    try:
        vals = [Fraction(t.strip()) for t in text.split(",")]
    except (ValueError, ZeroDivisionError):
        vals = []
    if len(vals) not in (3, 4) or vals[0] <= 0 or vals[1] <= 0 or not 0 <= vals[2] <= vals[1] \
            or (len(vals) == 4 and vals[3] <= 0):
        raise ValueError(f"--costs {text}: give F,B,W or F,B,W,FB, numbers with F, B, FB > 0 "
                         f"and 0 <= W <= B (B the whole backward, W its weight part), e.g. "
                         f"1,2,1 or 1,2,1,2.5")
    return (*(_whole(x) for x in vals[:3]), _whole(vals[3]) if len(vals) == 4 else None)


def _whole(x: Fraction) -> Any:
    return int(x) if x.denominator == 1 else x


def theory(kind: str, p: int, m: int, v: int = 1, costs: tuple = COSTS) -> list:
    """The simulated timeline of ``kind`` on p stages, m micro-batches, v chunks, with
    ``costs`` (F, B, W, FB) per stage — per chunk for dualpipe and dualpipev, whose chunks
    are stages of their PP — default forward 1, backward 2 (split: B 1, W 1, the paper's
    T_F = T_B = T_W); checked schedules, exact integer/Fraction times."""
    from minipar.parallel.pipeline.check import check_schedules
    from minipar.parallel.pipeline.schedule import placement, schedules
    from minipar.parallel.pipeline.simulate import replay, split_cost

    f, b, w, fb = costs
    scheds = schedules(kind, p, m, v)
    check_schedules(scheds, placement=placement(kind))
    cost = split_cost(f, b - w, w, v=1 if kind in DUAL else v, overlapped=fb)
    return replay(scheds, cost, placement=placement(kind))


def idle_per_rank(records: Sequence) -> list:
    """Each rank's idle time: its span (first compute start to last compute end) minus its
    computing (exact for exact costs)."""
    from minipar.parallel.pipeline.simulate import COMPUTE_WHAT

    out = []
    for s in sorted({r.stage for r in records}):
        rs = [r for r in records if r.stage == s and r.what in COMPUTE_WHAT]
        out.append(max(r.end for r in rs) - min(r.start for r in rs)
                   - sum(r.end - r.start for r in rs))
    return out


def in_flight_peaks(records: Sequence) -> list[int]:
    """Peak micro-batches (chunk-activations) held by each stage, read off the timeline."""
    from minipar.viz.pipeline import in_flight_over_time

    return [max(k for _, k in steps) for _, steps in sorted(in_flight_over_time(records).items())]


def summary(kind: str, p: int, m: int, v: int, records: Sequence,
            wall: Sequence | None = None, costs: tuple = COSTS) -> dict[str, Any]:
    """The numbers ``--json`` prints.  ``records``: the timeline compared with the formula
    (simulated, or rebuilt from a run); ``wall``: the measured wall-clock one, if any."""
    from minipar.parallel.pipeline.measure import (
        bubble_fraction,
        bubble_time_ratio,
        rebuild_fastest,
        synced_bubble_fraction,
    )
    from minipar.parallel.pipeline.measure import in_flight
    from minipar.parallel.pipeline.schedule import schedules
    from minipar.parallel.pipeline.measure import w_pending
    from minipar.plan.pipeline import zero_bubble_holds

    frac, ratio = formula(kind, p, m, v)
    got, got_ratio = bubble_fraction(records), bubble_time_ratio(records)
    scheds = schedules(kind, p, m, v)
    peaks = [in_flight(s) for s in scheds]
    out: dict[str, Any] = {
        "schedule": kind, "p": p, "m": m, "v": v,
        "source": "theory" if wall is None else "run",
        "bubble_fraction": float(got), "bubble_time_ratio": float(got_ratio),
        "formula": FORMULA[kind][0], "formula_value": float(frac),
        "formula_ratio": FORMULA[kind][1], "formula_ratio_value": float(ratio),
        # Table 2 needs m >= p (ZB-H1), m >= 2p - 1 (ZB-H2, ZB-V); below, the simulator's
        "formula_holds": zero_bubble_holds(kind, p, m),
        "in_flight_max": max(peaks), "in_flight": peaks,
        "w_pending": [w_pending(s) for s in scheds],
        "bubble_fraction_synced": float(synced_bubble_fraction(records)),
        "makespan": float(max(r.end for r in records) - min(r.start for r in records)),
    }
    idle = idle_per_rank(records)
    out["idle_per_rank"] = [float(x) for x in idle]
    out["costs"] = {"F": float(costs[0]), "B": float(costs[1]), "W": float(costs[2]),
                    "FB": float(costs[0] + costs[1] if costs[3] is None else costs[3])}
    if kind in DUAL:
        out.update(dualpipe_summary(kind, p, m, costs, idle, peaks))
    elif kind.startswith("zb") and costs != COSTS:  # Table 2 with T_F, T_B, T_W
        from minipar.plan.pipeline import zero_bubble_formula

        t = zero_bubble_formula(kind, p, m, costs[0], costs[1] - costs[2], costs[2])
        out["formula_value"], out["formula_ratio_value"] = (float(t["fraction"]),
                                                            float(t["ratio"]))
    if isinstance(got, Fraction):
        out["bubble_fraction_exact"] = (f"{got.numerator}/{got.denominator}"
                                        if got.denominator != 1 else str(got.numerator))
    if wall is not None:
        out["bubble_fraction_wall"] = float(bubble_fraction(wall))
        out["bubble_fraction_fastest"] = float(bubble_fraction(rebuild_fastest(wall, kind, p, m, v)))
        out["in_flight_measured"] = in_flight_peaks(wall)
    return out


def dualpipe_summary(kind: str, p: int, m: int, costs: tuple, idle: Sequence,
                     peaks: Sequence) -> dict[str, Any]:
    """DualPipe's table beside the schedule (:func:`minipar.plan.pipeline.dualpipe_formula`):
    its bubble (PP/2 − 1)(F&B + B − 3W) in cost units as ``formula_value``; it is the
    largest rank's idle (``formula_holds``) when F = B − W (a forward costs the input part
    of a backward) and F&B = F + B, as the simulator finds; otherwise ``formula_gap`` says
    by how much the schedule's idle differs.  Memory per device: parameters 2 stages'
    (``params_stages``), activations ``in_flight`` against the table's PP + 1."""
    from minipar.plan.pipeline import dualpipe_formula

    f, b, w, fb = costs
    t = dualpipe_formula(kind, p, m, f, b, w, fb)
    fb = f + b if fb is None else fb
    return {"formula_value": float(t["bubble"]), "formula_ratio_value": float(t["ratio"]),
            "formula_holds": f == b - w and fb == f + b,
            "formula_gap": float(max(idle) - t["bubble"]), "idle_max": float(max(idle)),
            "pp": t["pp"], "params_stages": 2, "in_flight_formula": t["in_flight"],
            "in_flight_holds": max(peaks) == t["in_flight"]}


def measured_costs(records: Sequence) -> tuple:
    """(F, B, W, F&B) of a recorded DualPipe step, per chunk: the medians of its forwards,
    whole backwards and W's (seconds); F&B = F + B, as the pairs ran on one core."""
    import statistics

    def med(what: str) -> float:
        xs = [r.end - r.start for r in records if r.what == what]
        return float(statistics.median(xs)) if xs else 0.0
    f, b, w = med("forward"), med("backward"), med("backward_weight")
    return f, b, w, f + b


def _chart(records: Sequence) -> str:
    from minipar.parallel.pipeline.measure import chart
    from minipar.parallel.pipeline.simulate import COMPUTE_WHAT, Record

    t0 = min(r.start for r in records)
    shifted = [Record(*r[:4], r.start - t0, r.end - t0) for r in records]
    end = max(r.end for r in shifted)
    exact = all(isinstance(r.end, (int, Fraction)) for r in shifted)
    short = min((r.end - r.start for r in shifted if r.what in COMPUTE_WHAT
                 and r.end > r.start), default=1)
    unit = short if exact and end / short <= MAX_CHART_CELLS else end / 60
    if not exact and unit <= 0:
        return "(every forward and backward took no time: nothing to draw)"
    return chart(shifted, unit)


def text(s: dict[str, Any], records: Sequence, wall: Sequence | None = None) -> str:
    """What ``minipar bubble`` prints: the chart(s), the bubble, the formula, the peaks."""
    kind, p, m, v = s["schedule"], s["p"], s["m"], s["v"]
    chunks = f", v = {v} chunks per rank" if kind in ("interleaved", *TWO) else ""
    head = f"{NAMES[kind]}: p = {p} stages, m = {m} micro-batches{chunks}"
    lines = []
    if wall is None and kind in DUAL:
        c = s["costs"]
        lines += [(f"{head} (simulated: F {c['F']:g}, B {c['B']:g} (its W {c['W']:g}), "
                   f"F&B {c['FB']:g} per chunk; F3 forward of micro-batch 3, B3 its backward "
                   f"or its input part, W3 its weight part; "
                   + ("upper case: going down the ranks, lower case: going up"
                      if kind == "dualpipe" else "lower case: the V's way back up")
                   + "; an overlapped pair F&B is drawn as its F then its B, . idle)"), "",
                  _chart(records), ""]
    elif wall is None:
        split = kind.startswith("zb")
        lines += [(f"{head} (simulated: forward 1, backward 2 per stage"
                   + (", split into B 1 and W 1 (T_F = T_B = T_W); F3 forward of micro-batch 3, "
                      "B3 its input gradient, W3 its weight gradient" if split else
                      "; F3 forward of micro-batch 3, B3 its backward")
                   + ", lower case an odd chunk, . idle)"), "", _chart(records), ""]
        exact = s.get("bubble_fraction_exact", f"{s['bubble_fraction']:.4f}")
        lines.append(f"bubble fraction (P·S − C)/(P·S), S the longest stage's span = {exact} = "
                     f"{s['bubble_fraction']:.1%} of the step")
        if split:
            lines.append(f"with every stage waiting for all before its optimizer step (a global "
                         f"gradient norm, a found-inf check): {s['bubble_fraction_synced']:.1%}"
                         f" (the paper steps optimistically and validates after, to keep the "
                         f"zero)")
    else:
        lines += [f"{head} (recorded run)", "", "measured, wall clock:", _chart(wall), "",
                  "rebuilt by the simulator from the measured costs (a dedicated machine):",
                  _chart(records), "",
                  (f"bubble fraction, wall clock: {s['bubble_fraction_wall']:.1%}; rebuilt: "
                  f"{s['bubble_fraction']:.1%}; rebuilt with each stage's fastest "
                  f"costs (stalls removed): {s['bubble_fraction_fastest']:.1%} of the step")]
    if kind in DUAL:
        idle = " ".join(f"{x:g}" for x in s["idle_per_rank"])
        unit = "cost units" if wall is None else "seconds, the table with the measured costs"
        expr, pp_is = s["formula"].split(", ", 1)
        lines.append(f"idle per rank (span − work, {unit}): {idle}; the table's bubble "
                     f"{expr} = {s['formula_value']:g} ({pp_is} = {s['pp']})" + (
                         " = the largest, as the table says" if s["formula_gap"] == 0 else
                         f"; the largest idle differs by {s['formula_gap']:+g}: the table "
                         f"holds for F = B − W and F&B = F + B (the warm-up's and cool-down's "
                         f"waits grow with F and B − W apart, and an F&B below F + B shortens "
                         f"only the ranks with more pairs)"))
        lines.append(f"parameters per rank: 2 stages' (dualpipe: two copies of the model, "
                     f"their gradients summed before the step; dualpipev: stages s and "
                     f"2p − 1 − s); activations in flight, peak per rank "
                     + " ".join(map(str, s["in_flight"])) + f" (table: PP + 1 = "
                     f"{s['in_flight_formula']})")
    elif s["formula_holds"]:
        lines.append(f"formula ({PAPER[kind]}): {s['formula']} = {s['formula_value']:.4f}   "
                     f"(bubble / ideal time {s['formula_ratio']} = "
                     f"{s['formula_ratio_value']:.4f}; here {s['bubble_time_ratio']:.4f})")
    else:
        need = "m >= p" if kind == "zb-h1" else "m >= 2p - 1"
        lines.append(f"formula ({PAPER[kind]}): holds for {need} only (here m = {m}, p = {p}): "
                     f"too few micro-batches to fill the pipeline; the bubble is the "
                     f"simulator's, {s['bubble_fraction']:.4f} (bubble / ideal time "
                     f"{s['bubble_time_ratio']:.4f})")
    held = " ".join(map(str, s["in_flight"]))
    if kind not in DUAL:
        lines.append(f"micro-batches in flight (F done, B not), peak per stage: {held}" + (
            " (chunk-activations)" if kind in ("interleaved", "zb-v") else "") +
            f"; GPipe holds m = {m}, 1F1B at most p − stage")
    if kind.startswith("zb") or kind in DUAL:
        lines.append("waiting only for W (B done, W not: the linears' inputs and output "
                     "gradients kept), peak per stage: " + " ".join(map(str, s["w_pending"])))
    return "\n".join(lines)


def parser() -> ArgumentParser:
    p = ArgumentParser(prog=PROG, description=__doc__.split("\n\n")[0])
    p.add_argument("--stages", type=integer(1, MAX_STAGES), default=None,
                   help=f"pipeline stages p, 1 to {MAX_STAGES} (default 4; with --from-run: "
                        "the run's)")
    p.add_argument("--micro-batches", type=integer(1, MAX_MICRO_BATCHES), default=None,
                   help=f"micro-batches m per step, 1 to {MAX_MICRO_BATCHES} (default 8; with "
                        "--from-run: the run's)")
    p.add_argument("--schedule", choices=KINDS, default=None,
                   help="gpipe, 1f1b, interleaved, naive, the zero-bubble zb-h1, zb-h2, "
                        "zb-v, or DeepSeek-V3's dualpipe, dualpipev (default 1f1b; with "
                        "--from-run: the run's)")
    p.add_argument("--costs", default=None, metavar="F,B,W[,FB]",
                   help="a stage's forward, whole backward, its weight part W, and an "
                        "overlapped forward-backward pair F&B (default 1,2,1; FB = F + B)")
    p.add_argument("--chunks", type=integer(1, MAX_CHUNKS), default=None,
                   help="model chunks per rank v, interleaved only (default 2 for interleaved, "
                        "else 1)")
    p.add_argument("-o", "--output", type=output_file, default=None,
                   help="draw the Gantt chart into this PNG/PDF/SVG file (default: none)")
    p.add_argument("--json", action="store_true",
                   help="print the numbers as JSON instead of the chart (default: off)")
    p.add_argument("--trace", type=output_file, default=None,
                   help="write the timeline as Chrome trace events (Perfetto, chrome://tracing) "
                        "to this JSON file (default: none)")
    p.add_argument("--from-run", default=None, metavar="FILE",
                   help="a recorded step (minipar run pp --timeline FILE) instead of the theory "
                        "(default: none, the simulator)")
    return p


def _check_output(path: str | None) -> None:
    """``-o FILE``: a suffix matplotlib can draw (png, pdf, svg, ...), before anything runs."""
    if path is None:
        return
    from matplotlib.backend_bases import FigureCanvasBase

    suffix = Path(path).suffix.lower().lstrip(".")
    if suffix not in FigureCanvasBase.get_supported_filetypes():
        raise ValueError(f"-o {path}: cannot draw a {'.' + suffix if suffix else 'suffix-less'} "
                         "file; name it .png, .pdf or .svg")


def _resolve(args: Any) -> tuple[str, int, int, int, dict | None, list | None]:
    """(kind, p, m, v, meta, recorded records) from the options and the run's file."""
    _check_output(args.output)
    meta, recs = (None, None)
    if args.from_run:
        from minipar.parallel.pipeline.measure import load_run

        meta, recs = load_run(args.from_run)
        given = {"--stages": (args.stages, meta["p"]), "--micro-batches": (args.micro_batches,
                 meta["m"]), "--chunks": (args.chunks, meta["v"]),
                 "--schedule": (args.schedule, meta.get("schedule"))}
        for opt, (mine, theirs) in given.items():
            if mine is not None and theirs is not None and mine != theirs:
                raise ValueError(f"{opt} {mine} disagrees with the recorded run's {theirs} "
                                 f"({args.from_run}); leave it out to use the run's")
        kind = args.schedule or meta.get("schedule")
        if kind not in KINDS:
            raise ValueError(f"{args.from_run} does not say its schedule ({kind!r}): give "
                             f"--schedule, one of {', '.join(KINDS)}")
        return kind, int(meta["p"]), int(meta["m"]), int(meta["v"]), meta, recs
    kind = args.schedule or "1f1b"
    v = args.chunks if args.chunks is not None else (2 if kind in ("interleaved", *TWO)
                                                     else 1)
    return kind, args.stages or 4, args.micro_batches or 8, v, None, None


def main(argv: list[str]) -> int:
    """Exit 0 after printing; 2 for bad input (one line, nothing simulated)."""
    args = parser().parse_args(argv)
    try:
        kind, p, m, v, _, wall = _resolve(args)
        costs = parse_costs(args.costs)
        if wall is not None and args.costs is not None:
            raise ValueError("--costs is for the theory: with --from-run the costs are the "
                             "recorded ones; leave --costs out")
        check_args(kind, p, m, v)
        if wall is None:
            records = theory(kind, p, m, v, costs)
        else:
            from minipar.parallel.pipeline.measure import rebuild

            records = rebuild(wall, kind, p, m, v)
            if kind in DUAL:
                costs = measured_costs(wall)
        s = summary(kind, p, m, v, records, wall, costs)
    except ValueError as e:
        return error_line(PROG, e)
    if args.output:
        _draw(args.output, kind, p, m, v, records, wall)
    if args.trace:
        from minipar import trace

        events = trace.pipeline_events(records, seconds=1e-3 if wall is None else 1.0,
                                       name="simulated (1 unit = 1 ms)" if wall is None
                                       else "rebuilt by the simulator", pid=1 if wall else 0)
        if wall is not None:
            events = trace.pipeline_events(wall, name="measured (wall clock)") + events
        trace.write(args.trace, events, schedule=kind, p=p, m=m, v=v,
                    bubble_fraction=s["bubble_fraction"], formula=s["formula"])
    print(json.dumps(s) if args.json else text(s, records, wall))
    if args.output and not args.json:
        print(f"wrote {args.output}")
    if args.trace and not args.json:
        print(f"wrote {args.trace} (open it in https://ui.perfetto.dev or chrome://tracing)")
    return 0


def _draw(path: str, kind: str, p: int, m: int, v: int, records: Sequence,
          wall: Sequence | None) -> None:
    import matplotlib

    matplotlib.use("Agg")
    from minipar.viz import pipeline as vp

    name = f"{NAMES[kind]}, p = {p}, m = {m}" + (f", v = {v}" if kind == "interleaved" else "")
    if wall is None and kind.startswith("zb"):  # side by side with 1F1B on the same costs
        fig = vp.plot_schedules({f"1F1B, p = {p}, m = {m}": theory("1f1b", p, m), name: records})
        fig.savefig(path, dpi=110)
        return
    if wall is None:
        fig = vp.plot_gantt(records, title=name)
    else:
        fig = vp.plot_schedules({f"{name}: measured (wall clock)": wall,
                                 f"{name}: rebuilt from the measured costs": records},
                                time_unit="ms", scale=1e3)
    fig.savefig(path, dpi=110)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
