"""Expert parallelism, measured — параллелизм экспертов: измерения — 专家并行的实测.

EN all-to-all bytes, expert load, token dropping · RU байты all-to-all, нагрузка экспертов,
отбрасывание токенов · ZH 全交换字节、专家负载、token 丢弃

**All-to-all bytes.**  :func:`alltoall_bytes`: the exact bytes a rank sends
per MoE layer per step in each of the five all-to-alls
(:data:`~minipar.parallel.expert_parallel.layout.OPS`).  E_l = E/ep, d the
width, b bytes per element: counts (ep−1)·E_l·8; dispatch and d(out)
(ep−1)·E_l·C_r·d·b each; combine and d(buffers) Σ_{j≠r} E_l·C_j·d·b each.
With one C for all, the four data all-to-alls are 4·(ep−1)/ep·E·C·d·b,
GShard's two all-to-alls forward and two backward of the padded (E, C, d)
buffer (``minipar.plan.moe.moe_alltoall_bytes_per_rank``: C over the k·N
assignments, as GShard and the serial block size it).

**Expert load and dropped tokens against the capacity factor.**
Switch Transformer (Fedus, Zoph & Shazeer 2021, arXiv 2101.03961, §2.2):
each expert takes at most C = ⌈N/E × capacity_factor⌉ of a group's N tokens;
a token past it is *dropped* (its expert output is 0, the residual carries
it on).  A router that sends most tokens to few experts drops many; the
auxiliary loss α·E·Σ_i f_i·P_i pushes it towards f_i = 1/E.  The paper
reports the tokens dropped with its balanced routers as "typically < 1%"
(§2.2, capacity factors 1.0-1.25; its Table 1 sweeps 1.0-2.0).

This module measures that on minipar's serial MoE GPT (the oracle that
expert parallelism reproduces, so the numbers hold for ``minipar run ep``):
:func:`routing_table` does one forward per capacity factor on a batch (one
group) and gives, per MoE block, the first choices per expert (``routed``,
before capacity), the assignments kept (``tokens_per_expert``), the dropped
ones, the drop rate and the imbalance max_i routed_i / mean_i routed_i:

    drop rate = dropped assignments / (N · k · MoE blocks)

The study that trains a router once per auxiliary-loss coefficient and tables
these (``minipar bench ep``, notebook 08) is
:func:`minipar.bench.ep.load_study`; its measured figures are in
docs/PERFORMANCE.md ("Expert parallelism").
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from minipar import checks
from minipar.backend import to_host
from minipar.nn import GPT, GPTConfig
from minipar.parallel.expert_parallel.layout import OPS

__all__ = ["CAPACITY_FACTORS", "alltoall_bytes", "routing_table", "rows_bytes"]

#: the capacity factors the issue asks about: 0.5 … 2.0
CAPACITY_FACTORS = (0.5, 0.75, 1.0, 1.25, 1.5, 2.0)


def alltoall_bytes(n_experts: int, d_model: int, caps: list[int], coord: int,
                   itemsize: int) -> dict[str, int]:
    """Exact bytes rank ``coord`` of an ep group (``caps`` = C_j of every rank of the
    group) sends per MoE layer per step, by all-to-all
    (:data:`~minipar.parallel.expert_parallel.layout.OPS`)."""
    ep = len(caps)
    per, d = n_experts // ep, d_model
    mine = (ep - 1) * per * caps[coord] * d * itemsize
    theirs = sum(per * c * d * itemsize for j, c in enumerate(caps) if j != coord)
    return {OPS[0]: (ep - 1) * per * 8, OPS[1]: mine, OPS[2]: theirs, OPS[3]: mine,
            OPS[4]: theirs}


def rows_bytes(sent: list[int], rows_in: list[list[int]], coord: int, d_model: int,
               itemsize: int) -> dict[str, int]:
    """Exact bytes rank ``coord`` sent in one MoE layer's five all-to-alls given the rows it
    sent each expert (``sent`` (E,)) and the rows each source sent each of its experts
    (``rows_in`` (E/ep, ep)): the dropless figure, the tokens that really went (the padded
    one is :func:`alltoall_bytes`, every row = C_j)."""
    ep = len(rows_in[0])
    per = len(sent) // ep
    mine = sum(sent[e] for e in range(len(sent)) if e // per != coord) * d_model * itemsize
    theirs = sum(r[j] for r in rows_in for j in range(ep) if j != coord) * d_model * itemsize
    return {OPS[0]: (ep - 1) * per * 8, OPS[1]: mine, OPS[2]: theirs, OPS[3]: mine,
            OPS[4]: theirs}


def routing_table(cfg: GPTConfig, params: dict[str, Any], tokens: Any,
                  factors: tuple[float, ...] = CAPACITY_FACTORS) -> list[dict[str, Any]]:
    """Per capacity factor, the routing of ``tokens`` (B, T) by the MoE GPT ``cfg``/``params``
    as one group (see the module docstring for the keys)."""
    checks.integer("cfg.n_experts", cfg.n_experts, 1, why="routing_table needs a mixture of experts")
    out = []
    for cf in factors:
        c = replace(cfg, capacity_factor=float(cf))
        _, cache = GPT(c).forward(params, tokens)
        stats = GPT.moe_stats(cache)
        routed = [[int(v) for v in to_host(s["routed"])] for s in stats]
        dropped = sum(int(s["dropped"]) for s in stats)
        assignments = int(tokens.size) * cfg.top_k
        out.append({
            "capacity_factor": float(cf), "capacity": int(stats[0]["capacity"]),
            "assignments": assignments, "routed": routed,
            "tokens_per_expert": [[int(v) for v in to_host(s["tokens_per_expert"])]
                                  for s in stats],
            "dropped": dropped, "drop_rate": dropped / (assignments * len(stats)),
            "imbalance": max(max(r) * len(r) / sum(r) for r in routed),
        })
    return out
