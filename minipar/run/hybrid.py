"""``minipar run hybrid``: 3D/4D parallelism on one grid, bytes and memory per axis.

EN 3D parallelism (hybrid parallelism) · RU трёхмерный (гибридный) параллелизм ·
ZH 3D 并行（混合并行）

    minipar run hybrid --dp D --tp T --pp P [--cp C] [--ep E] [--zero S]
                       [--schedule gpipe|1f1b|interleaved] [--micro-batches M]
                       [--chunks V] [--remat [K]] [--sequence-parallel]
                       [--no-scatter-gather] [--zero 3 --zeropp qwz,hpz,qgz [--node K]] -n N

Launcher side: :func:`minipar.parallel.hybrid.layout.check_hybrid` before MPI starts
(dp·pp·cp·tp = N, tp dividing heads / d_ff / vocab, pp at most the layers, ep dividing
the experts and dp·cp, the pipeline's own checks; cp with tp: Megatron's CP × TP, ring or
Ulysses attention on each tp rank's n_head/t heads, not with --sequence-parallel).  Rank side:
:func:`minipar.parallel.hybrid.engine.build` (PTD-P, Narayanan et al. 2021, arXiv
2104.04473) trains ``--steps`` steps, and the summary adds, per rank: its coordinates,
the bytes sent per step on each grid axis (counted) next to the exact formula, the
model-state and activation bytes held next to the planner's
(:func:`minipar.plan.layouts.layout_memory`, float64: 8-byte elements, K = 16).

ZeRO++ (``--zero 3 --zeropp qwz,hpz,qgz``, any subset, ``--zeropp-block B``; Wang et al.
2023, arXiv 2306.10209): ZeRO-3's hooks of each stage become ZeRO++'s
(:class:`~minipar.parallel.zero.zeropp.ZeroPPHooks`) over the dp·cp ranks of the stage,
in nodes of the grid's hosts (``--node K``: K consecutive ranks; each stage's shard group
must fall in equal blocks of consecutive ranks per node).  A unit's first fetch of a step
gathers globally (qwZ: int8) and keeps hpZ's slice; its other 2m − 1 fetches (backward,
and the later micro-batches' forwards: the weights do not change within a step) read
the node; under ``--remat`` a recomputed unit is fetched once more (the exact figure
counts each unit's fetches of the learnt walk).  With tp = cp = ep = 1, one chunk and
GPipe, 1F1B, ZB-H1 or ZB-H2, the verdict is bit for bit against the serial ZeRO++
arithmetic of the pipeline (:func:`minipar.parallel.hybrid.oracle.hybrid_zeropp_reference`);
otherwise, and with fp8, "not comparable" (TP's and CP's sums are not the serial ones),
with the distance from the unquantized serial run.  ``--json``'s ``zeropp``: per rank the
bytes measured (ZeRO's communicator and ZeRO++'s node and cross ones, intra / inter node
by each peer's host) and exact (:func:`~minipar.parallel.zero.measure.zeropp_exact_bytes`
with m micro-batches), ZeRO-3's own, the paper's volumes for the rank's stage, hpZ's
slices held and their formula.
"""

from __future__ import annotations

import argparse
from typing import Any

from minipar.cli.options import integer

SCHEDULES = ("gpipe", "1f1b", "interleaved", "zb-h1", "zb-h2", "zb-v", "dualpipe", "dualpipev")
#: a model the usual grids of 8 ranks can cut (tp up to 4, pp up to 4), with a batch that
#: dp·m divides, so the planner's layouts (even micro-batches) compare with the run
MODEL_DEFAULTS = {"batch": 8, "layers": 4, "heads": 4, "vocab": 8}
AXES = ("tp", "pp_p2p", "cp", "dp", "ep", "edp")
#: what tp carries: the blocks' f and g, PTD-P's pipeline all-gather (both in the formula),
#: then the embedding, head and vocabulary-parallel loss (not in it)
TP_OPS = ("tp_f", "tp_g", "sp_f", "sp_g", "pp_tp_gather", "tp_embed", "tp_head", "tp_ce",
          "sp_embed", "sp_head", "sp_regather", "sp_param_grads")


def _chunks(options: dict[str, Any]) -> int:
    """--chunks, or 2 for zb-v when it is left at its default (zb-v is a V of 2 chunks)."""
    v = options.get("chunks", 1)
    return 2 if options.get("schedule") in ("zb-v", "dualpipe", "dualpipev") and v == 1 else v


def add_arguments(parser: argparse.ArgumentParser) -> None:
    from minipar.run import remat_offload

    g = parser.add_argument_group("the grid (dp x pp x cp x tp = -n; ep over dp·cp)")
    for axis, what in (("dp", "data-parallel replicas (default: -n / (pp·cp·tp))"),
                       ("pp", "pipeline stages (default 1)"),
                       ("tp", "tensor-parallel size (default 1)"),
                       ("cp", "context-parallel size (default 1)"),
                       ("ep", "expert-parallel size over the dp·cp ranks (default 1)")):
        g.add_argument(f"--{axis}", type=integer(1), default=None if axis == "dp" else 1,
                       metavar=axis.upper(), help=what)
    g.add_argument("--cp-kind", choices=("ring", "ulysses", "allgather", "usp"), default="ring",
                   help="context parallelism: ring attention (zigzag), Ulysses, allgather "
                   "(Llama 3's all-gather of K, V; zigzag) or usp (--ulysses x --ring) "
                   "(default ring)")
    from minipar.run.cp import add_usp_arguments

    add_usp_arguments(g)
    g.add_argument("--zero", type=integer(0, 3), default=0, metavar="S",
                   help="ZeRO stage over the dp·cp ranks: 0 (all-reduce), 1, 2 (gradients "
                        "reduce-scattered after the flush) or 3 (parameters gathered per "
                        "micro-batch) (default 0)")
    g.add_argument("--schedule", choices=SCHEDULES, default="1f1b",
                   help="pipeline schedule (default 1f1b; zb-h1, zb-h2, zb-v: zero bubble, "
                        "the backward split into B and W)")
    g.add_argument("--micro-batches", type=integer(1), default=None, metavar="M",
                   help="micro-batches per step (default: 4, or the fewest rows of a replica)")
    g.add_argument("--chunks", type=integer(1), default=1, metavar="V",
                   help="model chunks per stage, with --schedule interleaved (default 1)")
    g.add_argument("--sequence-parallel", action="store_true",
                   help="with --tp: sequence parallelism (Korthikanti et al.): LayerNorms on a "
                        "sequence shard, which is what travels between stages")
    g.add_argument("--prefetch", type=integer(0), default=0, metavar="K",
                   help="with --zero 3: all-gather the next K units of the stage's walk (learnt "
                        "in the first step) while one computes, reduce-scatter non-blocking "
                        "(default 0: blocking)")
    g.add_argument("--no-reshard-after-forward", dest="reshard_after_forward",
                   action="store_false", default=True,
                   help="with --zero 3: keep each unit gathered from its first fetch of the "
                        "step to its last (FSDP2's reshard_after_forward=False: one "
                        "all-gather per unit and step, the stage's parameters held whole)")
    g.add_argument("--zeropp", default=None, metavar="PARTS",
                   help="with --zero 3: ZeRO++'s parts, comma-separated: qwz (int8 weight "
                        "all-gather), hpz (later fetches inside the node, --node K), qgz "
                        "(int4 hierarchical gradient all-to-all); default: none")
    g.add_argument("--zeropp-block", type=integer(1), default=256, metavar="B",
                   help="ZeRO++'s quantization block: elements per scale (default 256)")
    g.add_argument("--tp-overlap", action="store_true",
                   help="with --tp: f's backward all-reduce behind the weight gradient, SP's "
                        "all-gather and reduce-scatter decomposed into the GEMMs (the same "
                        "bytes and sums)")
    g.add_argument("--no-scatter-gather", action="store_true",
                   help="send whole activations between stages on every tp rank (default: "
                        "each sends 1/t, the next stage all-gathers: PTD-P §4.1)")
    remat_offload.add_arguments(parser)


def sizes(options: dict[str, Any], spec: Any) -> dict[str, int]:
    """dp, pp, cp, tp, ep and m from the options (dp and m filled in when not given)."""
    from minipar import checks, spans

    n = options["ranks"]
    s = {a: options.get(a) or 1 for a in ("pp", "cp", "tp", "ep")}
    inner = s["pp"] * s["cp"] * s["tp"]
    dp = options.get("dp")
    if dp is None:
        checks.divides(f"pp·cp·tp = {s['pp']}·{s['cp']}·{s['tp']} =", inner, "-n", n,
                       f"give sizes whose product is {n}")
        dp = n // inner
    m = options.get("micro_batches")
    if m is None:
        m = max(1, min(4, spans.counts(spec.batch, dp)[-1] if spec.batch >= dp else 1))
    return {"dp": dp, **s, "m": m}


def check(options: dict[str, Any], spec: Any) -> None:
    """Launcher side: every check of the grid, the slicing, the pipeline, before MPI."""
    from minipar.parallel.hybrid.layout import check_hybrid
    from minipar.run import remat_offload

    z = sizes(options, spec)
    remat = options.get("remat")
    check_hybrid(options["ranks"], spec, z["dp"], z["pp"], z["tp"], z["cp"], z["ep"],
                 options.get("zero", 0), options.get("schedule", "1f1b"), z["m"],
                 _chunks(options), None, True if remat == 0 else remat,
                 options.get("cp_kind", "ring"), options.get("sequence_parallel", False),
                 _cp_ulysses(options, z["cp"]))
    from minipar.run.tp import check_fp8_experts

    check_fp8_experts(spec, z["tp"])
    if options.get("tp_overlap") and z["tp"] == 1:
        raise ValueError("--tp-overlap needs tensor parallelism, and this grid has tp 1: "
                         "give --tp 2 or more")
    if options.get("prefetch") and options.get("zero", 0) != 3:
        raise ValueError(f"--prefetch is ZeRO-3's (parameters gathered unit by unit); got "
                         f"--zero {options.get('zero', 0)}: add --zero 3")
    if not options.get("reshard_after_forward", True) and options.get("zero", 0) != 3:
        raise ValueError(f"--no-reshard-after-forward is ZeRO-3's (parameters gathered unit "
                         f"by unit); got --zero {options.get('zero', 0)}: add --zero 3")
    check_zeropp(options, z)
    remat_offload.check(options, spec)


def check_zeropp(options: dict[str, Any], z: dict[str, int]) -> None:
    """Launcher side: ``--zeropp`` needs ``--zero 3``, resharding, and nodes that cut every
    stage's dp·cp ranks into equal blocks of consecutive ranks."""
    from minipar.run.zero import ZEROPP_BLOCK, zeropp_parts

    zero = options.get("zero", 0)
    if not zeropp_parts(options.get("zeropp")):
        if options.get("zeropp_block", ZEROPP_BLOCK) != ZEROPP_BLOCK:
            raise ValueError("--zeropp-block is ZeRO++'s quantization block: add --zeropp "
                             "PARTS (with --zero 3)")
        return
    if zero != 3:
        raise ValueError(f"--zeropp is ZeRO-3's (it changes the parameter all-gathers and "
                         f"gradient reduce-scatters of --zero 3); got --zero {zero}: add "
                         "--zero 3")
    if not options.get("reshard_after_forward", True):
        raise ValueError("--zeropp with --no-reshard-after-forward: ZeRO++ changes the later "
                         "all-gathers that this option removes; drop one of them")
    k = options.get("node")
    if k is None:
        return
    n, pp, cp, tp = z["dp"] * z["cp"], z["pp"], z["cp"], z["tp"]
    for p in range(pp):  # world rank ((d·pp + p)·cp + c)·tp + t; the group: e = d·cp + c
        for t in range(tp):
            hosts = [(((e // cp * pp + p) * cp + e % cp) * tp + t) // k for e in range(n)]
            per = hosts.count(hosts[0])
            if n % per or hosts != [hosts[e - e % per] for e in range(n)] or \
                    len(set(hosts)) * per != n:
                raise ValueError(f"--zeropp with --node {k}: the dp·cp = {n} ranks of stage "
                                 f"{p} sit on nodes {hosts}, not in equal blocks of "
                                 "consecutive ranks; give --node a multiple of pp·cp·tp "
                                 f"= {pp * cp * tp} dividing -n")


def _cp_ulysses(options: dict[str, Any], cp: int) -> int:
    """USP's Ulysses degree from ``--ulysses`` / ``--ring`` (0 unless ``--cp-kind usp``)."""
    from minipar.parallel.context_parallel.options import usp_sizes

    if options.get("cp_kind", "ring") != "usp":
        if options.get("ulysses") or options.get("ring"):
            raise ValueError("--ulysses and --ring are USP's degrees: use --cp-kind usp")
        return 0
    return usp_sizes(cp, options.get("ulysses"), options.get("ring"))[0]


def grid_sizes(options: dict[str, Any], spec: Any) -> dict[str, int]:
    """The grid: dp x pp x cp x tp, ep over dp·cp (dp filled in when not given)."""
    z = sizes(options, spec)
    return {a: z[a] for a in ("dp", "pp", "tp", "cp", "ep")}


def engine_options(options: dict[str, Any], spec: Any) -> dict[str, Any]:
    """The hybrid engine's options (m filled in when not given; ``--remat`` alone: True)."""
    remat = options.get("remat")
    return {"schedule": options.get("schedule", "1f1b"),
            "micro_batches": sizes(options, spec)["m"], "chunks": _chunks(options),
            "remat": True if remat == 0 else remat, "offload": options.get("offload"),
            "offload_dir": options.get("offload_dir") if options.get("offload") == "disk"
            else None,
            "zero": options.get("zero", 0), "cp_kind": options.get("cp_kind", "ring"),
            "cp_ulysses": _cp_ulysses(options, sizes(options, spec)["cp"]),
            "scatter_gather": not options.get("no_scatter_gather", False),
            "sequence_parallel": options.get("sequence_parallel", False),
            "tp_overlap": options.get("tp_overlap", False),
            "prefetch": options.get("prefetch", 0),
            "reshard_after_forward": options.get("reshard_after_forward", True),
            **({"zeropp": zeropp_parts(options["zeropp"]),
                "zeropp_block": options.get("zeropp_block", 256)}
               if options.get("zeropp") else {})}


def zeropp_parts(text: Any) -> tuple[str, ...]:
    from minipar.run.zero import zeropp_parts as parts

    return parts(text)


def report(h: Any, grid: Any, options: dict[str, Any], spec: Any,
           history: Any) -> dict[str, Any] | None:
    """Rank side, after training: every rank's figures, gathered; rank 0 returns them."""
    from minipar.parallel.hybrid.measure import engine_bytes
    from minipar.run.ep import balance_of

    from minipar.parallel.hybrid.sync import ZeroSync

    z = sizes(options, spec)
    steps = len(history.losses)
    zero3 = isinstance(h.sync, ZeroSync) and h.sync.stage == 3
    counted = {a: b / steps for a, b in h.traffic().items()}
    ops = {op: st.bytes_sent / steps for op, st in grid.world.stats.ops.items()}
    mine = {"rank": grid.rank, "coords": {a: grid.coord(a) for a in ("dp", "pp", "cp", "tp",
                                                                      "ep", "edp")},
            "axes": {a: counted[a] for a in AXES},
            "tp_ops": {op: ops.get(op, 0) for op in TP_OPS},
            "formula": None if spec.experts else engine_bytes(h),
            "states": sum(h.model_state_bytes().values()), "params": h.stage_layout.size,
            "act": h.activation_peak_bytes, "balance": balance_of(h.bias),
            "gathered": None, **_overlap(h)}
    if zero3:  # the formula: none for remat's segments when resharding (fetched in a backward)
        peak, want = h.sync.gathered_peak()
        keep = not options.get("reshard_after_forward", True)
        mine["gathered"] = (peak, want if keep or options.get("remat") is None else None)
    if zero3 and h.sync.zeropp:
        mine["zeropp"] = zeropp_row(h, grid, steps)
    records = h.gather_records()  # every stage of replica 0, for --trace
    everyone = grid.world.comm.gather(mine, root=0)  # a report: MPI's pickled gather
    if grid.rank != 0:
        return None
    return {**_summary(options, spec, z, h, everyone), "records": [list(r) for r in records]}


def _overlap(h: Any) -> dict[str, Any]:
    """This rank's last step: the share of its messages hidden behind its computing (all,
    and the experts' all-to-alls alone), DualPipe's pairs that took turns, the messages in
    flight (``[kind, start, end]``, kind "p2p" or "a2a")."""
    a2a = h.a2a_intervals[-1]
    p2p = h.comm_intervals[-1][:len(h.comm_intervals[-1]) - len(a2a)]
    return {"hidden": h.hidden_fraction(), "hidden_a2a": h.hidden_fraction(a2a=True),
            "pairs": h.overlapped_pairs[-1],
            "flights": [["p2p", a, b] for a, b in p2p] + [["a2a", a, b] for a, b in a2a]}


def _summary(options: dict[str, Any], spec: Any, z: dict[str, int], h: Any,
             everyone: list[dict[str, Any]]) -> dict[str, Any]:
    from minipar.plan.layouts import Layout, gpt_model, layout_memory
    from minipar.run.ep import balance_report

    dp, pp, cp, tp, ep, m = (z[k] for k in ("dp", "pp", "cp", "tp", "ep", "m"))
    zero, e = options.get("zero", 0), h.states.params.itemsize
    plan = None
    if not spec.experts and spec.batch % (dp * m) == 0 and spec.layers % pp == 0:
        model = gpt_model(spec.layers, spec.d_model, spec.vocab, spec.seq, spec.heads)
        lay = Layout(dp, tp, pp, cp, zero, "none", spec.batch // (dp * m), m)
        plan = layout_memory(model, lay, itemsize=e, K=16 if e == 8 else 12, formula="minipar",
                             sequence_parallel=bool(options.get("sequence_parallel")),
                             cp_kind=options.get("cp_kind", "ring"))
    notes = [f"grid dp {dp} x pp {pp} x cp {cp} x tp {tp}" + (f", ep {ep} over dp·cp" if ep > 1
                                                              else "")
             + f"; {options.get('schedule', '1f1b')}, m = {m} micro-batches"
             + (f", ZeRO-{zero} over the dp·cp ranks" if zero else ""),
             "rank: (dp, pp, cp, tp) | bytes sent per step on each axis, counted [formula]"]
    for r in everyone:
        c, f = r["coords"], r["formula"]
        cells = []
        for a in AXES:
            got = r["axes"][a]
            want = None if f is None else f.get(a)
            if a == "tp" and got:
                o = r["tp_ops"]
                mine = o["tp_f"] + o["tp_g"] + o["sp_f"] + o["sp_g"] + o["pp_tp_gather"]
                cells.append(f"tp {got:,.0f} (blocks + pipeline gathers {mine:,.0f}"
                             + (f" [{want:,}]" if want is not None else "") + ")")
            elif got or want:
                cells.append(f"{a} {got:,.0f}" + (f" [{want:,}]" if want is not None else ""))
        notes.append(f"  {r['rank']:>3}: ({c['dp']}, {c['pp']}, {c['cp']}, {c['tp']}) | "
                     + (", ".join(cells) or "nothing"))
    notes.append("memory per rank (bytes): model states + activation peak = "
                 + ", ".join(f"{r['states']:,} + {r['act']:,}" for r in everyone))
    if zero == 3:
        keep = not options.get("reshard_after_forward", True)
        notes.append(f"ZeRO-3, prefetch {options.get('prefetch', 0)}, reshard after forward "
                     f"{'off' if keep else 'on'}: held gathered at most (bytes per rank) "
                     + ", ".join(f"{r['gathered'][0]:,}" + (
                                     "" if r["gathered"][1] is None
                                     else f" [{r['gathered'][1]:,}]") for r in everyone)
                     + (" [the stage's parameters, kept from their first fetch to their last]"
                        if keep else " [the largest K + 1 fetches in a row of the walk]"
                        if options.get("remat") is None else
                        " (remat: a recomputed segment is fetched inside a backward)"))
    if plan is None and not spec.experts:
        notes.append(f"planner: its layouts cut the batch evenly; --batch {spec.batch} is not "
                     f"divisible by dp·m = {dp * m} (or --layers by pp): no comparison")
    if plan is not None:
        same = (options.get("schedule", "1f1b") == "1f1b" and options.get("remat") is None
                and options.get("offload") is None and options.get("chunks", 1) == 1)
        ran = max(r["states"] + r["act"] for r in everyone
                  if r["coords"]["pp"] == plan["stage"])
        notes.append(f"planner (minipar.plan.layouts.layout_memory, stage {plan['stage']}): "
                     f"{plan['states']:,.0f} + {plan['activations']:,.0f} = "
                     f"{plan['total']:,.0f} per GPU; measured there {ran:,} "
                     f"({ran / plan['total'] - 1:+.1%})" + ("" if same else
                     " (its layout: 1F1B, no remat or offload: compare the states)"))
    if cp > 1 or ep > 1:
        notes.append("edp: the gradients' all-reduce over the dp·cp ranks that hold the same "
                     "shard (the cp ranks of a replica hold the same weights)" if ep == 1 else
                     "ep: the experts' all-to-all (dispatch, combine); dp: the dense gradients; "
                     "edp: the experts' gradients over the ranks holding the same experts")
    if tp > 1:
        notes.append("tp: the blocks' f and g are PTD-P's 4 all-reduces of b·s·h per block and "
                     "micro-batch, and with pp > 1 each received activation is all-gathered "
                     "from 1/t pieces (PTD-P's scatter/gather, §4.1); the rest is the "
                     "embedding, head and vocab-parallel loss"
                     + (f"; with cp the tokens are each rank's s/cp = {spec.seq // cp} and "
                        "the cp ranks exchange only their n_head/t heads (h/t)"
                        if cp > 1 else ""))
    hidden = [r["hidden"] for r in everyone]
    if any(x is not None for x in hidden):
        a2a = [r["hidden_a2a"] for r in everyone]
        notes.append("messages hidden behind computing, last step (hidden_fraction, per rank): "
                     + ", ".join("-" if x is None else f"{x:.2f}" for x in hidden)
                     + ("; the experts' all-to-alls alone: " + ", ".join(
                         "-" if x is None else f"{x:.2f}" for x in a2a)
                        if any(x is not None for x in a2a) else "")
                     + (f"; overlapped pairs that took turns (one micro-batch's all-to-all in "
                        f"flight while the other computed): {everyone[0]['pairs']} per step"
                        if any(r["pairs"] for r in everyone) else ""))
    balance: dict[str, Any] = {}
    if spec.experts:
        notes.append("mixture of experts: every micro-batch routes its rows as one group, so "
                     f"the serial run accumulates dp·m = {dp * m} micro-batches; the formulas "
                     "count dense models only")
        balance = balance_report([r["balance"] for r in everyone], spec)
        notes += balance.pop("notes")
    zeropp: dict[str, Any] = {}
    if everyone[0].get("zeropp"):
        zeropp = zeropp_summary([r["zeropp"] for r in everyone], options)
        notes += zeropp.pop("lines")
    return {**zeropp, "ranks": dp * pp * cp * tp,
            "data_parallel_ranks": dp * m if spec.experts else 1,
            "dp": dp, "pp": pp, "cp": cp, "tp": tp, **balance,
            "ep": ep, "zero": zero, "schedule": options.get("schedule", "1f1b"),
            "micro_batches": m, "coords_per_rank": [r["coords"] for r in everyone],
            "bytes_by_axis_per_rank": [r["axes"] for r in everyone],
            "bytes_formula_by_axis_per_rank": [r["formula"] for r in everyone],
            "tp_bytes_by_op_per_rank": [r["tp_ops"] for r in everyone],
            "bytes_sent_per_rank": [sum(r["axes"].values()) for r in everyone],
            "model_state_bytes_per_rank": [r["states"] for r in everyone],
            "params_per_rank": [r["params"] for r in everyone],
            "activation_peak_bytes_per_rank": [r["act"] for r in everyone],
            "gathered_peak_bytes_per_rank": [r["gathered"] and r["gathered"][0]
                                             for r in everyone],
            "gathered_peak_formula_per_rank": [r["gathered"] and r["gathered"][1]
                                               for r in everyone],
            "hidden_fraction_per_rank": hidden,
            "hidden_fraction": _mean(hidden),
            "hidden_fraction_a2a": _mean([r["hidden_a2a"] for r in everyone]),
            "overlapped_pairs_per_rank": [r["pairs"] for r in everyone],
            "messages_in_flight": [[r["coords"]["pp"], k, a, b] for r in everyone
                                   if not any(r["coords"][x] for x in ("dp", "cp", "tp"))
                                   for k, a, b in r["flights"]],
            "plan_memory": plan, "notes": notes}


def zeropp_row(h: Any, grid: Any, steps: int) -> dict[str, Any]:
    """This rank's ZeRO++ figures per step: bytes measured on ZeRO's communicator and ZeRO++'s
    node and cross ones (inside / across its node, by each peer's host), exact, ZeRO-3's own
    exact, the paper's volumes for its stage, hpZ's slices held at most and their formula."""
    from minipar.parallel.hybrid.measure import zeropp_stage_bytes
    from minipar.parallel.zero.measure import (
        hpz_secondary_elements,
        zeropp_formula_bytes,
        zeropp_measured,
    )

    z, comm = h.sync.zeropp, h.sync.comm
    k, b, psi = z["node"].size, h.states.params.itemsize, h.stage_layout.size
    axis = "dp" if grid.layout.cp == 1 else "edp"
    return {"parts": list(z["parts"]), "block": z["block"], "node": k, "ranks": comm.size,
            "measured": zeropp_measured(grid.world.stats, grid.hosts, grid.world.world_ranks,
                                        grid.rank, steps, (axis, "zeropp_node", "zeropp_cross")),
            "exact": zeropp_stage_bytes(h), "zero3": zeropp_stage_bytes(h, ()),
            "formula": zeropp_formula_bytes(psi, comm.size, k, z["parts"], z["block"], b, h.m),
            "zero3_formula": zeropp_formula_bytes(psi, comm.size, k, (), z["block"], b, h.m),
            "hpz_held": h.sync.zero_hooks.peak_secondary_bytes,
            "hpz_formula": (hpz_secondary_elements(psi, k, z["node"].rank) * b
                            if "hpz" in z["parts"] else 0)}


def zeropp_summary(rows: list[dict[str, Any]], options: dict[str, Any]) -> dict[str, Any]:
    """Rank 0: the summary's ``zeropp`` key (per rank, as ``run zero``'s) and its lines."""
    from minipar.run.zero import zeropp_lines, zeropp_node_note, zeropp_per_rank

    z = rows[0]
    out = {"parts": z["parts"], "block": z["block"], "node": z["node"],
           **zeropp_per_rank(rows),
           "formula_per_rank": [r["formula"] for r in rows],
           "zero3_formula_per_rank": [r["zero3_formula"] for r in rows]}
    lines = zeropp_lines(
        out, f"ZeRO++ {'+'.join(z['parts'])} over each stage's dp·cp ranks (block "
        f"{z['block']}, nodes of {z['node']} of them)",
        "  the paper's volumes per rank (its stage's Ψ_p, m micro-batches: 2m - 1 later "
        "fetches, m reduce-scatters): " + ", ".join(
            f"{f['total']:,.0f}" for f in out["formula_per_rank"]), z["parts"], "Ψ_p")
    inner = [a for a in ("pp", "tp") if (options.get(a) or 1) > 1]
    why = (f" (a node holds --node consecutive ranks, and {' and '.join(inner)} "
           f"{'is an inner axis' if len(inner) == 1 else 'are inner axes'}: a stage's "
           "data-parallel ranks sit further apart)" if inner else "")
    note = zeropp_node_note(z["parts"], z["ranks"], z["node"], "dp·cp ranks of a stage", why,
                            "use 4 or more dp·cp ranks and a --node that puts 2 or more of "
                            "them in each of 2 or more nodes (e.g. -n 8 --dp 4 --pp 2 "
                            "--node 4)")
    if note:
        lines.append("  " + note)
    return {"zeropp": out, "lines": lines}


#: the schedules whose ZeRO++ runs the serial ZeRO++ arithmetic replays (one chunk a stage)
ORACLE_SCHEDULES = ("gpipe", "1f1b", "zb-h1", "zb-h2")


def _oracle_reason(options: dict[str, Any]) -> str | None:
    """Why the serial ZeRO++ arithmetic cannot be replayed for this ZeRO++ run (None: it can)."""
    z = {a: options.get(a) or 1 for a in ("tp", "cp", "ep")}
    if options.get("precision") == "fp8":
        from minipar.run.zero import FP8_ZEROPP

        return FP8_ZEROPP
    if options.get("resume"):
        return ("a resumed ZeRO++ run: its serial ZeRO++ arithmetic is replayed from the "
                "initial parameters only; run it from the start to compare bit for bit")
    if z["tp"] > 1 or z["cp"] > 1:
        return ("ZeRO++ with tp or cp: TP's and CP's sums are not the serial run's, so the "
                "quantized blocks see other numbers; the serial ZeRO++ arithmetic is replayed "
                "for tp = cp = 1 (the max |diff| given is from the unquantized serial run)")
    if z["ep"] > 1 or options.get("experts") or _chunks(options) > 1 or \
            options.get("schedule", "1f1b") not in ORACLE_SCHEDULES:
        return ("the serial ZeRO++ arithmetic of the hybrid is replayed for a dense GPT, one "
                f"chunk per stage, schedules {', '.join(ORACLE_SCHEDULES)}; the max |diff| "
                "given is from the unquantized serial run")
    return None


def not_comparable(options: dict[str, Any]) -> str | None:
    """A ZeRO++ run whose serial ZeRO++ arithmetic is not replayed (:func:`own_reference`)."""
    return _oracle_reason(options) if options.get("zeropp") else None


def own_reference(options: dict[str, Any], spec: Any, m: dict[str, Any]) -> dict[str, Any] | None:
    """Rank 0: a ZeRO++ run's reference, the serial run that repeats its quantized arithmetic
    through the pipeline (:func:`minipar.parallel.hybrid.oracle.hybrid_zeropp_reference`);
    None for a run without ZeRO++ or one it cannot replay (:func:`not_comparable`)."""
    z = m.get("zeropp")
    if not z or _oracle_reason(options) is not None:
        return None
    from minipar.parallel.hybrid.oracle import hybrid_zeropp_reference

    ref = hybrid_zeropp_reference(spec, m["dp"], m["pp"], m["micro_batches"],
                                  tuple(z["parts"]), z["node"], z["block"],
                                  options.get("schedule", "1f1b"))
    return {**ref, "against": "the serial ZeRO++ arithmetic of the pipeline"}


def _mean(xs: list[float | None]) -> float | None:
    got = [x for x in xs if x is not None]
    return sum(got) / len(got) if got else None


def trace_events(summary: dict[str, Any]) -> list[dict[str, Any]]:
    """``--trace FILE.json``: the last step's records (every stage of replica 0) and the
    messages in flight on replica 0's ranks (the pipeline's, the experts' all-to-alls) as
    Chrome trace events (:mod:`minipar.trace`)."""
    from minipar.trace import pipeline_events

    events = pipeline_events(summary["records"], name=f"pipeline {summary['schedule']}")
    t0 = min(r[4] for r in summary["records"])
    label = {"p2p": "pipeline message", "a2a": "experts' all-to-all"}
    flights = [(st, "step start", None, None, t0, t0) for st in range(summary["pp"])] + \
        [(st, label[k], None, None, a, b) for st, k, a, b in summary["messages_in_flight"]]
    return events + pipeline_events(flights, pid=1, name="messages in flight (pipeline "
                                    "sends and receives, experts' all-to-alls: post to "
                                    "completion; hidden_fraction)")
