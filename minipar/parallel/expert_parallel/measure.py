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

* :func:`routing_table`: one forward per capacity factor on a batch (one
  group), per MoE block the first choices per expert (``routed``, before
  capacity), the assignments kept (``tokens_per_expert``), the dropped ones,
  the drop rate and the imbalance max_i routed_i / mean_i routed_i;
* :func:`load_study`: that table at initialisation and after training once
  per auxiliary-loss coefficient α (0 = none), on a held-out batch.

    drop rate = dropped assignments / (N · k · MoE blocks)

Measured (``load_study(steps=400, aux_loss_coefs=(0.0, 0.01, 0.1))``, E = 4,
top-1, d 32, a held-out group of 512 tokens; % of assignments dropped):

    router     imbalance   cf 0.5  0.75    1.0   1.25   1.5   2.0   final loss
    init          1.53     52.8   31.6   16.0    5.3   0.4   0.0
    α = 0         1.59     52.4   30.5   12.4    4.3   1.2   0.0     0.150
    α = 0.01      1.19     50.0   25.0    5.2    0.0   0.0   0.0     0.169
    α = 0.1       1.13     50.0   25.0    3.6    0.0   0.0   0.0     0.350

So with the auxiliary loss the drop rate at capacity factor 1.25 is 0 here
(below Switch's "typically < 1%"), 4.3% without it; at 1.0 even a balanced
router drops 4-5% (a group of 512 tokens fluctuates around N/E per expert);
below 1.0 the capacity itself, not the router, drops 1 − cf.  After 150
steps α = 0.01 has not balanced the router yet (imbalance 1.68, 8.6% at 1.25)
while α = 0.1 has (1.16, 0%), at the price of a worse loss.
"""

from __future__ import annotations

from dataclasses import asdict, replace
from typing import Any

from minipar import checks
from minipar.backend import to_host
from minipar.data import synthetic
from minipar.nn import GPT, GPTConfig
from minipar.parallel.expert_parallel.layout import OPS

__all__ = ["CAPACITY_FACTORS", "alltoall_bytes", "format_study", "load_study", "routing_table"]

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


def load_study(experts: int = 4, top_k: int = 1, steps: int = 150,
               aux_loss_coefs: tuple[float, ...] = (0.0, 0.01),
               factors: tuple[float, ...] = CAPACITY_FACTORS,
               train_capacity_factor: float = 1.25, d_model: int = 32, layers: int = 2,
               heads: int = 2, vocab: int = 10, seq: int = 16, batch: int = 32,
               lr: float = 3e-3, seed: int = 0, eval_step: int = 10_000) -> dict[str, Any]:
    """Routing tables before and after training the serial MoE GPT (float64, AdamW) with
    each auxiliary-loss coefficient α in ``aux_loss_coefs``, on the held-out batch of
    step ``eval_step`` of the modular-sum data.

    Returns ``{"config", "before", "after": {α: table}, "losses": {α: [float]},
    "drop_rate_at_1.25": {"before": x, α: x}}`` (the last only if 1.25 is a factor)."""
    from minipar.train import gpt_task, train

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
