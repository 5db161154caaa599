"""``minipar bench precision``: what the bits cost, measured on the embedded text.

EN low-precision benchmark · RU замер низкой точности · ZH 低精度基准测试

The same GPT, the same initial weights and the same batches of the text shipped in the
package (bytes, vocabulary 256), trained for the same steps in every recipe:

* **precisions**, serial (:func:`minipar.parallel.strategies.build` ``"serial"``, the one
  loop :func:`minipar.parallel.loop.train`): ``float32``; ``bf16 mixed`` (bf16 params and
  grads, fp32 master and Adam, :mod:`minipar.precision`); ``fp8 tensor`` (one scale per
  tensor, Micikevicius et al. 2022, arXiv 2209.05433); ``fp8 block`` (DeepSeek-V3's 1x128
  tiles and 128x128 blocks, arXiv 2412.19437 §3.3);
* **ZeRO-3 and ZeRO++** on ``-n`` local ranks in nodes of ``--node`` ranks (``minipar run
  zero --stage 3 --zeropp ...``, one launch each, float32 as the first row): ZeRO-3
  alone, then each part of ZeRO++ (Wang et al. 2023, arXiv 2306.10209: qwZ's INT8
  weight all-gather, hpZ's node-local secondary partition, qgZ's INT4 gradient
  all-to-all) and all three; bytes sent per rank per step, and across nodes, counted.

For each: the validation loss every ``--eval-every`` steps (the text's held-out 10%), the
final one, and with ``--plot FILE.png`` the curves.  And, without training, the error
quantization makes on **activations with outliers** (:func:`outlier_errors`): a tensor
of normal values with a few values ``magnitude`` times larger, quantized per tensor and
in 1x128 tiles (:mod:`minipar.quantize`), E4M3 and INT8, the relative error of the
ordinary values.

Numbers are reported as measured: at this size the newer recipe need not win (a model
this small has few outliers; E4M3's exponent absorbs outliers up to ~10^4 x; FP8's
rounding is noise next to a short run's).

    minipar bench precision                      # 100 steps, ZeRO on 4 ranks, nodes of 2
    minipar bench precision --steps 50 --plot precision.png --json-out precision.json
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from typing import Any

import numpy as np

from minipar.bench import emit
from minipar.cli.options import ArgumentParser, add_json_options, integer, number, output_file

PROG = "minipar bench precision"
#: row name -> RunSpec fields of the serial precision rows
RECIPES: dict[str, dict[str, str]] = {
    "float32": {"precision": "float32"},
    "bf16 mixed": {"precision": "mixed"},
    "fp8 tensor": {"precision": "fp8", "fp8_scaling": "tensor"},
    "fp8 block": {"precision": "fp8", "fp8_scaling": "block"},
}
#: ``--zeropp`` entries: ZeRO-3 alone, each part, all three
ZEROPP: dict[str, tuple[str, ...]] = {"none": (), "qwz": ("qwz",), "hpz": ("hpz",),
                                      "qgz": ("qgz",), "all": ("qwz", "hpz", "qgz")}
#: the default size: docs/PERFORMANCE.md's table (a few minutes on 2 cores)
SIZES = {"layers": 2, "heads": 2, "d_model": 64, "seq": 32, "batch": 8}
#: the outlier tensor: rows x columns of standard normal values, ``count`` of them large
OUTLIER_SHAPE, OUTLIER_COUNT, MAGNITUDES = (64, 1024), 8, (1e2, 1e3, 1e4, 1e5)


# -- quantization error of activations with outliers (no training) --------------------------
def outlier_activations(magnitude: float, shape: tuple[int, int] = OUTLIER_SHAPE,
                        count: int = OUTLIER_COUNT, seed: int = 0) -> tuple[Any, Any]:
    """(x, outliers): standard normal activations, ``count`` of them set to ±``magnitude``
    (the mask ``outliers`` says which)."""
    rng = np.random.default_rng(seed)
    x = rng.standard_normal(shape)
    where = np.zeros(x.size, dtype=bool)
    where[rng.choice(x.size, count, replace=False)] = True
    x.reshape(-1)[where] = magnitude * np.sign(x.reshape(-1)[where])
    return x, where.reshape(shape)


def relative_error(x: Any, fmt: str, block: tuple[int, ...], keep: Any = None) -> float:
    """‖x − dequantize(quantize(x))‖ / ‖x‖ over the elements ``keep`` (all by default)."""
    from minipar import quantize as Q

    q, scales = Q.quantize(x, fmt, block)
    back = Q.dequantize(q, scales, fmt, block, x.shape)
    keep = np.ones(x.shape, dtype=bool) if keep is None else keep
    return float(np.linalg.norm((x - back)[keep]) / np.linalg.norm(x[keep]))


def error_vs_block(x: Any, blocks: list[tuple[int, ...]], formats: tuple[str, ...],
                   keep: Any = None) -> dict[str, list[float]]:
    """Relative error of ``x`` quantized with each block shape, per format (:func:`relative_error`;
    ``keep``: the elements counted)."""
    return {f: [relative_error(x, f, b, keep) for b in blocks] for f in formats}


def outlier_errors(magnitudes: tuple[float, ...] = MAGNITUDES,
                   formats: tuple[str, ...] = ("e4m3", "int8")) -> list[dict[str, Any]]:
    """Per magnitude and format: the relative error of the ordinary (non-outlier) values,
    one scale per tensor against one per 1x128 tile, and their share flushed to zero."""
    from minipar import quantize as Q

    rows = []
    for m in magnitudes:
        x, big = outlier_activations(m)
        for fmt in formats:
            row: dict[str, Any] = {"magnitude": m, "format": fmt}
            for name, block in (("tensor", x.shape), ("tile", (1, 128))):
                q, s = Q.quantize(x, fmt, block)
                back = Q.dequantize(q, s, fmt, block, x.shape)
                row[name] = relative_error(x, fmt, block, ~big)
                row[f"{name}_zeros"] = float(np.mean(back[~big] == 0))
            rows.append(row)
    return rows


# -- training rows -------------------------------------------------------------------------
def spec_fields(a: Any) -> dict[str, Any]:
    """The RunSpec fields every row shares (the embedded text, the model, the optimizer)."""
    from minipar.parallel.common import EMBEDDED

    return {"text": EMBEDDED, "vocab": 256, "seq": a.seq, "d_model": a.d_model,
            "layers": a.layers, "heads": a.heads, "batch": a.batch, "steps": a.steps,
            "lr": a.lr, "seed": a.seed}


def precision_row(name: str, fields: dict[str, Any], eval_every: int,
                  eval_batches: int) -> dict[str, Any]:
    """One serial run of recipe ``name`` (:data:`RECIPES`): losses and validation."""
    from minipar.parallel import loop, strategies
    from minipar.parallel.common import RunSpec

    spec = RunSpec(**fields, **RECIPES[name])
    engine = strategies.build("serial", spec)
    t0 = time.perf_counter()
    h = loop.train(engine, spec.batch_at, spec.steps, eval_source=spec.eval_batch_at,
                   eval_every=eval_every, eval_batches=eval_batches)
    return {"name": name, "kind": "precision", "losses": h.losses,
            "validation": sorted(h.validation.items()), "seconds": time.perf_counter() - t0,
            "bytes_per_step": None, "inter_node_bytes_per_step": None}


def zero_argv(parts: tuple[str, ...], fields: dict[str, Any], ranks: int, node: int,
              eval_every: int, eval_batches: int, precision: str) -> list[str]:
    """``minipar run zero --stage 3 [--zeropp ...]`` of a ZeRO row (the same model)."""
    argv = ["zero", "--stage", "3", "-n", str(ranks), "--node", str(node), "--text",
            "--precision", precision, "--eval-every", str(eval_every),
            "--eval-batches", str(eval_batches)]
    for k in ("seq", "d_model", "layers", "heads", "batch", "steps", "lr", "seed"):
        argv += ["--" + k.replace("_", "-"), repr(fields[k])]
    return argv + (["--zeropp", ",".join(parts)] if parts else [])


def zero_row(key: str, argv: list[str], timeout: float) -> dict[str, Any]:
    """One ``minipar run`` launch: validation, losses, bytes per rank per step (mean of the
    ranks), the bytes that crossed a node boundary (mean of the ranks) and ZeRO-3's exact
    bytes for the same model (``zero3_bytes_per_step``; a ZeRO++ run's summary has them)."""
    from minipar import launch
    from minipar.run import SUMMARY_PREFIX, parse

    options = parse(argv)
    t0 = time.perf_counter()
    s, _ = launch.run_json(options["ranks"], "minipar.run.worker", options, timeout=timeout,
                           prefix=SUMMARY_PREFIX, check=True)
    per_rank = s["bytes_sent_per_rank"]  # every communicator, ZeRO++'s node and cross ones
    inter = [sum(b["inter"] for b in axes.values())  # (the same steps' bytes, by peer's host)
             for axes in s["hosts"]["bytes_by_axis_per_rank"]]
    name = "ZeRO-3" + ("" if key == "none" else f" + {'+'.join(ZEROPP[key])}")
    zpp = s.get("zeropp") or {}  # a ZeRO++ run also says what ZeRO-3 sends: its exact figure
    zero3 = zpp.get("zero3_bytes_exact_per_rank", per_rank)
    return {"name": name, "kind": "zero", "losses": s["losses"],
            "zero3_bytes_per_step": sum(zero3) / len(zero3),
            "validation": sorted((int(k), v) for k, v in s["validation"].items()),
            "seconds": time.perf_counter() - t0,
            "bytes_per_step": sum(per_rank) / len(per_rank),
            "inter_node_bytes_per_step": sum(inter) / len(inter),
            "verdict": s["verdict"]["status"]}


# -- the report ----------------------------------------------------------------------------
def look_first(rows: list[dict[str, Any]]) -> str:
    """The line to read first: each row's final validation against float32's (or the first
    row's), and ZeRO++'s bytes against ZeRO-3's, in all and across nodes."""
    done = [r for r in rows if r["validation"]]
    words = []
    if done:
        ref = next((r for r in done if r["name"] == "float32"), done[0])
        v0 = ref["validation"][-1][1]
        words.append(f"final validation {ref['name']} {v0:.4f}" + "".join(
            f", {r['name']} {round(r['validation'][-1][1] - v0, 4) + 0.0:+.4f}"
            for r in done if r is not ref))
    zero = {r["name"]: r for r in rows if r["kind"] == "zero"}
    best = zero.get("ZeRO-3 + qwz+hpz+qgz") or next(
        (r for n, r in zero.items() if n != "ZeRO-3"), None)
    if best is not None:
        z3 = zero.get("ZeRO-3")
        total = best["bytes_per_step"] / best["zero3_bytes_per_step"]
        across = (f", {best['inter_node_bytes_per_step'] / z3['inter_node_bytes_per_step']:.3f}x"
                  " across nodes" if z3 and z3["inter_node_bytes_per_step"] else "")
        words.append(f"{best['name']} sends {total:.2f}x ZeRO-3's bytes{across}")
    return "look first: " + ("; ".join(words) or "no rows")


def report(out: dict[str, Any]) -> str:
    sp, z = out["spec"], out["zero"]
    zero_rows = any(r["kind"] == "zero" for r in out["rows"])
    lines = [f"GPT {sp['layers']} layers x {sp['heads']} heads, d_model {sp['d_model']}, "
             f"context {sp['seq']}, batch {sp['batch']}, {sp['steps']} steps, AdamW lr "
             f"{sp['lr']:g}, the embedded text"
             + (f"; ZeRO rows on {z['ranks']} ranks in nodes of {z['node']}, {z['precision']}"
                if zero_rows else "") + f"; load average {out['load']}",
             look_first(out["rows"]),
             f"final validation: the held-out loss after step {sp['steps']} (lower is better; "
             f"every {out['eval_every']} steps{out.get('eval_note', '')}); float32 is the "
             "reference, one seed: differences of ~0.01 are within noise"]
    if zero_rows:
        lines.append("bytes/rank/step: what each rank sent per training step, counted on "
                     "every communicator, mean of the ranks; across nodes: the part of it "
                     "sent to a rank of another node")
    head = (f"{'recipe':<22} {'final validation':>16} {'bytes/rank/step':>16} "
            f"{'across nodes':>13} {'seconds':>8}")
    lines += [head, "-" * len(head)]
    for r in out["rows"]:
        val = f"{r['validation'][-1][1]:16.4f}" if r["validation"] else f"{'-':>16}"
        b, x = r["bytes_per_step"], r["inter_node_bytes_per_step"]
        lines.append(f"{r['name']:<22} {val} {'-' if b is None else f'{b:,.0f}':>16} "
                     f"{'-' if x is None else f'{x:,.0f}':>13} {r['seconds']:8.1f}")
    lines.append("")
    lines.append(f"quantization error of activations with outliers ({OUTLIER_SHAPE[0]} x "
                 f"{OUTLIER_SHAPE[1]} normal values, {OUTLIER_COUNT} set to ±magnitude): "
                 "relative error of the ordinary values (zeros: their share flushed to 0)")
    lines.append(f"{'magnitude':>9} {'format':>6} {'per tensor':>11} {'1x128 tiles':>12} "
                 f"{'zeros tensor':>13} {'zeros tiles':>12}")
    for e in out["outliers"]:
        lines.append(f"{e['magnitude']:9.0e} {e['format']:>6} {e['tensor']:11.2e} "
                     f"{e['tile']:12.2e} {e['tensor_zeros']:13.1%} {e['tile_zeros']:12.1%}")
    return "\n".join(lines)


def plot(rows: list[dict[str, Any]], path: str) -> None:
    """Validation loss against step, one line per row (:func:`minipar.viz.precision.loss_curves`)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from minipar.viz.precision import loss_curves

    fig, ax = plt.subplots(figsize=(7, 4))
    loss_curves(rows, ax)
    ax.set_title("minipar bench precision: the same model, steps and batches")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def _parser() -> ArgumentParser:
    p = ArgumentParser(prog=PROG, description=__doc__.split("\n")[0])
    p.add_argument("--steps", type=integer(1), default=100,
                   help="training steps of every row (default %(default)s)")
    p.add_argument("--eval-every", type=integer(1), default=None,
                   help="validation every K steps, at most --steps (default: the largest "
                        "divisor of --steps up to 10, so the last validation is at the last "
                        "step)")
    p.add_argument("--eval-batches", type=integer(1), default=2,
                   help="held-out batches averaged per validation (default %(default)s)")
    for name, value in SIZES.items():
        p.add_argument("--" + name.replace("_", "-"), type=integer(1), default=value,
                       help=f"{name.replace('_', ' ')} (default %(default)s)")
    p.add_argument("--lr", type=number(greater_than=0), default=1e-3,
                   help="AdamW learning rate (default %(default)s)")
    p.add_argument("--seed", type=integer(0), default=0,
                   help="initialisation seed (default %(default)s)")
    p.add_argument("--recipes", type=choices_list("--recipes", RECIPES),
                   default=list(RECIPES), metavar="R[,R...]",
                   help=f"serial rows, comma-separated (default {','.join(RECIPES)})")
    p.add_argument("-n", "--ranks", type=integer(2), default=4,
                   help="ranks of the ZeRO rows (default %(default)s)")
    p.add_argument("--node", type=integer(1), default=2,
                   help="ranks per node of the ZeRO rows, dividing -n (default %(default)s)")
    p.add_argument("--zeropp", type=choices_list("--zeropp", ZEROPP),
                   default=list(ZEROPP), metavar="P[,P...]",
                   help="ZeRO rows: none (ZeRO-3 alone), qwz, hpz, qgz, all (the three); "
                        f"default {','.join(ZEROPP)}")
    p.add_argument("--zero-precision", choices=("float32", "float64"), default="float32",
                   help="the ZeRO rows' dtype (default %(default)s, as the first row)")
    p.add_argument("--no-zero", action="store_true", help="no ZeRO rows (no MPI launch)")
    p.add_argument("--plot", metavar="FILE.png", type=output_file,
                   help="draw the validation curves into FILE.png")
    p.add_argument("--timeout", type=number(greater_than=0), default=1800.0,
                   help="seconds before a ZeRO launch is stopped (default %(default)s)")
    add_json_options(p, "every row's losses, validation and bytes, the outlier errors")
    return p


def choices_list(option: str, known: dict[str, Any]) -> Any:
    """An argparse ``type``: comma-separated names from ``known``."""
    def parse(text: str) -> list[str]:  # "fp8-block" = "fp8 block"
        names = [" ".join(t.strip().replace("-", " ").split()) for t in text.split(",")]
        bad = [t for t in names if t not in known]
        if bad or not names or len(set(names)) < len(names):
            raise argparse.ArgumentTypeError(
                f"must be distinct names from {', '.join(known)}, comma-separated (a space "
                f"or a hyphen inside a name), got {text!r}")
        return names
    return parse


def parse_args(argv: list[str]) -> argparse.Namespace:
    """The bench's options (``argv`` without the program name), ``eval_every`` filled in
    when not given: the largest divisor of ``steps`` up to 10 (``eval_note`` says so)."""
    a = _parser().parse_args(argv)
    a.eval_note = ""
    if a.eval_every is None:  # the last validation at the last step
        a.eval_every = max(k for k in range(1, min(10, a.steps) + 1) if a.steps % k == 0)
        a.eval_note = ": the largest divisor of --steps up to 10"
    return a


def main(argv: list[str]) -> int:
    p = _parser()
    a = parse_args(argv)
    eval_note = a.eval_note
    if a.eval_every > a.steps:
        p.error(f"--eval-every must be at most --steps ({a.steps}), got {a.eval_every}: "
                "no validation would run")
    if a.ranks % a.node:
        ok = ", ".join(str(k) for k in range(1, a.ranks + 1) if a.ranks % k == 0)
        p.error(f"--node {a.node} does not divide -n {a.ranks}: nodes of equal size; "
                f"use one of {ok}")
    fields = spec_fields(a)
    from minipar.parallel.common import RunSpec

    try:
        RunSpec(**fields)  # a head count that does not divide d_model, a context too long
    except ValueError as e:
        p.error(str(e))
    if a.batch < a.ranks and not a.no_zero:
        p.error(f"--batch {a.batch} is smaller than -n {a.ranks}: every ZeRO rank needs a row")
    recipes = a.recipes
    from minipar import launch
    from minipar.progress import tick, watched

    rows = []
    zero_keys = [] if a.no_zero else a.zeropp
    with watched(len(recipes) + len(zero_keys), "run") as progress:
        for name in recipes:
            rows.append(precision_row(name, fields, a.eval_every, a.eval_batches))
            tick(progress)
        for key in zero_keys:
            argv_z = zero_argv(ZEROPP[key], fields, a.ranks, a.node, a.eval_every,
                               a.eval_batches, a.zero_precision)
            try:
                rows.append(zero_row(key, argv_z, a.timeout))
            except launch.LaunchError as e:
                return launch.report(PROG, e, False)
            tick(progress)
    out = {"spec": {k: v for k, v in fields.items() if k != "text"},
           "zero": {"ranks": a.ranks, "node": a.node, "precision": a.zero_precision},
           "load": " ".join(f"{x:.2f}" for x in os.getloadavg()),
           "eval_every": a.eval_every, "eval_note": eval_note,
           "rows": rows, "outliers": outlier_errors()}
    if a.plot:
        plot(rows, a.plot)
    return emit(PROG, a, out, report(out) + (f"\nwrote {a.plot}" if a.plot else ""))


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
