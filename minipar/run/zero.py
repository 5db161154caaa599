"""``minipar run zero --stage K``: ZeRO, its options and its measurements.

EN ZeRO, Zero Redundancy Optimizer · RU оптимизатор без избыточности · ZH 零冗余优化器

Launcher side: ``--stage`` (0-3), ``--allreduce`` (stage 0's all-reduce and
the one-number ones: auto, ring, recursive_doubling, tree) and the batch
check.  Rank side (:mod:`minipar.run.worker`): the grid is dp = N
(:func:`grid_sizes`), the engine ZeRO-K (:class:`minipar.parallel.zero.engine.ZeRO`;
Rajbhandari et al. 2019, arXiv 1910.02054; :func:`engine_options`), trained by the one
loop; :func:`report` reports per rank next to the paper's figures
(:func:`minipar.parallel.zero.measure.formulas`):
model-state bytes, the replica's (2+2+K)Ψ with the optimizer states split N
ways at stage 1, the gradients too at stage 2 and the parameters too at
stage 3; and bytes sent per step, counted, next to the exact figure of what
ran and the paper's 2Ψ(N-1)/N elements for stages 0-2 and 3Ψ(N-1)/N for
stage 3 (the ring's figures: stage 0 under ``--allreduce auto`` runs
recursive doubling for a small model, and a note says so).  ``--remat [K]``,
``--offload host|disk`` (activations) and ``--offload-optimizer host|disk``
(ZeRO-Offload: master weights and moments) come from :mod:`minipar.run.remat_offload`.

Stage 3 only: ``--prefetch K`` posts the next K units' all-gathers while a unit
computes and the reduce-scatters non-blocking (0, the default: every collective
blocks), ``--no-reshard-after-forward`` keeps each unit gathered from its forward
to its backward (FSDP2).  Every stage-3 run reports the last step's compute and
communication intervals per rank, the share of communication hidden behind
computation (``hidden_fraction``, :func:`minipar.overlap.hidden_fraction`) and the
most it held gathered next to its formula; ``--trace FILE.json`` draws the
intervals in Perfetto.

ZeRO++ (stage 3; Wang et al. 2023, arXiv 2306.10209; :mod:`minipar.parallel.zero.zeropp`):
``--zeropp qwz,hpz,qgz`` (any subset) with ``--zeropp-block B`` (elements per scale,
default 256) and ``--node K`` (ranks per node; default MPI's own).  The verdict is bit
for bit against the serial ZeRO++ arithmetic (:func:`own_reference`; fp8: not comparable,
:data:`FP8_ZEROPP`), with the distance
from the unquantized serial run as a number (``from_serial``).  ``--json`` gives the
key ``zeropp``: ``parts``, ``block``, ``node``; per rank ``bytes_per_rank`` (measured,
per step) and ``bytes_exact_per_rank``, ``intra_per_rank`` / ``inter_per_rank`` (to
ranks of the same node / of other nodes, measured; ``*_exact_per_rank`` their exact
figures), ``zero3_bytes_exact_per_rank`` and ``zero3_inter_exact_per_rank`` (what
ZeRO-3 sends in the same run), ``formula`` / ``zero3_formula`` (the paper's volumes:
``total``, ``inter``, by collective) and ``hpz_held_per_rank`` / ``hpz_formula_per_rank``
(the memory hpZ adds).  With ``--remat`` the first step's walk is planned fetch by fetch
and learnt; a recomputed unit is fetched once more (hpZ: from the node), and the exact
figure counts each unit's fetches of that walk.  Refused in one line, before MPI starts:
a stage other than 3, an unknown part, a block that is not positive, ``--node`` not
dividing ``-n``, and ``--no-reshard-after-forward`` with ``--zeropp``.
"""

from __future__ import annotations

import argparse
from typing import Any

from minipar.cli.options import integer

#: ZeRO's stages and all-reduces (:data:`minipar.parallel.zero.engine.STAGES`,
#: :data:`~minipar.parallel.zero.engine.ALLREDUCE_CHOICES`, repeated here because importing
#: them would start MPI; a test checks that the copies agree)
STAGES = (0, 1, 2, 3)
ALLREDUCE_CHOICES = ("auto", "ring", "recursive_doubling", "tree")
#: ZeRO++'s parts and its default block (:data:`minipar.parallel.zero.zeropp.PARTS`,
#: :data:`minipar.parallel.zero.engine.ZEROPP_BLOCK`; copies, checked by a test)
ZEROPP_PARTS = ("qwz", "hpz", "qgz")
ZEROPP_BLOCK = 256


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--stage", type=integer(STAGES[0], STAGES[-1]), default=1,
                        help="ZeRO stage 0-3 (default 1)")
    parser.add_argument("--allreduce", choices=ALLREDUCE_CHOICES, default="auto",
                        help="stage 0's gradient all-reduce (and found_inf's, the loss's): "
                             "auto (by size and N, default), ring (the paper's figure), "
                             "recursive_doubling, tree")
    parser.add_argument("--prefetch", type=integer(0), default=0, metavar="K",
                        help="stage 3: all-gather the next K units while one computes, "
                             "reduce-scatter non-blocking (default 0: blocking)")
    parser.add_argument("--no-reshard-after-forward", dest="reshard_after_forward",
                        action="store_false",
                        help="stage 3: keep each unit gathered from its forward to its "
                             "backward (FSDP2; one all-gather fewer per step, Ψ held)")
    parser.add_argument("--zeropp", default=None, metavar="PARTS",
                        help="stage 3: ZeRO++'s parts, comma-separated: qwz (int8 weight "
                             "all-gather), hpz (backward all-gather inside the node, --node K), "
                             "qgz (int4 hierarchical gradient all-to-all); default: none")
    parser.add_argument("--zeropp-block", type=integer(1), default=ZEROPP_BLOCK, metavar="B",
                        help=f"ZeRO++'s quantization block: elements per scale "
                             f"(default {ZEROPP_BLOCK})")
    from minipar.run import remat_offload

    remat_offload.add_arguments(parser, optimizer=True)


def zeropp_parts(text: Any) -> tuple[str, ...]:
    """``--zeropp``'s parts, in ZeRO++'s order; ValueError naming an unknown one, an empty
    one (``qwz,``) or one given twice."""
    names = [p.strip() for p in (text or "").split(",")]
    if text is not None and any(names) and (not all(names) or len(set(names)) < len(names)):
        raise ValueError(f"--zeropp {text!r}: each part once, none empty, comma-separated, "
                         f"e.g. --zeropp {','.join(ZEROPP_PARTS)}")
    names = [p for p in names if p]
    for p in names:
        if p not in ZEROPP_PARTS:
            raise ValueError(f"--zeropp: unknown part {p!r}; parts: {', '.join(ZEROPP_PARTS)} "
                             "(any subset, comma-separated)")
    if text is not None and not names:
        raise ValueError(f"--zeropp needs at least one part of {', '.join(ZEROPP_PARTS)}")
    return tuple(p for p in ZEROPP_PARTS if p in names)


def check(options: dict[str, Any], spec: Any) -> None:
    """Launcher side: every rank needs a row of the batch; a known all-reduce."""
    from minipar import checks
    from minipar.parallel.common import check_world

    check_world(spec.batch, options["ranks"])
    checks.one_of("--allreduce", options.get("allreduce", "auto"), ALLREDUCE_CHOICES)
    stage = options.get("stage", 1)
    keep = not options.get("reshard_after_forward", True)
    for flag, on in (("--prefetch", options.get("prefetch", 0)),
                     ("--no-reshard-after-forward", keep)):
        if on and stage != 3:
            raise ValueError(f"{flag} is stage 3's (parameters gathered unit by unit); "
                             f"got --stage {stage}: add --stage 3")
    if zeropp_parts(options.get("zeropp")):
        if stage != 3:
            raise ValueError(f"--zeropp is ZeRO-3's (it changes stage 3's all-gathers and "
                             f"reduce-scatter); got --stage {stage}: add --stage 3")
        if keep:
            raise ValueError("--zeropp with --no-reshard-after-forward: ZeRO++ changes the "
                             "backward all-gather that this option removes; drop one of them")
    elif options.get("zeropp_block", ZEROPP_BLOCK) != ZEROPP_BLOCK:
        raise ValueError("--zeropp-block is ZeRO++'s quantization block: add --zeropp PARTS")
    from minipar.run import remat_offload

    remat_offload.check(options, spec)


def grid_sizes(options: dict[str, Any], spec: Any) -> dict[str, int]:
    """Every rank is a data-parallel rank: the grid is dp = -n."""
    return {"dp": options["ranks"]}


def engine_options(options: dict[str, Any], spec: Any) -> dict[str, Any]:
    """ZeRO's options (:class:`minipar.parallel.zero.engine.ZeRO`) from the command line's."""
    return {"stage": options.get("stage", 1), "allreduce": options.get("allreduce", "auto"),
            "timeline": options.get("stage", 1) == 3,
            **{k: options[k] for k in ("remat", "offload", "offload_optimizer", "offload_dir",
                                       "prefetch", "reshard_after_forward", "zeropp_block")
               if options.get(k) is not None},
            **({"zeropp": zeropp_parts(options["zeropp"])} if options.get("zeropp") else {})}


def overlap_row(engine: Any, rank: int) -> dict[str, Any]:
    """This rank's last step: its compute and communication intervals (the timeline of
    :func:`minipar.trace.ddp_events`), the share of communication hidden
    (:func:`minipar.overlap.hidden_fraction`), the communication's seconds."""
    from minipar.overlap import hidden_fraction, total

    compute = [(f"{what} {unit}", t0, t1) for what, unit, t0, t1 in engine.records
               if what != "comm"]
    comm = [(unit, t0, t1) for what, unit, t0, t1 in engine.records if what == "comm"]
    spans = [c[1:] for c in comm]
    return {"timeline": {"rank": rank, "compute": compute, "comm": comm},
            "hidden_fraction": hidden_fraction([c[1:] for c in compute], spans),
            "comm_seconds": total(spans)}


def report(engine: Any, grid: Any, options: dict[str, Any], spec: Any,
           history: Any) -> dict[str, Any] | None:
    """Rank side, after the steps: every rank's bytes and memory next to the paper's
    figures; rank 0 returns them.

    Bytes sent per step: what the steps sent (:func:`~minipar.parallel.zero.measure.step_bytes`:
    not the loss's own sum, not stage 3's gathering of ``full_params``) over the steps;
    the bytes by tracemalloc and the step peak: a second engine built and stepped under
    tracemalloc (:func:`~minipar.parallel.zero.measure.traced_engine`)."""
    from minipar.parallel.zero.measure import (
        engine_exact_bytes,
        formulas,
        step_bytes,
        traced_engine,
    )
    from minipar.run import remat_offload

    stage, algorithm = engine.stage, engine.allreduce
    sent = step_bytes(grid.world.stats) / len(history.losses)
    memory, memory_notes = remat_offload.summary_notes(engine.memory_wrap, last=1)
    if stage == 3 and options.get("remat") is not None:
        memory_notes.append("remat under stage 3 all-gathers each recomputed unit again: the "
                            "bytes counted exceed the formula by those gathers")
    off = engine.offload
    places = engine.ledger().bytes_by_place()
    if off is not None:
        memory_notes.append(f"optimizer states on {off.place} (ZeRO-Offload): "
                            f"{off.offloaded_bytes:,} bytes off the device; per step "
                            f"{off.moved['to_host'] // off.steps:,} bytes of gradients down, "
                            f"{off.moved['to_device'] // off.steps:,} of parameters up, "
                            f"{off.seconds / off.steps * 1e3:.2f} ms in the host step")
        memory_notes.append("model-state bytes by place (this rank; the figure above counts "
                            "every place): " + ", ".join(f"{k} {v:,}" for k, v in places.items()))
    zpp = zeropp_row(engine, grid, len(history.losses)) if engine.zeropp else None
    traced = traced_engine(grid, spec, **{**engine_options(options, spec), "timeline": False})
    traced["engine"].close()
    rows = grid.world.comm.gather((sent, sum(engine.ledger().bytes_by_category().values()),
                                   traced["tracemalloc_bytes"], traced["step_peak_bytes"],
                                   engine_exact_bytes(engine),
                                   overlap_row(engine, grid.rank) if stage == 3 else None,
                                   engine.zero_hooks.peak_gathered_bytes, zpp))
    if grid.rank != 0:
        return None
    psi, n = engine.layout.size, grid.world.size
    f = formulas(psi, n, stage, spec.precision, algorithm)
    grad_allreduce = engine.grad_allreduce()
    ran = grad_allreduce or "ring reduce-scatter + all-gather"
    notes = [f"Ψ = {psi:,} parameters; ZeRO stage {stage}; precision {spec.precision}",
             "model-state bytes by tracemalloc per rank: " + ", ".join(f"{r[2]:,}" for r in rows),
             "step peak (tracemalloc, activations + transients): "
             + ", ".join(f"{r[3]:,}" for r in rows)]
    if f["allreduce_note"]:
        notes.insert(1, f["allreduce_note"])
    notes += memory_notes
    stage3: dict[str, Any] = {}
    if stage == 3:
        from minipar.parallel.zero.measure import prefetch_peak_elements
        from minipar.parallel.zero.shard import unit_table

        over = [r[5] for r in rows]
        fractions = [o["hidden_fraction"] for o in over if o["hidden_fraction"] is not None]
        sizes = [hi - lo for _, lo, hi, _ in unit_table(engine.model.cfg)]
        peak = prefetch_peak_elements(sizes, engine.prefetch, engine.reshard)
        stage3 = {"prefetch": engine.prefetch, "reshard_after_forward": engine.reshard,
                  "hidden_fraction": sum(fractions) / len(fractions) if fractions else None,
                  "hidden_fraction_per_rank": [o["hidden_fraction"] for o in over],
                  "comm_seconds_per_rank": [o["comm_seconds"] for o in over],
                  "peak_gathered_bytes_per_rank": [r[6] for r in rows],
                  "peak_gathered_formula_bytes": peak * engine.policy.param_dtype.itemsize,
                  "timeline": [o["timeline"] for o in over]}
        notes.append(f"stage 3, prefetch {engine.prefetch}, reshard after forward "
                     f"{'on' if engine.reshard else 'off'}: held gathered at most "
                     f"{max(r[6] for r in rows):,} bytes (formula "
                     f"{stage3['peak_gathered_formula_bytes']:,}); communication hidden "
                     "behind computation (last step, mean of the ranks): "
                     + (f"{stage3['hidden_fraction']:.0%}" if fractions else "none sent"))
        if not engine.reshard:
            notes.append("without resharding after forward the backward gathers nothing: "
                         "one all-gather of Ψ fewer than the paper's 3Ψ (the exact figure "
                         "counts it)")
    if not spec.precision.startswith("mixed"):
        notes.append("the paper's memory formulas assume mixed precision (2+2+12 bytes per "
                     "parameter); this run uses the same partitioning with this precision's "
                     "sizes. Run with --precision mixed for the paper's numbers.")
    zeropp: dict[str, Any] = {}
    if engine.zeropp:
        zeropp = zeropp_summary(engine, [r[7] for r in rows], f, spec)
        notes += zeropp["zeropp"].pop("lines")
    return {"ranks": n, "data_parallel_ranks": n, "stage": stage, "allreduce": algorithm,
            "grad_allreduce": grad_allreduce, "psi": psi,
            "bytes_sent_per_rank": [r[0] for r in rows],
            "bytes_exact_per_rank": [r[4] for r in rows],
            "bytes_exact_text": ran.replace("_", " "), "bytes_formula": f["bytes"],
            "bytes_formula_text": f["bytes_text"],
            "model_state_bytes_per_rank": [r[1] for r in rows],
            "model_state_tracemalloc_per_rank": [r[2] for r in rows],
            "model_state_formula": f["model_state"],
            "model_state_formula_text": f["model_state_text"], "notes": notes,
            **({"memory": memory} if memory else {}),
            "model_state_by_place": places, **stage3, **zeropp}


def zeropp_row(engine: Any, grid: Any, steps: int) -> dict[str, Any]:
    """This rank's ZeRO++ figures: bytes per step measured in all, inside and across its
    node (by each peer's host), their exact figure, ZeRO-3's, the hpZ slices held at most
    and their formula."""
    from minipar.parallel.zero.measure import (
        hpz_secondary_elements,
        zeropp_exact_bytes,
        zeropp_measured,
    )
    from minipar.parallel.zero.shard import unit_table

    c, node, block = engine.comm, engine.zero_hooks.node, engine.zero_hooks.block
    k = node.size
    table = unit_table(engine.model.cfg)
    spans = [(a, b) for _, a, b, _ in table]
    b = engine.policy.param_dtype.itemsize
    walk = engine._learned  # remat's walk (a recomputed unit fetched once more), or none
    fetches = [walk.count(u.name) for u, *_ in table] if walk else None
    return {"measured": zeropp_measured(grid.world.stats, grid.hosts, grid.world.world_ranks,
                                        grid.rank, steps),
            "exact": zeropp_exact_bytes(spans, c.size, k, c.rank, engine.zeropp, block, b,
                                        fetches=fetches),
            "zero3": zeropp_exact_bytes(spans, c.size, k, c.rank, (), block, b,
                                        fetches=fetches),
            "hpz_held": engine.zero_hooks.peak_secondary_bytes,
            "hpz_formula": (hpz_secondary_elements(engine.layout.size, k, node.rank) * b
                            if "hpz" in engine.zeropp else 0)}


def zeropp_per_rank(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """Every rank's ZeRO++ row (:func:`zeropp_row`, the hybrid's too) as per-rank lists: bytes
    measured and exact in all, inside and across its node, ZeRO-3's, hpZ's slices held."""
    keys = {"bytes_per_rank": ("measured", "total"), "bytes_exact_per_rank": ("exact", "total"),
            "intra_per_rank": ("measured", "intra"), "inter_per_rank": ("measured", "inter"),
            "intra_exact_per_rank": ("exact", "intra"),
            "inter_exact_per_rank": ("exact", "inter"),
            "zero3_bytes_exact_per_rank": ("zero3", "total"),
            "zero3_inter_exact_per_rank": ("zero3", "inter")}
    out = {k: [r[a][b] for r in rows] for k, (a, b) in keys.items()}
    out["hpz_held_per_rank"] = [r["hpz_held"] for r in rows]
    out["hpz_formula_per_rank"] = [r["hpz_formula"] for r in rows]
    return out


def zeropp_ratio(out: dict[str, Any]) -> str:
    """ZeRO-3's exact bytes over ZeRO++'s measured ones, as the summary says it."""
    zero3 = max(out["zero3_bytes_exact_per_rank"])
    if not zero3:
        return "no messages on one rank"
    return f"{zero3 / max(max(out['bytes_per_rank']), 1):.2f}x"


def zeropp_lines(out: dict[str, Any], what: str, volumes: str, parts: Any,
                 psi: str) -> list[str]:
    """The summary's ZeRO++ lines: ``what`` ran (parts, block, nodes), bytes per rank measured
    against the exact figure and ZeRO-3's, inside / across nodes, the paper's ``volumes``,
    and hpZ's slices held against their formula (``psi``: the parameters it partitions)."""
    same = out["bytes_per_rank"] == out["bytes_exact_per_rank"] and \
        out["intra_per_rank"] == out["intra_exact_per_rank"]
    ratio = zeropp_ratio(out)
    lines = [f"{what}: bytes per rank per step measured "
             + ", ".join(f"{x:,.0f}" for x in out["bytes_per_rank"])
             + f" ({'=' if same else 'vs'} exact "
             + ", ".join(f"{x:,}" for x in out["bytes_exact_per_rank"]) + "); ZeRO-3's own "
             + ", ".join(f"{x:,}" for x in out["zero3_bytes_exact_per_rank"])
             + (f": {ratio} fewer" if ratio.endswith("x") else f": {ratio}"),
             "  inside the node / across nodes, measured: " + ", ".join(
                 f"{a:,.0f}/{e:,.0f}" for a, e in zip(out["intra_per_rank"],
                                                      out["inter_per_rank"]))
             + "; ZeRO-3's across nodes " + ", ".join(
                 f"{x:,}" for x in out["zero3_inter_exact_per_rank"]),
             volumes]
    if "hpz" in parts:
        lines.append("  hpZ's secondary slices held at most (bytes per rank): " + ", ".join(
            f"{x:,}" for x in out["hpz_held_per_rank"]) + f" (formula {psi}/K x b: "
            + ", ".join(f"{x:,}" for x in out["hpz_formula_per_rank"]) + ")")
    return lines


def zeropp_summary(engine: Any, rows: list[dict[str, Any]], f: dict[str, Any],
                   spec: Any) -> dict[str, Any]:
    """Rank 0: the summary's ``zeropp`` key (per rank: bytes measured and exact, in all,
    intra and inter node; ZeRO-3's; the paper's formulas; hpZ's memory), its headline and
    its lines."""
    from minipar.collectives import choose_allreduce
    from minipar.parallel.zero.measure import zeropp_formula_bytes

    psi, n, k = engine.layout.size, engine.comm.size, engine.zero_hooks.node.size
    block = engine.zero_hooks.block
    b = engine.policy.param_dtype.itemsize
    formula = zeropp_formula_bytes(psi, n, k, engine.zeropp, block, b)
    zero3 = zeropp_formula_bytes(psi, n, k, (), block, b)
    loss_ar = engine.allreduce if engine.allreduce != "auto" else choose_allreduce(8, n)
    out = {"parts": list(engine.zeropp), "block": block, "node": k,
           "loss_allreduce": loss_ar, **zeropp_per_rank(rows),
           "formula": formula, "zero3_formula": zero3}
    what = (f"ZeRO++ {'+'.join(engine.zeropp)} (block {block}, {n // k} node(s) of {k} "
            f"ranks, {engine.policy.param_dtype} elements)")
    volumes = (f"  the paper's volumes per rank: {formula['total']:,.0f} in all, "
               f"{formula['inter']:,.0f} across nodes (ZeRO-3: {zero3['total']:,.0f} in all, "
               f"{zero3['inter']:,.0f} across nodes" + (
                   ": the paper counts all of a rank's volume across; measured, a ring's rank "
                   "sends across only from a node's last rank to the next node's first"
                   if zero3["inter"] else "") + ")")
    lines = zeropp_lines(out, what, volumes, engine.zeropp, "Ψ")
    note = zeropp_node_note(engine.zeropp, n, k, "ranks")
    if note:
        lines.append("  " + note)
    out["lines"] = lines
    head = (f"ZeRO++ sends {max(out['bytes_per_rank']):,.0f} B per rank per step "
            f"{'=' if out['bytes_per_rank'] == out['bytes_exact_per_rank'] else 'vs'} its exact "
            f"figure, ZeRO-3 {max(out['zero3_bytes_exact_per_rank']):,} ({zeropp_ratio(out)})")
    return {"zeropp": out, "headline": head, "bytes_formula": formula["total"],
            "bytes_formula_text": f"ZeRO++ {'+'.join(engine.zeropp)}'s volumes (module "
                                  "minipar.parallel.zero.measure, zeropp_formula_bytes)",
            "bytes_exact_text": "ZeRO++'s collectives, packed parts counted exactly"}


def zeropp_node_note(parts: Any, n: int, k: int, who: str, why: str = "",
                     hint: str = "") -> str | None:
    """One line when the nodes make hpZ or qgZ do nothing useful: one node of every one of
    the ``n`` ranks (``who``), or nodes of one of them (``why``: how that came about);
    ``hint``: the options that would show the hierarchy (default: ``run zero``'s)."""
    if n == 1 or not {"hpz", "qgz"} & set(parts):
        return None
    hint = hint or (f"set --node {n // 2} (K ranks per node, K dividing {n})"
                    if n >= 4 and n % 2 == 0 else "run -n 4 --node 2")
    hpz = "hpz" in parts
    if k == n:
        return (f"one node holds all {n} {who} (--node not given, or as large): "
                + ("hpZ's secondary partition covers every rank, so its copies save no "
                   "bytes, and " if hpz else "qgZ has no hop across nodes: ")
                + f"nothing crosses a node; to see the hierarchy, {hint}")
    if k == 1:
        return (f"nodes of 1 of the {n} {who}{why}: "
                + ("hpZ's secondary partition is a whole replica on every rank (gathered "
                   "once, read locally), " if hpz else "")
                + ("qgZ has no hop inside a node, " if "qgz" in parts else "")
                + f"every byte crosses nodes; for 2 or more in a node, {hint}")
    return None


FP8_ZEROPP = ("fp8 with ZeRO++: the serial ZeRO++ arithmetic is replayed for the other "
              "precisions, and fp8's tolerance is for unquantized communication; the max |diff| "
              "given is from the unquantized serial run")


def not_comparable(options: dict[str, Any]) -> str | None:
    """A resumed ZeRO++ run: its serial arithmetic is replayed from the start only; fp8 with
    ZeRO++ (:data:`FP8_ZEROPP`)."""
    if options.get("zeropp") and options.get("precision") == "fp8":
        return FP8_ZEROPP
    if options.get("zeropp") and options.get("resume"):
        return ("a resumed ZeRO++ run: its serial ZeRO++ arithmetic is replayed from the "
                "initial parameters only; run it from the start to compare bit for bit")
    return None


def own_reference(options: dict[str, Any], spec: Any, m: dict[str, Any]) -> dict[str, Any] | None:
    """Rank 0, for the summary: a ZeRO++ run's reference, the serial run that repeats its
    quantized arithmetic (:func:`minipar.parallel.zero.oracle.zeropp_reference`); None
    for plain ZeRO (its reference is the serial run)."""
    z = m.get("zeropp")
    if not z or options.get("resume"):
        return None
    from minipar.parallel.zero.oracle import zeropp_reference

    ref = zeropp_reference(spec, m["ranks"], tuple(z["parts"]), z["node"], z["block"],
                           z["loss_allreduce"])
    return {**ref, "against": "the serial ZeRO++ arithmetic"}


def trace_events(summary: dict[str, Any]) -> list[dict[str, Any]]:
    """``--trace FILE.json``: every rank's last-step timeline (stage 3: the units' forward
    and backward, the all-gathers and reduce-scatters) as Chrome trace events."""
    from minipar.trace import ddp_events

    if "timeline" not in summary:
        return []
    return ddp_events(summary["timeline"], name="ZeRO-3",
                      comm_lane="all-gather / reduce-scatter", comm_label="{}")
