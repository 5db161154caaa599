"""``minipar plan --cluster ...``: the layout planner's verb (top layouts, PTD-P's takeaways).

EN layout planner command · RU команда планировщика раскладки · ZH 布局规划命令

    minipar plan --gpt 96,12288,51200,2048 --gpus 1024 --cluster dgx-a100 --global-batch 1536
    minipar plan --params 175B --layers 96 --hidden 12288 --heads 96 --seq 2048 \\
                 --gpus 1024 --cluster h100 --top 5 --json
    minipar plan --gpt 32,20480,51200,2048 --gpus 64 --cluster my_cluster.toml

:func:`minipar.cli.plan.main` hands the command line here when it names
``--cluster``.  Every number comes from :mod:`minipar.plan.search`,
:mod:`~minipar.plan.step_time` and :mod:`~minipar.plan.layouts`.  Bad input
(a cluster field missing or ≤ 0, t or p that no layout allows, a model that
fits no layout: the smallest memory any layout needs) is one line, exit 2.
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from minipar.cli.options import ArgumentParser, error_line, integer
from minipar.cli.plan_sizes import default_heads, gpt_sizes, param_count
from minipar.plan.cluster import load_cluster
from minipar.plan.human import human_bytes, human_count
from minipar.plan.layouts import Layout, gpt_model, model_from_params
from minipar.plan.presets import LAYOUT_KEYS, MODEL_PRESETS, load_model, parse_layout
from minipar.plan.search import compare_placements, search
from minipar.plan.step_time import estimate

MAX_GPUS = 65536
_SIZE = integer(1, 10**9)


def _parser() -> argparse.ArgumentParser:
    ap = ArgumentParser(
        prog="minipar plan",
        description="The layout planner: every layout (d, t, p, c, ZeRO stage, remat, "
        "micro-batches) of N GPUs for a model, those that fit, ranked by estimated step time "
        "(an estimate: per-GEMM roofline, memory-bound kernels, bubble, exposed "
        "communication); --layout evaluates one given layout.")
    size = ap.add_mutually_exclusive_group(required=True)
    size.add_argument("--model", metavar="PRESET|NUMBERS",
                      help=f"a preset ({', '.join(MODEL_PRESETS)}) or layers=,hidden=,heads=,"
                      "seq=,vocab=[,ffn=,kv_heads=,swiglu]")
    size.add_argument("--gpt", type=gpt_sizes, metavar="L,D,V,T",
                      help="minipar GPT sizes n_layer,d_model,vocab,n_ctx")
    size.add_argument("--params", type=param_count, metavar="PSI",
                      help="parameters (7.5e9, 175B); needs --layers, --hidden, --heads")
    ap.add_argument("--layers", type=_SIZE, help="with --params: transformer layers")
    ap.add_argument("--hidden", type=_SIZE, help="with --params: hidden size h")
    ap.add_argument("--vocab", type=_SIZE, default=None,
                    help="with --params: vocabulary for the FLOP count (default 51200)")
    ap.add_argument("--heads", type=_SIZE, help="attention heads (default d_model/64)")
    ap.add_argument("--seq", type=_SIZE, help="sequence length s (default n_ctx; 2048 with "
                    "--params)")
    ap.add_argument("--d-ff", type=_SIZE, help="GPT MLP width (default 4·d_model)")
    ap.add_argument("--gpus", "-n", type=integer(1, MAX_GPUS), required=True, metavar="N",
                    help="GPUs to lay out")
    ap.add_argument("--cluster", required=True, metavar="FILE|PRESET",
                    help="dgx-a100, h100, a .json/.toml file, or key=value,... text")
    ap.add_argument("--global-batch", type=_SIZE, metavar="B",
                    help="sequences per step (default N)")
    ap.add_argument("--max-micro-batch", type=integer(1, 1024), default=8, metavar="b",
                    help="largest micro-batch size tried (default %(default)s)")
    ap.add_argument("--max-cp", type=integer(1, MAX_GPUS), default=None, metavar="C",
                    help="largest context-parallel size tried (default: any; 1 = PTD-P's 3D)")
    ap.add_argument("--top", type=integer(1, 10**6), default=10, metavar="K",
                    help="layouts to print (default %(default)s)")
    ap.add_argument("--layout", metavar="dp=..,tp=..,pp=..,...",
                    help="evaluate this one layout instead of searching: keys "
                    f"{', '.join(LAYOUT_KEYS)} (e.g. dp=16,tp=8,pp=12,vp=2,mb=1,zero=1,"
                    "remat=selective,sp=on)")
    ap.add_argument("--json", action="store_true", help="print one JSON object")
    return ap


def _model(args: argparse.Namespace) -> Any:
    if args.model is not None:
        extra = [f"--{k.replace('_', '-')}" for k in ("layers", "hidden", "vocab", "heads",
                                                      "d_ff") if getattr(args, k) is not None]
        if extra:
            raise ValueError(f"{', '.join(extra)}: --model gives the sizes (write them as "
                             "--model layers=..,hidden=..,...)")
        return load_model(args.model, args.seq)
    if args.gpt is not None:
        extra = [f"--{k}" for k in ("layers", "hidden", "vocab") if getattr(args, k) is not None]
        if extra:
            verb = "applies" if len(extra) == 1 else "apply"
            raise ValueError(f"{', '.join(extra)} only {verb} to --params; --gpt L,D,V,T gives "
                             "the sizes")
        L, d, V, T = args.gpt
        a = default_heads(d) if args.heads is None else args.heads
        return gpt_model(L, d, V, T, a, args.seq, args.d_ff)
    missing = [f"--{k}" for k in ("layers", "hidden", "heads") if getattr(args, k) is None]
    if missing:
        raise ValueError(f"--params needs the shape too: give {', '.join(missing)}")
    if args.d_ff is not None:
        raise ValueError("--d-ff only applies to --gpt")
    return model_from_params(args.params, args.layers, args.hidden, args.heads,
                             2048 if args.seq is None else args.seq,
                             51200 if args.vocab is None else args.vocab)


def takeaways(model: Any, ranked: list[dict[str, Any]], cluster: Any, B: int) -> dict[str, Any]:
    """PTD-P's takeaways as this estimate sees them, from the ranked (fitting) layouts."""
    G = cluster.gpus_per_node
    out: dict[str, Any] = {}
    tp = next((e for e in ranked if e["layout"]["t"] > 1 and e["layout"]["placement"]
               == "tp-inner"), None) if ranked and ranked[0]["n"] > G else None
    if tp is not None:
        both = compare_placements(model, Layout(**tp["layout"]), cluster, B)
        out["tp_inside_vs_across_servers"] = {
            "layout": tp["layout"], "tp_inside_step_s": both["tp-inner"]["step_s"],
            "tp_across_step_s": both["pp-inner"]["step_s"],
            "tp_inside_within_node": both["tp-inner"]["traffic"]["tp"]["within_node"],
            "tp_across_within_node": both["pp-inner"]["traffic"]["tp"]["within_node"]}
    inside = next((e for e in ranked if e["layout"]["t"] <= G), None)
    beyond = next((e for e in ranked if e["layout"]["t"] > G), None)
    if inside is not None and beyond is not None:
        out["t_le_node_vs_t_gt_node"] = {"best_t_le_node": inside["layout"],
                                         "step_s": inside["step_s"],
                                         "best_t_gt_node": beyond["layout"],
                                         "step_s_t_gt_node": beyond["step_s"]}
    return out


def plan_layouts(args: argparse.Namespace) -> dict[str, Any]:
    """Everything the verb prints, as one JSON-ready dict."""
    model = _model(args)
    cluster = load_cluster(args.cluster)
    B = args.gpus if args.global_batch is None else args.global_batch
    found = search(model, args.gpus, cluster, B, None, args.max_micro_batch,
                   max_c=args.max_cp)
    ranked: list[dict[str, Any]] = found["ranked"]  # type: ignore[assignment]
    return {"model": {k: getattr(model, k) for k in ("n_layer", "hidden", "heads", "seq", "vocab",
                                                     "d_ff", "psi")},
            "cluster": cluster.as_fields(), "gpus": args.gpus, "global_batch": B,
            "considered": found["considered"], "fitting": found["fitting"],
            "smallest": found["smallest"], "ranked": _distinct(ranked, args.top),
            "takeaways": takeaways(model, ranked, cluster, B),
            "assumptions": "an estimate: per-GEMM roofline, memory-bound kernels, ring "
                           "collectives (alpha-beta), DP reduction behind backward, TP and "
                           "PP messages exposed; per-layer activations only"}


def _s(x: float) -> str:
    """Seconds as they read: 12.3µs, 4.56ms, 17.64s."""
    if x < 1e-3:
        return f"{x * 1e6:.3g}µs"
    return f"{x * 1e3:.3g}ms" if x < 1 else f"{x:.2f}s"


def memory_text(x: float) -> str:
    """Memory per GPU as it reads: 73.1 GB; below 0.1 GB in the unit that shows it (939 kB)."""
    return f"{x / 1e9:.1f} GB" if x >= 1e8 else human_bytes(x)


def compare_text(other: float, this: float) -> str:
    """How ``other`` compares with ``this`` (seconds): "1.45× slower", or "1.03× faster"."""
    r = other / this
    return f"{r:.2f}× slower" if r >= 1 else f"{1 / r:.2f}× faster"


def _distinct(ranked: list[dict[str, Any]], top: int) -> list[dict[str, Any]]:
    """The first ``top`` estimates, a layout that differs from the previous one only by a
    placement that changes nothing (every group in the same kind of link) left out."""
    out: list[dict[str, Any]] = []
    for e in ranked:
        if out:
            prev = out[-1]
            same = {k: v for k, v in e["layout"].items() if k != "placement"} == {
                k: v for k, v in prev["layout"].items() if k != "placement"}
            if same and all(e["traffic"][a].get("within_node") == prev["traffic"][a].get(
                    "within_node") for a in e["traffic"]):
                continue
        out.append(e)
        if len(out) == top:
            break
    return out


def render_layouts(r: dict[str, Any]) -> str:
    """The table of the top layouts and the takeaways."""
    m, c = r["model"], r["cluster"]
    G = c["gpus_per_node"]
    lines = [
        (f"minipar plan: {m['n_layer']} layers × h {m['hidden']}, {m['heads']} heads, s "
        f"{m['seq']}, V {m['vocab']}: Ψ = {human_count(m['psi'])}; {r['gpus']} GPUs of "
        f"{c['name']} ({c['gpus_per_node']} per node, {c['memory_gb']:g} GB, NVLink "
        f"{c['intra_node_gbps']:g} GB/s, network {c['inter_node_gbps']:g} GB/s per GPU, "
        f"{c['peak_tflops']:g} TFLOP/s × {c['efficiency']:g})"),
        (f"global batch {r['global_batch']} sequences; {r['considered']} layouts in the space, "
        f"{r['fitting']} fit; step times are estimates (docs/plan.md: which way each errs)"),
        "",
        (f"{'#':>3} {'d':>4} {'t':>3} {'p':>3} {'c':>3} {'ZeRO':>4} {'remat':<9} {'b':>2} "
        f"{'m':>5} {'place':<8} {'mem/GPU':>9} {'bubble':>7}  {'tp':>14} {'cp':>14} "
        f"{'pp':>14} {'dp':>14} {'step':>8} {'MFU':>6}"),
    ]
    for i, e in enumerate(r["ranked"], 1):
        lay = e["layout"]
        axes = [f"{human_bytes(v['bytes'])}/{_s(v['seconds'])}" if v["bytes"] else "-"
                for v in (e["traffic"][a] for a in ("tp", "cp", "pp", "dp"))]
        lines.append(
            f"{i:>3} {lay['d']:>4} {lay['t']:>3} {lay['p']:>3} {lay['c']:>3} {lay['zero']:>4} "
            f"{lay['remat']:<9} {lay['b']:>2} {lay['m']:>5} {lay['placement']:<8} "
            f"{memory_text(e['memory']['total']):>9} {e['bubble_ratio']:>6.1%}  "
            + " ".join(f"{a:>14}" for a in axes)
            + f" {_s(e['step_s']):>8} {e['mfu']:>6.1%}")
    lines.append("  traffic: bytes one rank sends per step / their α-β seconds; bubble: "
                 "(p−1)/m of the ideal time (1F1B)")
    tk = r["takeaways"]
    lines += ["", "PTD-P's takeaways (Narayanan et al. 2021, arXiv 2104.04473) in this estimate:"]
    if "tp_inside_vs_across_servers" in tk:
        x = tk["tp_inside_vs_across_servers"]
        lay = x["layout"]
        pipe = (", pipeline across", "pipeline inside, ") if lay["p"] > 1 else ("", "")
        lines.append(
            f"  t={lay['t']} p={lay['p']} d={lay['d']} c={lay['c']}: tensor groups inside a "
            f"server{pipe[0]}: {_s(x['tp_inside_step_s'])}; {pipe[1]}tensor groups "
            f"across servers: {_s(x['tp_across_step_s'])} "
            f"({compare_text(x['tp_across_step_s'], x['tp_inside_step_s'])})")
    if "t_le_node_vs_t_gt_node" in tk:
        x = tk["t_le_node_vs_t_gt_node"]
        lines.append(
            f"  best with t ≤ {c['gpus_per_node']} (one server): {_s(x['step_s'])}; best with "
            f"t > {c['gpus_per_node']}: {_s(x['step_s_t_gt_node'])} "
            f"({compare_text(x['step_s_t_gt_node'], x['step_s'])})")
    if not tk:
        lines.append(f"  (nothing to compare: {'all GPUs are in one server' if r['gpus'] <= G else 'no fitting layout uses tensor parallelism'})")
    return "\n".join(lines)


def evaluate_layout(args: argparse.Namespace) -> dict[str, Any]:
    """``--layout``: the estimate of one given layout, every number the verb prints."""
    model = _model(args)
    cluster = load_cluster(args.cluster)
    B = args.gpus if args.global_batch is None else args.global_batch
    lay = parse_layout(args.layout, model, args.gpus, B)
    e = estimate(model, lay, cluster, B)
    if not e["fits"]:
        mem = e["memory"]
        raise ValueError(f"layout does not fit: {memory_text(mem['total'])} per GPU on stage "
                         f"{mem['stage']} (model states {memory_text(mem['states'])}, "
                         f"activations {memory_text(mem['activations'])}) > "
                         f"{memory_text(cluster.memory_bytes)}")
    return {"model": {k: getattr(model, k) for k in ("name", "family", "n_layer", "hidden",
                                                     "heads", "kv_heads", "seq", "vocab",
                                                     "d_ff", "psi")},
            "cluster": cluster.as_fields(), "gpus": args.gpus, "global_batch": B,
            "estimate": e,
            "assumptions": "an estimate: per-GEMM roofline with a per-kernel overhead, "
                           "memory-bound kernels at 80% of HBM bandwidth, alpha-beta ring "
                           "collectives at the fitted share of link bandwidth; constants "
                           "fitted on PTD-P Table 1 (docs/plan-calibration.md)"}


_PART_NAMES = (("gemm", "GEMMs (forward + backward)"), ("memory", "memory-bound kernels"),
               ("recompute", "recomputation"), ("tp", "tensor/sequence parallel (exposed)"),
               ("cp", "context parallel (exposed)"), ("pp", "pipeline messages"),
               ("bubble", "pipeline bubble"), ("zero3", "ZeRO-3 gathers (exposed)"),
               ("dp", "data-parallel reduction (exposed)"), ("optimizer", "optimizer step"))


def render_layout(r: dict[str, Any]) -> str:
    """One layout's estimate as it reads: the step by part, TFLOP/s, memory, bytes."""
    m, c, e = r["model"], r["cluster"], r["estimate"]
    lay = e["layout"]
    lines = [
        (f"minipar plan: {m['name'] or 'model'} ({m['n_layer']} layers × h {m['hidden']}, "
        f"{m['heads']} heads, s {m['seq']}, V {m['vocab']}: Ψ = {human_count(m['psi'])}) on "
        f"{r['gpus']} GPUs of {c['name']}, global batch {r['global_batch']}"),
        (f"layout: dp={lay['d']} tp={lay['t']} pp={lay['p']} cp={lay['c']} vp={lay['v']} "
        f"mb={lay['b']} (m={lay['m']} micro-batches) zero={lay['zero']} remat={lay['remat']} "
        f"sp={'on' if lay['sp'] else 'off'} {lay['placement']}"
        + (f" schedule={lay['schedule']}" if lay.get("schedule", "1f1b") != "1f1b" else "")),
        "",
        f"step {_s(e['step_s'])} (an estimate), by part:"]
    for key, name in _PART_NAMES:
        x = e["parts_s"][key]
        if x:
            lines.append(f"  {name:<38} {_s(x):>9} {x / e['step_s']:>6.1%}")
    lines += [
        "",
        (f"TFLOP/s per GPU: {e['tflops_per_gpu']:.1f} counting recomputation (PTD-P eq. 3 for "
        f"full), {e['model_tflops_per_gpu']:.1f} model FLOPs; MFU {e['mfu']:.1%}, "
        f"HFU {e['hfu']:.1%} of {c['peak_tflops']:g} TFLOP/s"),
        (f"tokens/s {e['tokens_per_s']:,.0f}; bubble "
         + (f"(PP/2−1)(F&B+B−3W) of DualPipe's table, F : B : W = 1 : 2 : 1, PP = "
            f"{lay['p'] * (1 if lay['schedule'] == 'dualpipe' else 2)}"
            if lay.get("schedule", "1f1b") != "1f1b" else "(p−1)/(v·m)")
         + f" = {e['bubble_ratio']:.1%} of the ideal time")]
    if lay.get("schedule", "1f1b") != "1f1b":
        lines.append(f"{lay['schedule']}: each GPU holds two stages' parameters "
                     + ("(two copies of the model over the pipeline, their gradients summed "
                        "before the step)" if lay["schedule"] == "dualpipe" else
                        "(stages s and 2p − 1 − s of 2p)")
                     + ", and the activations of PP + 1 stages in flight")
    mem = e["memory"]
    lines.append(
        f"memory per GPU (stage {mem['stage']}): {memory_text(mem['total'])} = parameters "
        f"{memory_text(mem['params'])} + gradients {memory_text(mem['grads'])} + optimizer "
        f"{memory_text(mem['optimizer'])} + activations {memory_text(mem['activations'])} "
        f"(of {c['memory_gb']:g} GB)")
    axes = [f"{a} {human_bytes(v['bytes'])} ({'NVLink' if v.get('within_node') else 'network'})"
            for a, v in e["traffic"].items() if v["bytes"]]
    lines.append("bytes one GPU sends per step: " + (", ".join(axes) or "none"))
    return "\n".join(lines)


def main(argv: list[str]) -> int:
    """The verb with ``--cluster``: tables or ``--json``; 2 on bad input, one line."""
    args = _parser().parse_args(argv)
    try:
        if args.layout is not None:
            result = evaluate_layout(args)
            text = render_layout
        else:
            result = plan_layouts(args)
            text = render_layouts
    except ValueError as e:
        return error_line("minipar plan", e)
    print(json.dumps(result, indent=2) if args.json else text(result))
    return 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main(sys.argv[1:]))
