"""``minipar run ep``: expert parallelism, its options and its measurements.

EN expert parallelism · RU параллелизм экспертов · ZH 专家并行

    minipar run ep -n 4 --experts 4 --top-k 2 --capacity-factor 1.0 [--ep 2] [--json]
    minipar run ep          # the defaults: 4 ranks, E = 4 experts per block, top-1
    minipar run ep -n 4 --experts 8 --top-k 2 --router sigmoid --load-balance loss-free \
        --capacity-factor none --shared-experts 1 --expert-groups 4 --groups-per-token 2

Launcher side: ``--ep`` (ranks per expert-parallel group, default ``-n``)
and :func:`minipar.parallel.expert_parallel.options.check_ep` (a mixture of experts,
E divisible by ep, top-k at most E, capacity factor > 0 or none, ep
dividing the ranks, expert groups on whole ranks), before MPI starts.  Rank side
(:mod:`minipar.run.worker`):
the grid dp = -n x ep (:func:`grid_sizes`), the engine
:class:`minipar.parallel.expert_parallel.engine.ExpertParallel` trained ``--steps``
steps by the one loop (GShard, arXiv 2006.16668: tokens to their experts' ranks by
all-to-all and back; dense gradients all-reduced over all ranks, experts'
over their replicas), and :func:`report` adds, besides the verdict against
the serial run: the capacity C of each rank's group, ``tokens_per_expert``
(per MoE block, the last step, all ranks), ``dropped`` per step, and the
bytes each rank sent per step on each grid axis (ep: the all-to-alls, edp:
expert gradients, dp: dense gradients), counted, next to the exact formula
and to ``minipar.plan.moe``'s padded all-to-all figure, and the model-state
bytes each rank holds (the dense parameters and its E/ep experts), measured,
next to the formula and to a full replica's; and the balance (:func:`balance_report`, also
in ``run pp`` and ``run hybrid``): MaxVio per step and MoE layer, the loads of the last
step, the largest load, the loss-free bias, and dropless, each rank's largest buffer.
"""

from __future__ import annotations

import argparse
from typing import Any

from minipar.backend import to_host
from minipar.cli.options import integer

AXES = ("ep", "edp", "dp")

#: Expert parallelism needs a mixture of experts: ``minipar run ep`` alone runs one of
#: E = 4 experts per block (top-1, Switch's routing), one expert per rank at -n 4;
#: ``--experts`` and ``--top-k`` choose another.
MODEL_DEFAULTS = {"experts": 4}


def add_arguments(parser: argparse.ArgumentParser) -> None:
    g = parser.add_argument_group(
        "expert parallelism", f"the model is a mixture of experts by default here: --experts "
        f"{MODEL_DEFAULTS['experts']}, top-1 (not the dense model the model options name)")
    g.add_argument("--ep", type=integer(1), default=None,
                   help="ranks per expert-parallel group: each holds E/ep experts; must divide "
                        "-n and --experts (default: -n, every rank one share of the experts)")


def check(options: dict[str, Any], spec: Any) -> None:
    """Launcher side: a row of the batch per rank, and :func:`check_ep`."""
    from minipar.parallel.common import check_world
    from minipar.parallel.expert_parallel.options import check_ep

    n = options["ranks"]
    check_world(spec.batch, n)
    ep = options.get("ep") or n
    try:
        check_ep(spec.experts, spec.top_k, spec.capacity_factor, ep, n, spec.expert_groups)
    except ValueError as e:  # name where ep came from when the learner did not give it
        if options.get("ep"):
            raise
        raise ValueError(str(e).replace(f"--ep {n}", f"--ep {n} (default: -n)")) from None


def grid_sizes(options: dict[str, Any], spec: Any) -> dict[str, int]:
    """The grid: every rank data-parallel, cut into ep groups of ``--ep`` (default -n) ranks."""
    n = options["ranks"]
    return {"dp": n, "ep": options.get("ep") or n}


def engine_options(options: dict[str, Any], spec: Any) -> dict[str, Any]:
    """None: the layout is the grid's."""
    return {}


def balance_of(bias: Any) -> dict[str, Any]:
    """What a rank knows of the balance (its blocks' global loads per step, its biases):
    gather these and give the list to :func:`balance_report`."""
    return {"loads": bias.loads,
            "bias": {k: [float(x) for x in to_host(v)] for k, v in bias.arrays.items()}}


def balance_report(parts: list[dict[str, Any]], spec: Any) -> dict[str, Any]:
    """The measured balance of a run from every rank's :func:`balance_of` (global over the
    step's ranks already; a pipeline's stages hold different blocks): MaxVio per step per MoE
    layer (max load / mean load − 1, DeepSeek-V3's measure), the loads (top-k assignments
    per expert) of the last step, the largest load, the final bias (loss-free)."""
    from minipar.parallel.expert_bias import max_violation

    steps = max(len(p["loads"]) for p in parts)
    merged = [{k: v for p in parts if t < len(p["loads"]) for k, v in p["loads"][t].items()}
              for t in range(steps)]
    order = sorted(merged[0], key=lambda k: int(k.split(".")[1])) if merged else []
    vio = [[round(max_violation(step[k]), 6) for k in order] for step in merged]
    loads = [merged[-1][k] for k in order] if merged else []
    largest = max((max(v) for step in merged for v in step.values()), default=0)
    out: dict[str, Any] = {"load_balance": spec.load_balance, "router": spec.router,
                           "moe_blocks": [int(k.split(".")[1]) for k in order],
                           "max_vio_per_step": vio, "loads_last_step": loads,
                           "largest_expert_load": largest}
    bias = {k: v for p in parts for k, v in p["bias"].items()}
    if bias:
        out["expert_bias"] = dict(sorted(bias.items(), key=lambda kv: int(kv[0].split(".")[1])))
    mean = [sum(s) / len(s) for s in vio if s]
    out["notes"] = [f"balance ({spec.load_balance}, {spec.router} router): MaxVio per step, "
                    f"mean over the MoE layers: " + ", ".join(f"{v:.3f}" for v in mean),
                    f"  loads (top-k assignments per expert, all ranks) of the last step: "
                    f"{loads}; the largest load of any expert in any step: {largest}"]
    return out


def report(engine: Any, grid: Any, options: dict[str, Any], spec: Any,
           history: Any) -> dict[str, Any] | None:
    """Rank side, after training: rank 0 returns every rank's figures (collective)."""
    from minipar.nn import GPT
    from minipar.parallel.data_parallel.measure import replica_model_state_bytes
    from minipar.plan.moe import moe_alltoall_bytes_per_rank

    n, ep = grid.world.size, grid.size("ep")
    lo, hi = engine.rows
    dropless = spec.capacity_factor is None
    plan = None if dropless else spec.layers * moe_alltoall_bytes_per_rank(
        (hi - lo) * spec.seq, spec.d_model, ep, spec.top_k, spec.experts,
        spec.capacity_factor, bytes_per_elem=engine.itemsize, backward=True)
    mine = {"counted": engine.bytes_by_axis(), "formula": engine.bytes_formula(),
            "a2a_data": engine.alltoall_data_bytes(), "plan": plan, "experts": engine.experts,
            "capacity": engine.caps[grid.coord("ep")], "tokens": (hi - lo) * spec.seq,
            "state": sum(engine.memory().values()), "psi": engine.layout.size,
            "stats": engine.stats}
    rows = grid.world.comm.gather(mine)  # a report, not training traffic: not counted
    if grid.rank != 0:
        return None
    full = GPT(spec.config()).n_params()
    blocks = len(rows[0]["stats"][-1])
    last = [[sum(r["stats"][-1][b]["tokens_per_expert"][e] for r in rows)
             for e in range(spec.experts)] for b in range(blocks)]
    routed = [[sum(r["stats"][-1][b]["routed"][e] for r in rows)
               for e in range(spec.experts)] for b in range(blocks)]
    dropped = [sum(s["dropped"] for r in rows for s in r["stats"][t]) for t in range(len(rows[0]["stats"]))]
    assignments = spec.batch * spec.seq * spec.top_k * blocks
    balance = balance_report([balance_of(engine.bias)], spec)
    cf = "none (dropless)" if dropless else f"{spec.capacity_factor:g}"
    buffers = [[max(s["capacity"] for s in step) for step in r["stats"]] for r in rows]
    notes = [f"E = {spec.experts} experts per MoE block, top-{spec.top_k}, capacity factor "
             f"{cf}; ep {ep} x edp {n // ep}: rank r holds experts "
             + ", ".join(f"{r}: {rows[r]['experts']}" for r in range(n)),
             (f"dropless: each rank's buffer is as long as its most loaded expert, the "
              f"all-to-alls carry only the tokens (counts first); the largest buffer per "
              f"rank over the steps: {[max(b) for b in buffers]}" if dropless else
              f"capacity C = ceil(k·n_r/E x {cf}) of each rank's group, its "
              f"own n_r = rows x {spec.seq} tokens {[r['tokens'] for r in rows]}: "
              f"{[r['capacity'] for r in rows]}"),
             f"dropped per step (all ranks and blocks, of {assignments} assignments): {dropped}",
             *balance["notes"]]
    for b in range(blocks):
        notes.append(f"block {b}, last step: first choices per expert {routed[b]}, "
                     f"tokens kept per expert {last[b]}")
    notes.append("bytes per rank per step by axis, counted (= exact formula):")
    for r, row in enumerate(rows):
        cells = [f"{a} {row['counted'][a]:,.0f} ({row['formula'][a]:,.0f})" for a in AXES]
        notes.append(f"  rank {r}: " + ", ".join(cells))
    def per_rank(key: str) -> str:
        return ", ".join(f"{r[key]:,.0f}" for r in rows)

    caps = [r["capacity"] for r in rows]
    notes.append(f"  all-to-all data per rank per step (without the counts): "
                 f"{per_rank('a2a_data')}: " + (
                     "the tokens that really went, mean over the steps (dropless: each expert "
                     "gets its count's rows, no padding; 4 all-to-alls per MoE layer)"
                     if dropless else
                     f"exact for the capacities that ran, per MoE layer "
                     f"and direction rank r sends (ep-1)·(E/ep)·C_r·d·b to dispatch its tokens "
                     f"and (E/ep)·Σ_(j≠r) C_j·d·b to combine the others' (C_r = {caps})"))
    if not dropless:
        notes.append(
            f"  minipar.plan.moe's padded-buffer figure, 4(ep-1)/ep x E·C·d·b per MoE layer "
            f"x {blocks} MoE layers with each rank's own C: {per_rank('plan')}; it assumes "
            f"every rank of the ep group has the same C" + (
                f", which holds only when the rows split evenly (here "
                f"{[(r['tokens'] // spec.seq) for r in rows]} rows per rank)"
                if any(r["a2a_data"] != r["plan"] for r in rows)
                else ", as here: it equals the exact figure"))
    return {"ranks": n, "data_parallel_ranks": n, "ep": ep, "edp": n // ep,
            "experts": spec.experts, "top_k": spec.top_k,
            "capacity_factor": spec.capacity_factor,
            "capacity_per_rank": [r["capacity"] for r in rows],
            "largest_buffer_per_rank": [max(b) for b in buffers],
            **{k: v for k, v in balance.items() if k != "notes"},
            "tokens_per_expert": last, "routed": routed, "dropped": dropped,
            "assignments_per_step": assignments,
            "bytes_by_axis_per_rank": [r["counted"] for r in rows],
            "bytes_formula_by_axis_per_rank": [r["formula"] for r in rows],
            "bytes_sent_per_rank": [sum(r["counted"][a] for a in AXES) for r in rows],
            "bytes_exact_per_rank": [sum(r["formula"][a] for a in AXES) for r in rows],
            "bytes_exact_text": "all-to-alls on ep + expert grads on edp + dense grads on dp",
            "alltoall_data_bytes_per_rank": [r["a2a_data"] for r in rows],
            "alltoall_plan_bytes_per_rank": [r["plan"] for r in rows],
            "model_state_bytes_per_rank": [r["state"] for r in rows],
            "model_state_formula": replica_model_state_bytes(rows[0]["psi"], spec.precision,
                                                             spec.optimizer),
            "model_state_formula_text": (
                f"params + grads + optimizer states ({spec.precision}) of the dense "
                f"parameters and E/ep = {spec.experts // ep} experts per block, "
                f"{rows[0]['psi']:,} of the model's {full:,} (a full replica: "
                f"{replica_model_state_bytes(full, spec.precision, spec.optimizer):,} B)"),
            "notes": notes}
