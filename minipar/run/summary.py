"""One summary for every ``minipar run`` strategy: built on rank 0, formatted by the launcher.

EN run summary · RU сводка запуска · ZH 运行摘要

The worker (:mod:`minipar.run.worker`) gives, on rank 0, the final parameters
(``engine.full_params()``), the per-step losses and the strategy's own measurements
(its ``report``);
:func:`build` adds the serial oracle's run and the verdict
(:mod:`minipar.parallel.parity`) and returns one JSON-able dict, printed by
rank 0 as one ``MINIPAR_SUMMARY {json}`` line.  The launcher prints it with
:func:`format_summary` (or as JSON with ``--json``).

The summary's keys (the ones every strategy has first):

=============================  ==============================================
``strategy``, ``ranks``,        what ran
``steps``
``losses``, ``serial_losses``   per step, parallel and its reference: the serial
                                run, or the serial run repeating its arithmetic
                                (ZeRO++: ``serial_label`` says which;
                                ``unquantized_serial_losses`` the plain one)
``verdict``                     :meth:`parity.Verdict.as_dict`: ``status``
                                ("equal", "different", "not comparable"),
                                ``reason``, ``max_param_diff``,
                                ``max_loss_diff``, ``tolerance``, ``line``
                                (printed as it is), ...
``parity``, ``max_param_diff``  status == "equal"; max |params - serial|
``parity_expected``             False when the run cannot equal the serial one
                                (asynchronous updates, any precision but
                                float64): the verdict says why
``bytes_sent_per_rank``         list over ranks: bytes sent per step (counted;
                                ``bytes_counted`` False when MPI's own ran);
``bytes_sent_text``             optional: what they cover when not every byte
``bytes_exact_per_rank``,       list over ranks: the exact bytes of the
``bytes_exact_text``            algorithms that ran, and what they were
``bytes_formula``,              the paper's figure per rank per step, and its
``bytes_formula_text``          formula as text
``model_state_bytes_per_rank``  list over ranks: bytes of params+grads+optimizer
``model_state_formula``,        the paper's figure and its formula as text
``model_state_formula_text``
``backend``, ``cuda_aware_mpi``  the array backend (numpy, cupy, strict) and
                                whether device buffers went to MPI as they are
``staged_d2h_per_rank``,        list over ranks: device bytes staged through
``staged_h2d_per_rank``         host memory per step, before sends and after
                                receives (0 under NumPy or a CUDA-aware MPI)
``transfers_per_rank``          the strict stand-in only: every crossing it
                                counted over the whole run, staging included
                                (``d2h_bytes``, ``d2h_calls``, ``h2d_...``)
``notes``                       list of extra lines to print
``headline``                    optional: the one number that teaches, as
                                the strategy words it (default: bytes sent
                                against the paper's figure, else memory held
                                against its formula); printed first, after
                                the verdict, on the line ``look first: ...``
=============================  ==============================================

Strategies add their own keys (``stage``, ``mode``, ``buckets``, ``timeline``,
...); a new one adds its keys the same way (``bubble_measured``,
``bytes_by_axis``, ...).
"""

from __future__ import annotations

import importlib
from typing import Any

from minipar.registry import STRATEGIES

SUMMARY_PREFIX = "MINIPAR_SUMMARY "


#: the strategies whose per-tensor FP8 amax is all-reduced over the ranks that hold parts
#: of each tensor (hybrid: with --pp 1 --micro-batches 1)
FP8_TENSOR_EQUAL = ("dp", "zero", "tp", "sp", "cp", "hybrid")


def fp8_tensor_reason(options: dict[str, Any], spec: Any = None) -> str | None:
    """Why a ``--fp8-scaling tensor`` run scales otherwise than the serial run (None: every
    tensor's amax is all-reduced, MAX, over exactly the ranks holding its parts)."""
    strategy, tail = options["strategy"], "; --fp8-scaling block equals the serial run"
    if options.get("experts"):
        return ("fp8 per-tensor current scaling with experts: each rank's experts multiply "
                "other tokens and their GEMMs' amax is not all-reduced" + tail)
    if options.get("tp_overlap"):
        return ("fp8 per-tensor current scaling under --tp-overlap: the overlapped layers "
                "multiply a tensor chunk by chunk as its pieces arrive, each chunk with its own "
                "amax (without --tp-overlap the amax is all-reduced over the ranks)" + tail)
    m = options.get("micro_batches")
    if strategy == "hybrid" and m is None and spec is not None and "ranks" in options:
        from minipar.run.hybrid import sizes

        m = sizes(options, spec)["m"]
    if strategy == "pp" or strategy == "hybrid" and ((options.get("pp") or 1) > 1 or m != 1):
        return ("fp8 per-tensor current scaling over micro-batches: the serial run scales each "
                "tensor by its amax over the whole batch, which is known only after every "
                "micro-batch's forward, but a pipeline runs micro-batch 1's GEMMs before the "
                "others exist, so each micro-batch gets its own scale; only delayed scaling "
                "(the amax of earlier steps) could give them all the serial one (hybrid with "
                "--pp 1 --micro-batches 1 equals the serial run, as does --fp8-scaling block)")
    if strategy not in FP8_TENSOR_EQUAL:
        return (f"fp8 per-tensor current scaling: {strategy} does not all-reduce each "
                f"tensor's amax over its ranks ({', '.join(FP8_TENSOR_EQUAL)} with --pp 1 "
                f"--micro-batches 1 do)" + tail)
    return None


def not_comparable_reason(options: dict[str, Any], spec: Any = None) -> str | None:
    """Why this run cannot equal the serial one (None when it must).

    Any precision but float64 rounds differently: the ranks' partial sums are
    added in another order than the serial sum, and a float32 or 16-bit sum
    keeps too few digits for that order not to show.  A strategy may add its
    own reason (``not_comparable(options)``: the asynchronous parameter server)."""
    precision = options.get("precision", "float64")
    if precision == "float32":
        return ("float32 sums across ranks round in another order than the serial sum "
                "(parity is defined in float64)")
    if precision == "fp8" and options.get("fp8_scaling") == "tensor":
        why = fp8_tensor_reason(options, spec)
        if why is not None:
            return why
    if precision not in ("float64", "fp8"):  # fp8: its own tolerance (parallel.parity)
        return (f"{precision} keeps 16-bit gradients, and 16-bit sums across ranks round in "
                "another order than the serial sum (parity is defined in float64)")
    module = importlib.import_module(STRATEGIES[options["strategy"]][0])
    return getattr(module, "not_comparable", lambda o: None)(options)


def build(options: dict[str, Any], spec: Any, m: dict[str, Any]) -> dict[str, Any]:
    """The summary of a run (rank 0): ``m`` from the worker (losses, params, report).

    ``m`` holds ``ranks``, ``losses`` (per step), ``params`` (the final flat
    parameters), ``data_parallel_ranks`` (the ranks that split the batch: the
    oracle of a mixture of experts depends on it) and the strategy's own keys,
    copied into the summary as they are."""
    from minipar.optim import FlatParams
    from minipar.parallel import parity
    from minipar.nn.gpt import param_shapes
    from minipar.parallel.common import serial_reference
    from minipar.precision import fp8_recipe

    m = dict(m)
    params, losses = m.pop("params"), [float(v) for v in m.pop("losses")]
    serial_world = m.pop("data_parallel_ranks")
    start, resume = m.pop("start", 0), options.get("resume")
    load = None
    if resume is not None:  # the oracle of a resumed segment: the serial engine resumed
        from minipar.parallel import checkpoint

        def load(engine: Any) -> int:
            return int(checkpoint.load(engine, resume, spec=spec)["step"] or 0)
    serial = serial_reference(spec, serial_world, load)
    if resume is None:
        init = spec.initial_params()
        initial = FlatParams.like(init).flatten(init)
    else:
        initial = serial["initial"]
    reason = not_comparable_reason(options, spec)
    module = importlib.import_module(STRATEGIES[options["strategy"]][0])
    fp8 = options.get("precision") == "fp8"
    # a run whose reference repeats its arithmetic (ZeRO++, any precision but fp8): bit for bit
    own = None if fp8 else getattr(module, "own_reference", lambda *a: None)(options, spec, m)
    if own is not None:
        v = parity.bitwise(losses, own["losses"], params, own["params"], own["against"])
        d = parity.compare(losses, serial["losses"], params, serial["params"], initial).as_dict()
        m["from_serial"] = {k: d[k] for k in
                            ("max_param_diff", "param_gap", "max_loss_diff", "loss_gap")}
        m["unquantized_serial_losses"] = [float(x) for x in serial["losses"]]
        m["serial_label"] = own.get("label", "serial ZeRO++")
        serial = {**serial, "losses": own["losses"]}  # the table's column: what it equals
        reason = None
    elif reason is None:
        v = parity.compare(losses, serial["losses"], params, serial["params"], initial,
                           fp8=fp8)
    else:
        v = parity.not_comparable(reason, losses, serial["losses"], params, serial["params"])
    verdict = v.as_dict()
    notes = m.pop("notes", [])
    if "from_serial" in m:
        d = m["from_serial"]
        gap = "" if d["param_gap"] is None else f" ({d['param_gap']:.3g} of the distance trained)"
        notes.append(f"from the unquantized serial run: max |diff| {d['max_param_diff']:.3g}"
                     f"{gap}, losses {d['max_loss_diff']:.3g} apart at most (what quantization "
                     "changed: a number, not a verdict)")
        if d["param_gap"] is not None and d["param_gap"] > 1:
            notes.append("  more than the distance trained: over these few steps the INT8/INT4 "
                         "rounding, added at every step and amplified by Adam's normalised "
                         "updates, moved the weights further than training did (noise, not a "
                         "bug: the run equals its serial ZeRO++ arithmetic)")
    world = serial_world
    if spec.experts and world > 1 and not any("mixture of experts" in n for n in notes):
        notes.append(f"mixture of experts: each of the {world} data-parallel ranks routes its own "
                     "rows as one group (capacity and aux loss are per group, GShard's local "
                     f"groups), so the serial run accumulates {world} micro-batches cut like the "
                     "ranks' rows: its losses depend on -n")
    if resume is not None:
        notes.append(f"resumed at step {start} from {resume}: the serial run is the serial "
                     "engine resumed from the same checkpoint")
    if options.get("save"):
        notes.append(f"checkpoints written to {options['save']}")
    recipe = {"precision": spec.precision}
    if fp8:
        recipe.update(fp8_recipe(spec.fp8_scaling, spec.fp8_block, sum(
            k.startswith("blocks.") and ".w_" in k for k in param_shapes(spec.config()))))
    return {**recipe, "strategy": options["strategy"], "ranks": m.pop("ranks"),
            "steps": spec.steps,
            "start": start, "losses": losses, "serial_losses": [float(x) for x in serial["losses"]],
            "verdict": verdict, "parity": v.status == "equal",
            "max_param_diff": verdict.get("max_param_diff"),
            "parity_expected": reason is None, **m, "notes": notes}


def format_summary(s: dict[str, Any]) -> str:
    """The summary as a few lines a learner reads at a glance."""
    ranks = f"{s['ranks']} rank{'s' if s['ranks'] != 1 else ''}"
    steps = f"{s['steps']} step{'s' if s['steps'] != 1 else ''}"
    lines = [f"minipar run {s['strategy']}: {ranks}, {steps}", look_first(s)]
    if s.get("fp8_recipe"):
        lines.append(s["fp8_recipe"])
    ref = f"loss ({s.get('serial_label', 'serial')})"
    w = max(16, len(ref))
    lines.append(f"{'step':>4}  {'loss (parallel)':>16}  {ref:>{w}}")
    for i, (a, b) in enumerate(zip(s["losses"], s["serial_losses"]), start=s.get("start", 0)):
        lines.append(f"{i:>4}  {a:>16.10f}  {b:>{w}.10f}")
    for step, v in (s.get("validation") or {}).items():
        lines.append(f"validation loss after step {step}: {v:.6f}")
    lines.append(s["verdict"]["line"])
    if "bytes_sent_per_rank" in s:
        sent = ", ".join(f"{b:,.0f}" for b in s["bytes_sent_per_rank"])
        counted = "counted" if s.get("bytes_counted", True) else (
            "not counted: MPI's own collective does not tell its bytes")
        covers = f"; {s['bytes_sent_text']}" if s.get("bytes_sent_text") else ""
        lines.append(f"bytes sent per rank per step ({counted}{covers}): {sent}")
        if "bytes_exact_per_rank" in s:
            exact = ", ".join(f"{b:,.0f}" for b in s["bytes_exact_per_rank"])
            lines.append(f"  exact figure of what ran ({s.get('bytes_exact_text', 'per rank')}): "
                         f"{exact}")
        if "bytes_formula" in s:
            lines.append(f"  the paper's figure {s.get('bytes_formula_text', '')} = "
                         f"{s['bytes_formula']:,.0f}")
    if "model_state_bytes_per_rank" in s:
        held = ", ".join(f"{b:,.0f}" for b in s["model_state_bytes_per_rank"])
        lines.append(f"model-state bytes held per rank (measured): {held}")
        if "model_state_formula" in s:
            lines.append(f"  formula {s.get('model_state_formula_text', '')} = "
                         f"{s['model_state_formula']:,.0f}")
    if "backend" in s:
        lines.append(_device_boundary(s))
    if s.get("hosts") and len(s["hosts"]["names"]) > 1:
        lines.append(_hosts(s["hosts"]))
    lines += list(s.get("notes", []))
    return "\n".join(lines)


#: the verdict as the first line says it
VERDICT_WORDS = {"equal": "equal to the serial run", "different": "DIFFERENT from the serial run",
                 "not comparable": "not compared with the serial run"}


def look_first(s: dict[str, Any]) -> str:
    """The line to read first: the verdict and the one number that teaches (the strategy's
    ``headline``; a pipeline's bubble, context parallelism's attention bytes; or the bytes
    sent against the paper's figure, or the memory held against its formula); the details
    follow below it."""
    words = [VERDICT_WORDS.get(s["verdict"]["status"], s["verdict"]["status"])]
    against = s["verdict"].get("against", "the serial run")
    if against != "the serial run" and s["verdict"]["status"] != "not comparable":
        words = [words[0].replace("the serial run", against) + ", bit for bit"]
    if s.get("headline"):
        words.append(s["headline"])
    elif "bubble_measured" in s and "bubble_formula" in s:  # a pipeline: its bubble
        words.append(f"bubble {s['bubble_measured']['rebuilt']:.3f} (rebuilt from measured "
                     f"costs) vs the formula's {s['bubble_formula']:.3f}")
    elif isinstance(s.get("attention_bytes_per_layer_formula"), dict) and s.get(
            "attention_forward_bytes_per_layer_per_rank"):  # context parallelism: attention's
        sent = max(s["attention_forward_bytes_per_layer_per_rank"])
        f = s["attention_bytes_per_layer_formula"]["forward"]
        words.append(f"{sent:,.0f} B of attention exchange per rank per layer (forward) "
                     f"{'=' if round(sent) == round(f) else 'vs'} the formula's {f:,.0f}")
    elif "bytes_sent_per_rank" in s and "bytes_formula" in s and s.get("bytes_counted", True):
        sent = max(s["bytes_sent_per_rank"])
        same = "=" if round(sent) == round(s["bytes_formula"]) else "vs"
        words.append(f"{sent:,.0f} B sent per rank per step {same} the paper's figure "
                     f"{s['bytes_formula']:,.0f}")
    elif "model_state_bytes_per_rank" in s and "model_state_formula" in s:
        held = max(s["model_state_bytes_per_rank"])
        same = "=" if round(held) == round(s["model_state_formula"]) else "vs"
        words.append(f"{held:,.0f} B of model state held per rank {same} the formula's "
                     f"{s['model_state_formula']:,.0f}")
    return "look first: " + "; ".join(words)


def _hosts(h: dict[str, Any]) -> str:
    """Where the ranks ran (one host a line), then the bytes per step each axis sent inside a
    host and across hosts, summed over the ranks."""
    lines = ["placement: " + "; ".join(h["placement"])]
    axes: dict[str, list[float]] = {}
    for r in h["bytes_by_axis_per_rank"]:
        for a, b in r.items():
            t = axes.setdefault(a, [0.0, 0.0])
            t[0] += b["intra"]
            t[1] += b["inter"]
    if axes:
        lines.append("bytes per step, all ranks, inside a host / across hosts: " + ", ".join(
            f"{a} {i:,.0f} / {x:,.0f}" for a, (i, x) in axes.items()))
    return "\n".join(lines)


def _device_boundary(s: dict[str, Any]) -> str:
    """What crossing to MPI cost: nothing on the host; a copy each way per message on a
    device with an MPI that is not CUDA-aware (minipar.comm.staging)."""
    if s["backend"] == "numpy":
        return "device boundary: NumPy arrays live in host memory, MPI reads them as they are"
    if s.get("cuda_aware_mpi"):
        return (f"device boundary ({s['backend']}): CUDA-aware MPI, device buffers handed to "
                "MPI as they are, nothing staged")
    d2h = ", ".join(f"{b:,.0f}" for b in s["staged_d2h_per_rank"])
    h2d = ", ".join(f"{b:,.0f}" for b in s["staged_h2d_per_rank"])
    line = (f"device boundary ({s['backend']}, MPI not CUDA-aware): bytes staged through host "
            f"memory per rank per step, device->host {d2h}; host->device {h2d}")
    if "transfers_per_rank" in s:
        t = s["transfers_per_rank"]
        line += ("\n  every crossing the stand-in counted over the run (staging, loss values, "
                 "checkpoints, the final parameters), per rank: device->host " + ", ".join(
                     f"{x['d2h_calls']:,} calls {x['d2h_bytes']:,} B" for x in t)
                 + "; host->device " + ", ".join(
                     f"{x['h2d_calls']:,} calls {x['h2d_bytes']:,} B" for x in t))
    return line
