"""``minipar run cp --kind ulysses|ring|allgather``: context parallelism, its options and
its measurements.

EN context parallelism · RU контекстный параллелизм · ZH 上下文并行

Launcher side: ``--kind`` (``ulysses``: DeepSpeed-Ulysses, Jacobs et al.
2023, arXiv 2309.14509; ``ring``: ring attention, Liu et al. 2023, arXiv
2310.01889; ``allgather``: Llama 3's all-gather of K and V, arXiv 2407.21783) and ``--zigzag/--no-zigzag`` (the ring's causal load balance, on
by default), checked before MPI starts by
:func:`minipar.parallel.context_parallel.options.check`: the sequence must divide by cp
(2·cp with zigzag), the heads by cp for Ulysses.  Every rank is one rank of
the grid's ``cp`` axis and holds the whole batch's rows, its part of the
sequence.  Rank side (:mod:`minipar.run.worker`): the engine
(:class:`~minipar.parallel.context_parallel.engine.ContextParallel`, ``kind`` and
``zigzag`` from :func:`engine_options`) on a grid of cp ranks (:func:`grid_sizes`)
trains in the one loop; :func:`report`
(:func:`minipar.parallel.context_parallel.measure.figures`) gives per rank the
bytes sent per step by operation and by axis next to the exact formula, one layer's attention
bytes next to the paper's figure, and the attention activation bytes per
layer — a ledger of what the core saved, and tracemalloc's count of what one
core forward keeps alive
(:func:`minipar.parallel.context_parallel.measure.attention_activation_tracemalloc`)
— next to the formula (the serial layer's / P for Ulysses; q, k, v, o and lse
of s/P positions for the ring) and the serial layer's.
"""

from __future__ import annotations

import argparse
from typing import Any

#: minipar.parallel.context_parallel.options.KINDS (a test checks they agree)
KINDS = ("ulysses", "ring", "allgather", "usp")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    g = parser.add_argument_group("context parallelism")
    g.add_argument("--kind", choices=KINDS, default="ring",
                   help="ring (ring attention, default), ulysses (DeepSpeed-Ulysses), "
                   "allgather (Llama 3: K, V all-gathered per layer) or usp (Ulysses inside "
                   "groups of --ulysses ranks, ring attention across --ring groups)")
    add_usp_arguments(g)
    g.add_argument("--zigzag", action=argparse.BooleanOptionalAction, default=None,
                   help="ring, allgather: rank r holds chunks r and 2cp-1-r to balance "
                        "causal work (default on for them; Ulysses has no chunks to zigzag and "
                        "refuses --zigzag)")


def add_usp_arguments(g: Any) -> None:
    """``--ulysses U`` and ``--ring R``: USP's 2-D context grid, U·R = cp (shared with
    ``minipar run hybrid``)."""
    g.add_argument("--ulysses", type=int, default=None, metavar="U",
                   help="usp: Ulysses ranks per group (default: cp / --ring)")
    g.add_argument("--ring", type=int, default=None, metavar="R",
                   help="usp: ring groups, U·R = cp (default: cp / --ulysses)")


def zigzag(options: dict[str, Any]) -> bool:
    """``--zigzag`` as given, else on for the ring and off for Ulysses."""
    z = options.get("zigzag")
    return options.get("kind", "ring") != "ulysses" if z is None else bool(z)


def check(options: dict[str, Any], spec: Any) -> None:
    """Launcher side: sequence (and heads, for Ulysses) divisible by the cp ranks."""
    from minipar.parallel.context_parallel.options import check as cp_check

    cp_check(spec.seq, spec.heads, options["ranks"], options.get("kind", "ring"),
             zigzag(options), spec.experts, spec.kv_heads, options.get("ulysses"),
             options.get("ring"))


def grid_sizes(options: dict[str, Any], spec: Any) -> dict[str, int]:
    """Every rank is one rank of the cp axis."""
    return {"cp": options["ranks"]}


def engine_options(options: dict[str, Any], spec: Any) -> dict[str, Any]:
    """The engine's ``kind`` and ``zigzag`` (and USP's ``ulysses``, ``ring``)."""
    out = {"kind": options.get("kind", "ring"), "zigzag": zigzag(options)}
    if out["kind"] == "usp":
        out.update(ulysses=options.get("ulysses"), ring=options.get("ring"))
    return out


def report(engine: Any, grid: Any, options: dict[str, Any], spec: Any,
           history: Any) -> dict[str, Any] | None:
    """Rank side, after training: every rank's figures
    (:func:`minipar.parallel.context_parallel.measure.figures`), returned by rank 0."""
    from minipar.parallel.context_parallel.measure import figures

    kind = engine.kind
    m = figures(engine, len(history.losses))
    comm = grid.world
    rows = comm.comm.gather(m)
    if comm.rank != 0:
        return None
    n = comm.size
    per = [sum(r["bytes_by_op"].values()) for r in rows]
    exact = [sum(r["bytes_by_op_formula"].values()) for r in rows]
    att_f = rows[0]["attention_bytes_per_layer_formula"]
    paper = rows[0]["attention_paper_bytes_per_layer"]
    chunks = ("zigzag" if m["zigzag"] else "contiguous") + " chunks"
    U = getattr(engine.layout, "U", 1)
    name = {"ulysses": "DeepSpeed-Ulysses", "allgather": "all-gather of K and V (Llama 3), "
            + chunks, "usp": f"USP, Ulysses over {U} x ring attention over {n // U} groups, "
            + chunks}.get(kind, "ring attention, " + chunks)
    fwd = ", ".join(f"{r['attention_forward_bytes_per_layer']:,}" for r in rows)
    act = ", ".join(f"{r['activation_per_layer'][0]:,}" for r in rows)
    tm = [r["activation_tracemalloc"] for r in rows]
    tm_text = ", ".join(f"{m['tracemalloc']:,} ({m['tracemalloc'] - m['ledger']:+,})" for m in tm)
    peak_text = ", ".join(f"{m['peak']:,}" for m in tm)
    act_formula = {
        "ulysses": "(b·s·(d + 2K·d_h) + b·H·s²)·i/P",
        "allgather": ("(b·s·(d + 2K·d_h) [q, k, v] + b·s·d [o])·i/P + b·s·2K·d_h·i "
                      "[the whole K, V] + b·H·s·i_c/P [lse]")}.get(
        kind, "(b·s·(d + 2K·d_h) [q, k, v] + b·s·d [o] + b·H·s [lse])·i/P, no s² term"
        + (" (K = max(K, U))" if kind == "usp" else ""))
    work = ", ".join(f"{r['score_elements']:,}" for r in rows)
    H, sq = spec.heads, spec.seq
    causal = H * sq * (sq + 1) // 2  # the serial layer's causal scores q·k, key j <= query i
    if kind == "ulysses":  # H/P whole heads each, every score computed, then masked
        work_text = (f"H·s²/P: H/P heads each over the whole sequence, the masked scores "
                     f"included; the serial layer's H·s² = {H * sq * sq:,} (causal: {causal:,})")
    else:  # chunk pairs below the diagonal, the diagonal ones whole (masked inside)
        groups = n // U  # the ring's ranks (USP: its groups)
        c = sq // (2 * groups if m["zigzag"] else groups)
        work_text = (f"together {sum(r['score_elements'] for r in rows):,} = H·s(s+c)/2 with "
                     f"chunks of c = {c} (a diagonal chunk pair is computed whole, masked "
                     f"inside); the serial layer's causal count H·s(s+1)/2 = {causal:,} "
                     f"(H·s² = {H * sq * sq:,} with the masked scores)")
    paper_text = {"ulysses": "4Nh/P per link (N = b·s)",
                  "usp": "4Nh/U per link on a group (N = b·s/R) + the ring's 2(R-1)·b·s·h/(R·U)",
                  "allgather": "(P-1)/P·2·b·s·h per rank (multi-head attention)"}.get(
        kind, "2(P-1)·b·s·h/P per rank")
    paper_line = f"the paper's {paper_text} = {paper:,.0f}"
    if kind == "ulysses":  # a rank keeps its own 1/P of what it all-to-alls
        paper_line += (f", x (P-1)/P = {paper * (n - 1) / n:,.0f} per rank (each rank keeps "
                       f"its own 1/P share)")
    axes = sorted({a for r in rows for a in r["bytes_by_axis"]})
    axis_text = "; ".join(f"{a} " + ", ".join(f"{r['bytes_by_axis'].get(a, 0):,}" for r in rows)
                          for a in axes) or "none sent"
    return {
        "ranks": n, "data_parallel_ranks": 1,
        "kind": kind, "zigzag": m["zigzag"], "cp": n,
        **({"ulysses": U, "ring": n // U} if kind == "usp" else {}),
        "bytes_sent_per_rank": per, "bytes_exact_per_rank": exact,
        "bytes_exact_text": "attention exchange + ring all-reduce of the gradients and the loss"
        + (" + per-tensor fp8's amax all-reduces" if "fp8_amax" in rows[0]["bytes_by_op_formula"]
           else ""),
        "bytes_by_op_per_rank": [r["bytes_by_op"] for r in rows],
        "bytes_by_axis_per_rank": [r["bytes_by_axis"] for r in rows],
        "attention_forward_bytes_per_layer_per_rank": [r["attention_forward_bytes_per_layer"]
                                                       for r in rows],
        "attention_bytes_per_layer_formula": att_f,
        "attention_paper_bytes_per_layer": paper,
        "activation_bytes_per_rank": [r["activation_per_layer"][0] for r in rows],
        "activation_formula": rows[0]["activation_formula"],
        "activation_tracemalloc_bytes_per_rank": [m["tracemalloc"] for m in tm],
        "activation_peak_bytes_per_rank": [m["peak"] for m in tm],
        "serial_activation_bytes": rows[0]["serial_activation_formula"],
        "score_elements_per_rank": [r["score_elements"] for r in rows],
        "positions_per_rank": [r["positions"] for r in rows],
        "notes": [
            (f"context parallelism over {n} rank{'s' if n != 1 else ''}: {name}; seq "
             f"{spec.seq}, batch "
             f"{spec.batch}, d_model {spec.d_model}, heads {spec.heads}, key/value heads "
             f"{spec.kv_heads or spec.heads}, layers {spec.layers}"),
            (f"attention bytes sent per rank, one layer forward (counted): {fwd}; exact "
             f"{att_f['forward']:,} (backward {att_f['backward']:,}); {paper_line}"),
            (f"attention activation bytes per rank per layer (ledger of the saved arrays): "
             f"{act}; formula {act_formula} = {rows[0]['activation_formula']:,}; the serial "
             f"layer's {rows[0]['serial_activation_formula']:,}, / P = "
             f"{rows[0]['serial_activation_formula'] / n:,.0f}"),
            (f"the same measured by tracemalloc (held after one attention forward, output "
             f"dropped; vs the ledger: the Python objects around the arrays): {tm_text}; "
             f"the forward's peak {peak_text}"),
            (f"attention scores computed per rank per batch row, all heads (causal work): "
             f"{work}; {work_text}"),
            "bytes sent per rank per step by grid axis: " + axis_text,
        ],
    }
