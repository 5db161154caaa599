"""``minipar plan``'s tables: the dict of :func:`minipar.cli.plan.plan`, for people.

EN plan tables · RU таблицы плана · ZH 规划表格

Units as the papers print them: GB = 10⁹ bytes and GiB = 2³⁰ in the ZeRO
table, decimal kB … PB elsewhere.  Any size the verb accepts prints in a
readable width: past 10¹⁵ parameters or 1000 PB, e-notation (``1.00e+30``,
``1.60e+31 B``) replaces digit strings 30 characters long.
"""

from __future__ import annotations

from typing import Any

from minipar.plan.human import human_bytes, human_count
from minipar.plan.zero import K_ADAM

_MODE_FORMULA = {
    "none": "sbh(34 + 5as/h)",
    "tp": "sbh(10 + 24/t + 5as/(ht))",
    "tp+sp": "sbh(34/t + 5as/(ht))",
    "tp+selective": "sbh(10 + 24/t)",
    "tp+sp+selective": "34sbh/t",
    "full": "2sbh",
}
#: minipar's block, no dropout (:func:`minipar.plan.activations.minipar_activation_formula`)
_MINIPAR_FORMULA = {
    "none": "sbh(40 + 2as/h) + 8sb",
    "tp": "sbh(8 + 32/t + 2as/(ht)) + 8sb",
    "tp+sp": "sbh(40/t + 2as/(ht)) + 8sb/t",
}


def _gb(x: float) -> str:
    """GB (or GiB) to one decimal as the ZeRO paper prints; 3 digits below 1 and above 10⁶."""
    if x >= 1e6:
        return f"{x:.3g}"
    return f"{x:.1f}" if x >= 1 else f"{x:.3g}"


def _int(n: float) -> str:
    """A count with thousands separators below 10¹⁵, in e-notation from there: 1.00e+30."""
    return f"{n:,.0f}" if n < 1e15 else f"{n:.2e}"


def render(p: dict[str, Any]) -> str:
    """The human-readable tables of :func:`plan`'s dict."""
    psi, N, bp = p["params"], p["ranks"], p["bytes_per_param"]
    lines = [
        f"minipar plan: Ψ = {_int(psi)} parameters"
        + (f" ({human_count(psi)})" if psi < 1e15 else "") + f", N = {_int(N)} data-parallel ranks"
    ]
    if "gpt" in p:
        g, br = p["gpt"], p["gpt"]["breakdown"]
        moe = f", {g['n_experts']} experts every {g['moe_every']} blocks" if g["n_experts"] else ""
        lines.append(
            f"  GPT n_layer={g['n_layer']} d_model={g['d_model']} vocab={g['vocab_size']} "
            f"n_ctx={g['n_ctx']} d_ff={g['d_ff']}{moe}: {_int(br['total'])} parameters"
        )
        lines.append(
            "  (" + ", ".join(f"{k} {_int(v)}" for k, v in br.items() if k != "total" and v) + ")"
        )
        if "moe" in g:
            m, per = g["moe"], g["moe"]["dispatch_bytes_per_token"]
            lines.append(
                f"  experts: top-{m['top_k']} of {g['n_experts']} (width {m['expert_width']}), "
                f"{m['shared_experts']} shared; dispatch bytes per token (2-byte activations): "
                f"{per['per_assignment']:g} one vector per assignment, at most "
                f"{per['per_group']:g} across groups with node-limited routing (M = "
                f"{m['groups_per_token']} of G = {m['expert_groups']}; "
                f"{per['per_group_unlimited']:g} without the limit)")
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
            f"{_gb(r['GiB']):>9}  {human_bytes(r['comm_bytes_per_rank']):>15}  "
            f"{'3Ψ' if r['stage'] == 3 else '2Ψ'}"
        )
    lines.append(
        "  sent/rank/step: ring collectives on 16-bit values, 2(N-1)/N·2Ψ bytes "
        "(stage 3: 3(N-1)/N·2Ψ)"
    )
    gs = p["gradient_sync"]
    lines += [
        "",
        f"gradient sync of 16-bit gradients: payload S = 2 bytes × Ψ = {human_bytes(gs['payload'])}",
        (
            f"  ring all-reduce    each rank sends 2(N-1)/N × S = {human_bytes(gs['ring_per_rank'])}"
            " (and receives as much)"
        ),
        (
            f"  parameter server   the server receives N × S = {human_bytes(gs['ps_server_in'])} and "
            f"sends {human_bytes(gs['ps_server_out'])}; each worker sends and receives S = "
            f"{human_bytes(gs['ps_per_worker'])}"
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
                f"{human_bytes(r['per_layer']):>12}{human_bytes(r['total']):>13}"
            )
        if "minipar_rows" in a:  # minipar's own block: no dropout (sequence_parallel measures it)
            lines.append("  minipar's block (no dropout masks; keeps tanh of GELU; 1/σ in fp32):")
            for r in a["minipar_rows"]:
                lines.append(
                    f"  {r['mode']:<17}{_MINIPAR_FORMULA[r['mode']]:<31}"
                    f"{human_bytes(r['per_layer']):>9}{human_bytes(r['total']):>13}"
                )
        tp = p["tensor_parallel"]
        lines += [
            "",
            (
                f"tensor parallelism (Shoeybi et al. 2019, arXiv 1909.08053), t = {tp['t']}: "
                f"4 all-reduces per layer (2 forward, 2 backward) of b·s·h·2 = "
                f"{human_bytes(tp['allreduce_bytes'])}"
            ),
            (
                f"  each rank sends {human_bytes(tp['bytes_per_rank_per_layer'])} per layer, "
                f"{human_bytes(tp['bytes_per_rank'])} per step"
            ),
        ]
    return "\n".join(lines)
