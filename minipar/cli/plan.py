"""``minipar plan``: the papers' formulas for one model size and rank count.

    minipar plan --params 7.5e9 -n 64            # ZeRO table, ring vs parameter server
    minipar plan --gpt 12,768,50257,1024 -n 8 --tp 2 --seq 1024 --batch 4
    minipar plan --params 1T -n 1024 --json      # the same numbers for machines

Sizes are decimal (GB = 10⁹ bytes, as the ZeRO paper writes them); GiB
(2³⁰ bytes) is shown next to them in the ZeRO table.  Every number comes
from a function of :mod:`minipar.plan`, named in ``docs/plan.md``; the tables
are drawn by :mod:`minipar.cli.plan_render`, the sizes read by
:mod:`minipar.cli.plan_sizes`, and ``--cluster`` hands the command line to the
layout planner (:mod:`minipar.cli.plan_layouts`); its options are listed in this
verb's help too (:data:`LAYOUT_OPTIONS`) and refused without ``--cluster``.

Bad input is one line and exit 2 (:mod:`minipar.cli.options`): sizes are
whole numbers from 1 to 10¹² (Ψ up to 10³⁰), the heads must divide d_model
and t the heads.  Numbers too long to read (Ψ ≥ 10¹⁵, more than 1000 PB)
are printed in scientific notation: ``1.00e+30 parameters``.
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from minipar.cli.options import ArgumentParser, error_line, integer
from minipar.cli.plan_render import render
from minipar.cli.plan_sizes import MAX_PARAMS, MAX_SIZE, default_heads, gpt_sizes, param_count
from minipar.plan.activations import (
    MINIPAR_ACTIVATION_MODES,
    activation_table,
    minipar_activation_formula,
)
from minipar.plan.collectives import gradient_sync
from minipar.plan.model import gpt_param_breakdown
from minipar.plan.tensor import tp_allreduce_bytes, tp_bytes_per_rank_per_layer
from minipar.plan.zero import mixed_precision_bytes_per_param, zero_table


def _parser() -> argparse.ArgumentParser:
    size_t = integer(1, MAX_SIZE)
    ap = ArgumentParser(
        prog="minipar plan",
        description="Memory and bytes per rank predicted by the papers (ZeRO, Megatron, "
        "Korthikanti et al.), for any model size.  GB = 1e9 bytes.  With --cluster: the "
        "layout planner (minipar plan --cluster dgx-a100 --help).",
    )
    size = ap.add_mutually_exclusive_group(required=True)
    size.add_argument(
        "--params",
        type=param_count,
        metavar="PSI",
        help="number of parameters, e.g. 7.5e9, 7.5B, 1T",
    )
    size.add_argument(
        "--gpt",
        type=gpt_sizes,
        metavar="L,D,V,T",
        help="minipar GPT sizes n_layer,d_model,vocab,n_ctx (count the parameters)",
    )
    ap.add_argument(
        "-n", "--ranks", type=size_t, required=True, metavar="N",
        help="data-parallel ranks (ZeRO's N)",
    )
    ap.add_argument("--d-ff", type=size_t, help="GPT MLP width (default 4·d_model)")
    ap.add_argument("--experts", type=integer(0, MAX_SIZE), default=0,
                    help="GPT: experts per MoE block, 0 = dense (default %(default)s)")
    ap.add_argument("--shared-experts", type=integer(0, MAX_SIZE), default=0, metavar="S",
                    help="GPT: shared experts per MoE block, every token's (default 0)")
    ap.add_argument("--expert-width", type=size_t, metavar="W",
                    help="GPT: the experts' hidden width (default d_ff)")
    ap.add_argument("--top-k", type=size_t,
                    help="GPT: experts per token; with --expert-groups the node-limited "
                    "dispatch bytes (default 1)")
    ap.add_argument("--expert-groups", type=size_t, metavar="G",
                    help="GPT: node-limited routing over G groups of experts (nodes)")
    ap.add_argument("--groups-per-token", type=size_t, metavar="M",
                    help="GPT: with --expert-groups, a token's experts in at most M groups "
                    "(default 1)")
    ap.add_argument("--moe-every", type=size_t, default=1,
                    help="GPT: every k-th block is MoE, 1 .. n_layer (default %(default)s)")
    ap.add_argument("--seq", type=size_t, help="GPT: sequence length s (default n_ctx)")
    ap.add_argument("--batch", type=size_t, help="GPT: micro-batch size b (default 1)")
    ap.add_argument("--heads", type=size_t,
                    help="GPT: attention heads a, dividing d_model (default d_model/64, or the "
                    "largest divisor of d_model below it)")
    ap.add_argument("--tp", type=size_t, help="GPT: tensor-parallel size t, dividing a (default 1)")
    ap.add_argument("--json", action="store_true", help="print one JSON object instead of tables")
    lay = ap.add_argument_group(
        "the layout planner", "with --cluster, minipar plan ranks every layout of N GPUs by "
        "estimated step time instead (then --gpus N replaces -n; details: minipar plan "
        "--cluster dgx-a100 --help)")
    for flag, metavar, text in LAYOUT_OPTIONS:
        lay.add_argument(flag, metavar=metavar, default=None, help=text)
    return ap


#: The options only the layout planner (:mod:`minipar.cli.plan_layouts`) takes, listed in
#: this verb's help so that ``minipar plan --help`` names every option; given without
#: ``--cluster`` they are refused in one line.
LAYOUT_OPTIONS = (
    ("--cluster", "FILE|PRESET", ("the cluster: dgx-a100, h100, a .json/.toml file, or "
                                  "key=value,... text; turns on the layout planner")),
    ("--gpus", "N", "with --cluster: GPUs to lay out (-n means the same there)"),
    ("--model", "PRESET", ("with --cluster: a model preset (gpt3-175b, llama3-405b, ...) "
     "or its numbers")),
    ("--layout", "dp=..,tp=..", ("with --cluster: evaluate this one layout "
     "(dp=16,tp=8,pp=12,vp=2,mb=1,zero=1,remat=selective,sp=on)")),
    ("--layers", "L", "with --cluster and --params: transformer layers"),
    ("--hidden", "H", "with --cluster and --params: hidden size h"),
    ("--vocab", "V", ("with --cluster and --params: vocabulary for the FLOP count "
                      "(default 51200)")),
    ("--global-batch", "B", "with --cluster: sequences per step (default N)"),
    ("--max-micro-batch", "b", "with --cluster: largest micro-batch size tried (default 8)"),
    ("--max-cp", "C", "with --cluster: largest context-parallel size tried (default: any)"),
    ("--top", "K", "with --cluster: layouts to print (default 10)"),
)


def _layout_only(argv: list[str]) -> list[str]:
    """The layout planner's options written in ``argv`` (``--gpus`` or ``--gpus=8``)."""
    flags = [flag for flag, _, _ in LAYOUT_OPTIONS]
    return [f for f in flags if any(a == f or a.startswith(f + "=") for a in argv)]


def plan(args: argparse.Namespace) -> dict[str, Any]:
    """Every number the verb prints, as one JSON-ready dict."""
    if args.ranks < 1:
        raise ValueError(f"-n must be >= 1 data-parallel rank, got {args.ranks}")
    gpt_only = [
        f"--{k.replace('_', '-')}"
        for k in ("seq", "batch", "heads", "tp", "d_ff")
        if getattr(args, k) is not None
    ]
    if args.experts or args.moe_every != 1:
        gpt_only.append("--experts/--moe-every")
    moe_only = [f"--{k.replace('_', '-')}" for k in ("expert_width", "top_k", "expert_groups",
                                                      "groups_per_token")
                if getattr(args, k) is not None] + (["--shared-experts"] if args.shared_experts
                                                    else [])
    if moe_only and not args.experts:
        raise ValueError(f"{', '.join(moe_only)}: only for a mixture of experts: give "
                         "--experts E too")
    if args.gpt is None and gpt_only:
        raise ValueError(f"{', '.join(gpt_only)} only appl{'ies' if len(gpt_only) == 1 else 'y'}"
                         " to a GPT: give --gpt L,D,V,T too")
    out: dict[str, Any] = {
        "ranks": args.ranks,
        "bytes_per_param": mixed_precision_bytes_per_param(),
    }
    if args.gpt is None:
        out["params"] = args.params
    else:
        L, d, V, T = args.gpt
        s = T if args.seq is None else args.seq
        b = 1 if args.batch is None else args.batch
        a = default_heads(d) if args.heads is None else args.heads
        t = 1 if args.tp is None else args.tp
        _check_gpt(L, d, a, t, args)
        br = gpt_param_breakdown(L, d, V, T, args.d_ff, args.experts, args.moe_every,
                                 args.shared_experts, args.expert_width)
        if br["total"] > MAX_PARAMS:
            raise ValueError(f"--gpt {L},{d},{V},{T} has {br['total']:.3g} parameters, more "
                             f"than {MAX_PARAMS:.0e}: give smaller sizes")
        out["params"] = br["total"]
        out["gpt"] = {
            "n_layer": L,
            "d_model": d,
            "vocab_size": V,
            "n_ctx": T,
            "d_ff": 4 * d if args.d_ff is None else args.d_ff,
            "n_experts": args.experts,
            "moe_every": args.moe_every,
            "breakdown": br,
        }
        if args.experts:
            out["gpt"]["moe"] = _moe_plan(args, s * b, d)
        out["activations"] = {
            "s": s,
            "b": b,
            "h": d,
            "a": a,
            "t": t,
            "n_layer": L,
            "rows": activation_table(s, b, d, a, t, L),
            "minipar_rows": [
                {"mode": m, "per_layer": minipar_activation_formula(s, b, d, a, t, m),
                 "total": L * minipar_activation_formula(s, b, d, a, t, m)}
                for m in MINIPAR_ACTIVATION_MODES],
        }
        out["tensor_parallel"] = {
            "t": t,
            "allreduces_per_layer": 4,
            "allreduce_bytes": tp_allreduce_bytes(b, s, d),
            "bytes_per_rank_per_layer": tp_bytes_per_rank_per_layer(b, s, d, t),
            "bytes_per_rank": L * tp_bytes_per_rank_per_layer(b, s, d, t),
        }
    out["zero"] = zero_table(out["params"], args.ranks)
    out["gradient_sync"] = gradient_sync(out["params"], args.ranks)
    return out


def _moe_plan(args: Any, tokens: int, d: int) -> dict[str, Any]:
    """DeepSeek-V3's options of the plan: shared experts and width, and the dispatch bytes a
    token sends across groups (nodes) with node-limited routing (2-byte activations)."""
    from minipar.nn.gpt_config import check_moe
    from minipar.plan.moe import node_limited_dispatch_bytes

    k, g = args.top_k or 1, args.expert_groups or 1
    m = args.groups_per_token or 1
    check_moe(args.experts, k, "softmax", "aux", 1e-3, g, m)
    return {"shared_experts": args.shared_experts,
            "expert_width": args.expert_width or args.d_ff or 4 * d, "top_k": k,
            "expert_groups": g, "groups_per_token": m,
            "dispatch_bytes_per_token": {key: v / tokens for key, v in
                                         node_limited_dispatch_bytes(tokens, d, k, g, m).items()}}


def _check_gpt(L: int, d: int, a: int, t: int, args: argparse.Namespace) -> None:
    """The GPT options fit: a | d, t | a, t | d_ff, moe_every <= L (ValueError naming them)."""
    if d % a:
        heads = ", ".join(str(h) for h in range(1, min(d, 64) + 1) if d % h == 0)
        raise ValueError(f"--heads {a} does not divide d_model {d} (each head takes d_model/heads "
                         f"columns); --heads must divide {d}: {heads}{', ...' if d > 64 else ''}")
    if a % t:
        tps = ", ".join(str(x) for x in range(1, a + 1) if a % x == 0)
        raise ValueError(f"--tp {t} does not divide the {a} heads (Megatron gives each rank "
                         f"heads/t whole heads); --tp must be one of {tps}")
    d_ff = 4 * d if args.d_ff is None else args.d_ff
    if d_ff % t:
        raise ValueError(f"--tp {t} does not divide --d-ff {d_ff} (each rank holds d_ff/t MLP "
                         "columns)")
    if not args.experts and args.moe_every != 1:
        raise ValueError("--moe-every only applies to a mixture of experts: give --experts E too")
    if args.experts and args.moe_every > L:
        raise ValueError(f"--moe-every must be from 1 to n_layer = {L}, got {args.moe_every}")


def main(argv: list[str] | None = None) -> int:
    """``minipar plan``: print the tables (or ``--json``); 2 on bad input, no traceback."""
    argv = list(sys.argv[1:] if argv is None else argv)
    if any(a == "--cluster" or a.startswith("--cluster=") for a in argv):  # the layout planner
        from minipar.cli.plan_layouts import main as layouts_main

        return layouts_main(argv)
    written = [] if "-h" in argv or "--help" in argv else _layout_only(argv)
    if not written:  # an abbreviation (--glob) is only seen once parsed
        args = _parser().parse_args(argv)
        written = [f for f, _, _ in LAYOUT_OPTIONS
                   if getattr(args, f[2:].replace("-", "_")) is not None]
    if written:
        verb = "applies" if len(written) == 1 else "apply"
        return error_line("minipar plan", f"{', '.join(written)} only {verb} to the layout "
                          "planner: give --cluster too (minipar plan --cluster dgx-a100 --help)")
    try:
        result = plan(args)
    except ValueError as e:
        return error_line("minipar plan", e)
    print(json.dumps(result, indent=2) if args.json else render(result))
    return 0
