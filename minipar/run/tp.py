"""``minipar run tp -n N [--tp T --dp D]``: tensor parallelism (Megatron), on a dp x tp grid.

EN tensor parallelism · RU тензорный параллелизм · ZH 张量并行

Launcher side: ``--tp`` (default: the largest t dividing N that the model cuts; when
none > 1 does, the run is refused with a model that cuts, and ``--tp 1`` asks for plain
data parallelism) and ``--dp`` (default N / tp), and the
checks that name the numbers before MPI starts: dp·tp = N, heads, the MLP width 4·d and
the vocabulary divisible by tp (and, for ``run sp``, the sequence), a row of the batch
for every dp rank.  Rank side: :mod:`minipar.run.worker` builds the engine
(:class:`minipar.parallel.tensor_parallel.engine.TensorParallel`, Shoeybi et al. 2019,
arXiv 1909.08053) on the grid of :func:`grid_sizes`, with a ledger of each block's saved
bytes as its hooks (:func:`engine_options`), and trains ``--steps`` steps; :func:`report`
gives, per rank, the bytes the blocks' f and g sent per step next to the ring formula
on b·s·h elements (2 all-reduces forward + 2 backward per block:
4L × 2(t−1)/t × b·s·h × bytes), the bytes by grid axis (tp, dp) next to their exact
figures (:func:`~minipar.parallel.tensor_parallel.measure.tp_axis_bytes_formula`,
the dp ring all-reduce of Ψ/t), and the activations one
block saved (a ledger of its ``saved`` arrays) next to minipar's formula and the paper's
(:func:`minipar.plan.activations.minipar_activation_formula`), and the share of the tp
axis's communication hidden behind computation in the last step (``hidden_fraction``;
``--tp-overlap``'s layers; ``--trace FILE.json`` draws the intervals).  ``minipar run sp``
(:mod:`minipar.run.sp`) is the same run with sequence parallelism.
"""

from __future__ import annotations

import argparse
from typing import Any

from minipar.cli.options import integer


def add_arguments(parser: argparse.ArgumentParser, sequence_parallel: bool = False) -> None:
    g = parser.add_argument_group("sequence parallelism (over the tensor-parallel ranks)"
                                  if sequence_parallel else "tensor parallelism")
    g.add_argument("--tp", type=integer(1), default=None,
                   help="tensor-parallel size t (default: -n / --dp, or the largest t "
                        "dividing -n that the model's heads, 4·d_model and vocab allow"
                        + (", and --seq" if sequence_parallel else "") + ")")
    g.add_argument("--dp", type=integer(1), default=None,
                   help="data-parallel replicas (default: -n / --tp)")
    g.add_argument("--tp-overlap", action="store_true",
                   help="overlap with the GEMMs: f's backward all-reduce behind the weight "
                        "gradient" + (", the all-gather and reduce-scatter decomposed into "
                                      "ring steps" if sequence_parallel else "")
                        + " (the same bytes and sums; needs --tp > 1)")


def _slices(spec: Any, t: int, sequence_parallel: bool) -> bool:
    """Whether the model cuts t ways: heads, the MLP width 4·d, the vocabulary (SP: seq)."""
    from minipar.plan.tensor import tp_indivisible

    return not tp_indivisible(t, spec.heads, 4 * spec.d_model, spec.vocab,
                              spec.seq if sequence_parallel else None)


def grid_sizes(options: dict[str, Any], spec: Any = None,
               sequence_parallel: bool = False) -> dict[str, int]:
    """``{"dp": dp, "tp": tp}`` from ``-n``, ``--tp`` and ``--dp``; ValueError naming the numbers.

    Neither given: the largest t dividing N that the model cuts (``spec``: heads, 4·d,
    vocab, SP's seq) and that leaves every replica a row of the batch, dp = N / t
    (``-n 4`` with the default 2 heads: dp 2 x tp 2)."""
    from minipar import checks

    n, tp, dp = options["ranks"], options.get("tp"), options.get("dp")
    if tp is None and dp is None:
        fits = [t for t in range(n, 0, -1) if n % t == 0 and (spec is None or (
            _slices(spec, t, sequence_parallel) and spec.batch >= n // t))]
        tp = fits[0] if fits else n
        dp = n // tp
    elif tp is None:
        checks.divides("--dp", dp, "-n", n, "the grid is dp x tp = N ranks")
        tp = n // dp
    elif dp is None:
        checks.divides("--tp", tp, "-n", n, "the grid is dp x tp = N ranks")
        dp = n // tp
    if dp * tp != n:
        raise ValueError(f"--dp {dp} x --tp {tp} = {dp * tp} is not the number of ranks -n {n}")
    return {"dp": dp, "tp": tp}


def check_sizes(options: dict[str, Any], spec: Any, sequence_parallel: bool) -> None:
    """Launcher side: the grid, the slicing, the batch (one line, naming the options)."""
    from minipar import checks
    from minipar.parallel.common import check_world

    sizes = grid_sizes(options, spec, sequence_parallel)
    dp, t, d = sizes["dp"], sizes["tp"], spec.d_model
    n = options["ranks"]
    if t == 1 and n > 1 and options.get("tp") is None and options.get("dp") is None:
        need = "heads, 4·d_model, vocab" + (" and seq" if sequence_parallel else "")
        raise ValueError(
            f"-n {n}: no tensor-parallel size t > 1 dividing {n} cuts this model ({need} must "
            f"divide by t, a batch row per replica), so nothing would be sliced; give a model "
            f"that cuts, e.g. --tp {n} --heads {n} --d-model {8 * n} --vocab {2 * n}"
            + (f" --seq {4 * n}" if sequence_parallel else "")
            + ", or --tp 1 for plain data parallelism")
    size = "the tensor-parallel size t ="
    checks.divides(size, t, "--heads", spec.heads, f"each rank takes heads/t whole heads "
                   f"(e.g. --heads {t} with --d-model a multiple of {t})")
    checks.divides(size, t, f"the MLP width d_ff = 4 x --d-model {d} =", 4 * d,
                   "each rank takes d_ff/t columns")
    checks.divides(size, t, "--vocab", spec.vocab,
                   "each rank takes vocab/t embedding rows and logits")
    if sequence_parallel:
        checks.divides("the sequence-parallel size t =", t, "--seq", spec.seq,
                       "each rank keeps seq/t positions")
        if spec.experts:
            raise ValueError("--experts: sequence parallelism with a mixture of experts is not "
                             "built; use minipar run tp")
    check_fp8_experts(spec, t)
    check_world(spec.batch, dp)


def check_fp8_experts(spec: Any, t: int) -> None:
    """FP8 block scaling with experts sliced over t tensor-parallel ranks: the experts'
    GEMMs all-reduce no shared block's amax, so no tile or block may straddle two slices
    (the blocks' own linear layers do: :func:`~minipar.parallel.tensor_parallel.model.
    fp8_splits`)."""
    if t > 1 and spec.experts and spec.precision == "fp8" and spec.fp8_scaling == "block":
        w = spec.config().expert_width // t
        if w % spec.fp8_block:
            ok = max(b for b in range(1, min(w, 128) + 1) if w % b == 0)
            raise ValueError(f"--precision fp8 with --experts over tp {t}: --fp8-block "
                             f"{spec.fp8_block} must divide each rank's slice of an expert, "
                             f"expert width / t = {w} (the experts' GEMMs share no block's "
                             f"amax across ranks here); use --fp8-block {ok}")


def check(options: dict[str, Any], spec: Any) -> None:
    check_sizes(options, spec, False)
    check_overlap(options, spec, False)


def check_overlap(options: dict[str, Any], spec: Any, sequence_parallel: bool) -> None:
    """``--tp-overlap`` needs tensor-parallel ranks to overlap (t > 1)."""
    if options.get("tp_overlap"):
        t = grid_sizes(options, spec, sequence_parallel)["tp"]
        if t == 1:
            raise ValueError(f"--tp-overlap needs tensor parallelism, and this run has tp "
                             f"{t}: give --tp 2 or more (-n {options['ranks']})")


def engine_options(options: dict[str, Any], spec: Any) -> dict[str, Any]:
    """The engine's keywords: a ledger of each block's saved bytes (:func:`report` reads it),
    ``overlap`` from ``--tp-overlap``, the last step's timeline (:func:`overlap_row`)."""
    from minipar.parallel.tensor_parallel.measure import BlockLedger

    return {"hooks": BlockLedger(), "overlap": bool(options.get("tp_overlap")),
            "timeline": True}


def overlap_row(engine: Any, rank: int) -> dict[str, Any]:
    """This rank's last step on the tp axis: its compute and communication intervals (the
    timeline of :func:`minipar.trace.ddp_events`), the share of communication hidden
    (:func:`minipar.overlap.hidden_fraction`: 0 for the blocking layers, by construction),
    the communication's seconds."""
    from minipar.overlap import hidden_fraction, total

    tl = engine.records or {"compute": [], "comm": []}
    spans = [c[1:] for c in tl["comm"]]
    return {"timeline": {"rank": rank, **tl},
            "hidden_fraction": hidden_fraction([c[1:] for c in tl["compute"]], spans),
            "comm_seconds": total(spans)}


def report(engine: Any, grid: Any, options: dict[str, Any], spec: Any,
           history: Any) -> dict[str, Any] | None:
    """Rank side, after training: rank 0 returns every rank's figures (bytes by op and
    axis against the exact formulas, the ledger of a block's activations) and the notes."""
    return report_grid(engine, grid, options, spec, False, len(history.losses))


def report_grid(run: Any, grid: Any, options: dict[str, Any], spec: Any,
                sp: bool, steps: int) -> dict[str, Any] | None:
    """:func:`report` of ``run tp`` (``sp`` False) and ``run sp`` (True)."""
    from minipar.parallel.tensor_parallel.measure import (
        BLOCK_OPS,
        block_bytes_formula,
        bytes_by_op,
        tp_axis_bytes_formula,
    )
    from minipar.plan.activations import activation_bytes_per_layer, minipar_activation_formula

    dp, t = grid.size("dp"), grid.size("tp")
    book = run.hooks
    steps = max(1, steps)  # the steps this run took (a resumed one: fewer than --steps)
    by_op = bytes_by_op(grid.world.stats, steps)
    axes = {a: b / steps for a, b in grid.bytes_by_axis().items() if b}
    blocks = sum(by_op.get(op, 0) for op in BLOCK_OPS)
    dense = [b for i, b in enumerate(book.blocks) if not run.cfg.is_moe_block(i)]
    sizes = (run.cfg, run.rows(), spec.seq, t, run.tp.rank, run.states.params.itemsize)
    mine = (blocks, block_bytes_formula(*sizes), axes, by_op, run.rows(),
            dense[0] if dense else None, None if sp else tp_axis_bytes_formula(*sizes),
            overlap_row(run, grid.rank))
    rows = grid.world.comm.gather(mine, root=0)  # reporting only: MPI's pickled gather
    if grid.rank != 0:
        return None
    e, L, h, s = run.states.params.itemsize, run.cfg.n_layer, run.cfg.d_model, spec.seq
    b = rows[0][4]
    S = b * s * h * e
    mode = "tp+sp" if sp else "tp"
    act_formula = minipar_activation_formula(s, b, h, spec.heads, t, mode, e)
    name = "sequence" if sp else "tensor"
    split = sorted({r[4] for r in rows[::t]}, reverse=True)
    rows_text = (f"b = {b} rows per replica" if len(split) == 1 else
                 f"b = {b} rows on rank 0's replica (--batch {spec.batch} split "
                 + ", ".join(str(r[4]) for r in rows[::t]) + ")")
    notes = [(f"grid dp {dp} x tp {t}; {name} parallelism over tp; {rows_text}, "
              f"s = {s}, h = {h}, {L} blocks, {e}-byte elements"),
             "bytes per step by grid axis (rank 0): "
             + (", ".join(f"{a} {v:,.0f}" for a, v in rows[0][2].items())
                + f" (all axes {sum(rows[0][2].values()):,.0f})" if rows[0][2] else "none sent"),
             "bytes per step by operation (rank 0): "
             + (", ".join(f"{op} {v:,.0f}" for op, v in sorted(rows[0][3].items()))
                or "none sent")]
    if rows[0][6] is not None and t > 1:
        notes.append(f"tp axis (rank 0): {rows[0][2].get('tp', 0):,.0f} bytes per step; exact "
                     f"{rows[0][6]:,}: the blocks' f and g, the embedding's g and the head's f "
                     f"(a ring all-reduce of b·s·h each), the loss's all-reduces of b·s and "
                     f"2·b·s numbers" + (", and fp8_amax" if "fp8_amax" in rows[0][3] else ""))
    if "fp8_amax" in rows[0][3]:
        notes.append("fp8_amax: the all-reduces (MAX, FP32) of the amax of every FP8 tile or "
                     "block (per tensor: every tensor) that the tp slices share"
                     + (", and per tensor of every activation and gradient over the dp ranks"
                        if dp > 1 and spec.fp8_scaling == "tensor" else "")
                     + ", so each rank scales its part as the serial run scales the whole")
    if dp > 1:
        from minipar.collectives.cost import allreduce_bytes_sent
        from minipar.nn import GPT

        mine_p, psi = run.states.grads.size, GPT(run.cfg).n_params()
        shared = (t * mine_p - psi) // (t - 1) if t > 1 else 0  # replicated on every tp rank
        notes.append(f"dp axis (rank 0): gradient all-reduce "
                     f"{rows[0][3].get('dp_grad_allreduce', 0):,.0f} bytes per step; ring "
                     f"formula 2(d-1)/d x P_r x {e} B = "
                     f"{allreduce_bytes_sent(mine_p, e, dp, 0, 'ring'):,}, over the rank's "
                     f"P_r = {mine_p:,} parameters"
                     + (f": its 1/t slices {mine_p - shared:,} + {shared:,} replicated on "
                        f"every tp rank (LayerNorms, position embedding, row-parallel biases); "
                        f"the model's Ψ = {psi:,}, Ψ/t = {psi / t:,.0f}" if t > 1 else
                        " = the model's Ψ"))
    if sp:
        notes.append("SP's all-gathers and reduce-scatters send TP's bytes; sp_regather (the "
                     "saved shard gathered again in backward) and sp_param_grads are extra")
    if rows[0][5] is not None:
        notes.append("activations one block saved, per rank (ledger): "
                     + ", ".join(f"{r[5]:,}" for r in rows)
                     + f"; minipar's formula ({mode}, t = {t}, {e}-byte) {act_formula:,.0f}; "
                     f"in 16-bit minipar's "
                     f"{minipar_activation_formula(s, b, h, spec.heads, t, mode):,.0f} vs the "
                     f"paper's (with dropout) "
                     f"{activation_bytes_per_layer(s, b, h, spec.heads, t, mode):,.0f}")
    over = [r[7] for r in rows]
    shares = [o["hidden_fraction"] for o in over if o["hidden_fraction"] is not None]
    hidden = sum(shares) / len(shares) if shares else None
    if t > 1:
        notes.append(("tp-overlap" if run.overlap else "blocking") + ": communication hidden "
                     "behind computation on the tp axis (last step, mean of the ranks) "
                     + ("none sent" if hidden is None else f"{hidden:.0%}")
                     + "; per rank " + ", ".join("-" if o["hidden_fraction"] is None else
                                                 f"{o['hidden_fraction']:.0%}" for o in over)
                     + ", of " + ", ".join(f"{o['comm_seconds'] * 1e3:.1f}" for o in over)
                     + " ms in messages" + (
                         " (the overlapped layers' messages; the embedding's, head's and "
                         "loss's all-reduces still block)" if run.overlap else
                         " (blocking: the rank waits for each)"))
    if spec.experts:
        notes.append("MoE blocks: the MLP's f and g carry the expert buffers (E x C x h), not "
                     "b·s·h: the exact figure counts them, the paper's counts dense blocks only")
    return {"ranks": dp * t, "data_parallel_ranks": dp, "tp": t, "dp": dp,
            "sequence_parallel": sp, "tp_overlap": run.overlap,
            "bytes_sent_per_rank": [r[0] for r in rows],
            "bytes_sent_text": "the blocks' f and g only; every axis: the lines below",
            "bytes_exact_per_rank": [r[1] for r in rows],
            "bytes_exact_text": ("the blocks' f and g: 4 ring all-reduces per block of b·s·h"
                                 + (", a MoE MLP's of E·C·h" if spec.experts else "")
                                 + " elements"),
            "bytes_formula": 4 * L * 2 * (t - 1) / t * S,
            "bytes_formula_text": f"4L x 2(t-1)/t x b·s·h x {e} B (L = {L}, t = {t})",
            "bytes_by_axis_per_rank": [r[2] for r in rows],
            "bytes_by_op_per_rank": [r[3] for r in rows],
            "tp_axis_bytes_exact_per_rank": [r[6] for r in rows],
            "activation_bytes_per_rank": [r[5] for r in rows],
            "activation_formula": act_formula, "activation_mode": mode,
            "hidden_fraction": hidden,
            "hidden_fraction_per_rank": [o["hidden_fraction"] for o in over],
            "comm_seconds_per_rank": [o["comm_seconds"] for o in over],
            "timeline": [o["timeline"] for o in over],
            "notes": notes}


def trace_events(summary: dict[str, Any]) -> list[dict[str, Any]]:
    """``--trace FILE.json``: every rank's last-step timeline on the tp axis (its compute,
    the step minus its waits; f, g and SP's messages, posted to seen done) as Chrome trace
    events."""
    from minipar.trace import ddp_events

    if not any(tl["comm"] for tl in summary.get("timeline", [])):
        return []
    name = "TP+SP" if summary.get("sequence_parallel") else "TP"
    return ddp_events(summary["timeline"], name=name + (" overlap" if summary.get("tp_overlap")
                                                        else ""),
                      comm_lane="f / g messages", comm_label="{}")
