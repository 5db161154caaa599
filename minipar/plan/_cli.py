"""``minipar plan``: the papers' formulas for one model size and rank count.

    minipar plan --params 7.5e9 -n 64            # ZeRO table, ring vs parameter server
    minipar plan --gpt 12,768,50257,1024 -n 8 --tp 2 --seq 1024 --batch 4
    minipar plan --params 1T -n 1024 --json      # the same numbers for machines

Sizes are decimal (GB = 10⁹ bytes, as the ZeRO paper writes them); GiB
(2³⁰ bytes) is shown next to them in the ZeRO table.  Every number comes
from a function of :mod:`minipar.plan`, named in ``docs/plan.md``.
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from minipar.plan.activations import activation_table
from minipar.plan.collectives import gradient_sync
from minipar.plan.model import gpt_param_breakdown
from minipar.plan.tensor import tp_allreduce_bytes, tp_bytes_per_rank_per_layer
from minipar.plan.zero import K_ADAM, mixed_precision_bytes_per_param, zero_table

_SUFFIX = {"K": 1e3, "M": 1e6, "B": 1e9, "G": 1e9, "T": 1e12}
_MODE_FORMULA = {
    "none": "sbh(34 + 5as/h)",
    "tp": "sbh(10 + 24/t + 5as/(ht))",
    "tp+sp": "sbh(34/t + 5as/(ht))",
    "tp+selective": "sbh(10 + 24/t)",
    "tp+sp+selective": "34sbh/t",
    "full": "2sbh",
}


def _param_count(text: str) -> float:
    """'7.5e9', '7.5B', '175e9', '1T' -> a positive number of parameters."""
    t = text.strip()
    scale = _SUFFIX.get(t[-1:].upper(), 1.0) if t else 1.0
    try:
        v = float(t[:-1] if scale != 1.0 else t) * scale
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"{text!r} is not a parameter count (examples: 7.5e9, 7.5B, 1T)"
        ) from None
    if not (v > 0 and v != float("inf")):
        raise argparse.ArgumentTypeError(f"the parameter count must be > 0, got {text!r}")
    return v


def _gpt_sizes(text: str) -> tuple[int, int, int, int]:
    parts = text.split(",")
    try:
        sizes = tuple(int(p) for p in parts)
    except ValueError:
        sizes = ()
    if len(sizes) != 4 or min(sizes) < 1:
        raise argparse.ArgumentTypeError(
            f"--gpt takes four positive integers n_layer,d_model,vocab,n_ctx; got {text!r}"
        )
    return sizes  # type: ignore[return-value]


def _parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(
        prog="minipar plan",
        description="Memory and bytes per rank predicted by the papers (ZeRO, Megatron, "
        "Korthikanti et al.), for any model size.  GB = 1e9 bytes.",
    )
    size = ap.add_mutually_exclusive_group(required=True)
    size.add_argument(
        "--params",
        type=_param_count,
        metavar="PSI",
        help="number of parameters, e.g. 7.5e9, 7.5B, 1T",
    )
    size.add_argument(
        "--gpt",
        type=_gpt_sizes,
        metavar="L,D,V,T",
        help="minipar GPT sizes n_layer,d_model,vocab,n_ctx (count the parameters)",
    )
    ap.add_argument(
        "-n", "--ranks", type=int, required=True, metavar="N", help="data-parallel ranks (ZeRO's N)"
    )
    ap.add_argument("--d-ff", type=int, help="GPT MLP width (default 4·d_model)")
    ap.add_argument("--experts", type=int, default=0, help="GPT: experts per MoE block (0 = dense)")
    ap.add_argument("--moe-every", type=int, default=1, help="GPT: every k-th block is MoE")
    ap.add_argument("--seq", type=int, help="GPT: sequence length s (default n_ctx)")
    ap.add_argument("--batch", type=int, help="GPT: micro-batch size b (default 1)")
    ap.add_argument("--heads", type=int, help="GPT: attention heads a (default d_model/64)")
    ap.add_argument("--tp", type=int, help="GPT: tensor-parallel size t (default 1)")
    ap.add_argument("--json", action="store_true", help="print one JSON object instead of tables")
    return ap


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
    if args.gpt is None and gpt_only:
        raise ValueError(f"{', '.join(gpt_only)} only apply to a GPT: give --gpt L,D,V,T too")
    out: dict[str, Any] = {
        "ranks": args.ranks,
        "bytes_per_param": mixed_precision_bytes_per_param(),
    }
    if args.gpt is None:
        out["params"] = args.params
    else:
        L, d, V, T = args.gpt
        br = gpt_param_breakdown(L, d, V, T, args.d_ff, args.experts, args.moe_every)
        out["params"] = br["total"]
        s = T if args.seq is None else args.seq
        b = 1 if args.batch is None else args.batch
        a = max(1, d // 64) if args.heads is None else args.heads
        t = 1 if args.tp is None else args.tp
        for name, v in (("--seq", s), ("--batch", b), ("--heads", a), ("--tp", t)):
            if v < 1:
                raise ValueError(f"{name} must be >= 1, got {v}")
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
        out["activations"] = {
            "s": s,
            "b": b,
            "h": d,
            "a": a,
            "t": t,
            "n_layer": L,
            "rows": activation_table(s, b, d, a, t, L),
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


def _gb(x: float) -> str:
    """GB (or GiB) to one decimal as the ZeRO paper prints, 3 digits below 1."""
    return f"{x:.1f}" if x >= 1 else f"{x:.3g}"


def _human(nbytes: float) -> str:
    """Decimal bytes with a unit: 15.0 GB, 960 GB, 2.00 TB."""
    for unit, scale in (("PB", 1e15), ("TB", 1e12), ("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if nbytes >= scale:
            v = nbytes / scale
            return f"{v:#.3g} {unit}" if v < 100 else f"{v:.0f} {unit}"
    return f"{nbytes:.0f} B"


def _count(n: float) -> str:
    """A parameter count in words: 7.50 B, 1.00 T, 124 M."""
    for unit, scale in (("T", 1e12), ("B", 1e9), ("M", 1e6), ("K", 1e3)):
        if n >= scale:
            v = n / scale
            return f"{v:#.3g} {unit}" if v < 100 else f"{v:.0f} {unit}"
    return f"{n:.0f}"


def render(p: dict[str, Any]) -> str:
    """The human-readable tables of :func:`plan`'s dict."""
    psi, N, bp = p["params"], p["ranks"], p["bytes_per_param"]
    lines = [
        (f"minipar plan: Ψ = {psi:,.0f} parameters ({_count(psi)}), N = {N} data-parallel ranks")
    ]
    if "gpt" in p:
        g, br = p["gpt"], p["gpt"]["breakdown"]
        moe = f", {g['n_experts']} experts every {g['moe_every']} blocks" if g["n_experts"] else ""
        lines.append(
            f"  GPT n_layer={g['n_layer']} d_model={g['d_model']} vocab={g['vocab_size']} "
            f"n_ctx={g['n_ctx']} d_ff={g['d_ff']}{moe}: {br['total']:,} parameters"
        )
        lines.append(
            "  (" + ", ".join(f"{k} {v:,}" for k, v in br.items() if k != "total" and v) + ")"
        )
    lines += [
        (
            f"mixed-precision Adam: {bp['params']:g} (16-bit params) + {bp['grads']:g} (16-bit grads)"
            f" + {bp['optimizer']:g} (K: fp32 master, momentum, variance) = {bp['total']:g} bytes/param"
        ),
        "",
        (f"ZeRO model states per device (Rajbhandari et al. 2019, arXiv 1910.02054), K = {K_ADAM}"),
        (
            f"  {'stage':<6}{'name':<10}{'formula':<16}{'GB':>9}{'GiB':>9}"
            f"  {'sent/rank/step':>15}  volume"
        ),
    ]
    for r in p["zero"]:
        lines.append(
            f"  {r['stage']:<6}{r['name']:<10}{r['formula']:<16}{_gb(r['GB']):>9}"
            f"{_gb(r['GiB']):>9}  {_human(r['comm_bytes_per_rank']):>15}  "
            f"{'3Ψ' if r['stage'] == 3 else '2Ψ'}"
        )
    lines.append(
        "  sent/rank/step: ring collectives on 16-bit values, 2(N-1)/N·2Ψ bytes "
        "(stage 3: 3(N-1)/N·2Ψ)"
    )
    gs = p["gradient_sync"]
    lines += [
        "",
        f"gradient sync of 16-bit gradients: payload S = 2 bytes × Ψ = {_human(gs['payload'])}",
        (
            f"  ring all-reduce    each rank sends 2(N-1)/N × S = {_human(gs['ring_per_rank'])}"
            " (and receives as much)"
        ),
        (
            f"  parameter server   the server receives N × S = {_human(gs['ps_server_in'])} and "
            f"sends {_human(gs['ps_server_out'])}; each worker sends and receives S = "
            f"{_human(gs['ps_per_worker'])}"
        ),
    ]
    if "activations" in p:
        a = p["activations"]
        lines += [
            "",
            "activation memory (Korthikanti et al. 2022, arXiv 2205.05198), 16-bit:",
            (
                f"  s = {a['s']}, b = {a['b']}, h = {a['h']}, a = {a['a']}, t = {a['t']}, "
                f"{a['n_layer']} layers"
            ),
            f"  {'mode':<17}{'formula':<28}{'per layer':>12}{'all layers':>13}",
        ]
        for r in a["rows"]:
            lines.append(
                f"  {r['mode']:<17}{_MODE_FORMULA[r['mode']]:<28}"
                f"{_human(r['per_layer']):>12}{_human(r['total']):>13}"
            )
        tp = p["tensor_parallel"]
        lines += [
            "",
            (
                f"tensor parallelism (Shoeybi et al. 2019, arXiv 1909.08053), t = {tp['t']}: "
                f"4 all-reduces per layer (2 forward, 2 backward) of b·s·h·2 = "
                f"{_human(tp['allreduce_bytes'])}"
            ),
            (
                f"  each rank sends {_human(tp['bytes_per_rank_per_layer'])} per layer, "
                f"{_human(tp['bytes_per_rank'])} per step"
            ),
        ]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    """``minipar plan``: print the tables (or ``--json``); 2 on bad input, no traceback."""
    argv = list(sys.argv[1:] if argv is None else argv)
    try:
        args = _parser().parse_args(argv)
    except SystemExit as e:  # --help (0) or a usage error (2), already printed
        return int(e.code or 0)
    try:
        result = plan(args)
    except ValueError as e:
        print(f"minipar plan: error: {e}", file=sys.stderr)
        return 2
    print(json.dumps(result, indent=2) if args.json else render(result))
    return 0
