"""Serial training loop — последовательный цикл обучения — 串行训练循环 (``minipar train``).

One process, one global batch per step, the data of step s from
``(seed, s)`` (``minipar.data``):

    for s in 0 … steps−1:   loss, g = model.loss_and_grads(θ, batch(s));  θ ← optimizer(θ, g)

The model states (params, grads, optimizer states, fp32 master weights under
mixed precision) live in flat buffers (``minipar.precision.ModelStates``),
the layout every parallel strategy shards.  This loop is the reference
their training curves must reproduce.  Measured here (one core, default
settings: d_model 64, 2 layers, 4 heads, batch 32 x 16, AdamW lr 3e-3,
300 steps): float32 loss 2.317 -> 0.149 in 6.4 s (best possible
ln(10)/16 = 0.144); float64 -> 0.158; MoE top-2 in mixed bf16 -> 0.185;
the MLP on spirals 1.137 -> 0.038 in 0.1 s.  Notebook 02 draws the curves.

Divergence: the verb stops at the first step whose loss is NaN or infinite,
or above ``--diverge`` = 10 x the first step's loss, with one line and exit
status 1 (``minipar train --lr 1``: ``minipar train: diverged at step 3: the
loss 70 exceeds 10 x the first step's 2.317; ...``).  Why 10x: a run that
learns stays below its first loss (about ln V for the GPT, ln 3 for the MLP),
and a noisy one rises by tens of percent, not tenfold (``--lr 0.3`` wanders
from 2.317 to 2.344 in 60 steps and is let run); a loss ten times the
untrained model's means the weights have left the region where the model
predicts anything.  Progress: a tqdm bar on
stderr (:mod:`minipar.progress`), none with ``--quiet``.

    minipar train --model gpt --steps 300           # modular-sum sequences
    minipar train --model mlp --steps 300           # 2-D spirals
    minipar train --model gpt --experts 4 --top-k 2 --precision mixed
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from dataclasses import asdict
from typing import Any, TextIO

from minipar import data, spans
from minipar.nn import GPT, MLP, GPTConfig, MLPConfig
from minipar.precision import ModelStates, get
from minipar.progress import bar as progress_bar

#: ``minipar train`` stops when the loss exceeds this many times the first step's loss
DIVERGENCE_FACTOR = 10.0


class Diverged(RuntimeError):
    """Training diverged: the loss of ``step`` (0-based) is not finite, or exceeds
    ``factor`` x the first step's loss.  The message is one line a learner can act on."""

    def __init__(self, step: int, loss: float, first: float, factor: float) -> None:
        self.step, self.loss, self.first, self.factor = step, loss, first, factor
        why = (f"the loss is {loss} (not a finite number)" if not math.isfinite(loss) else
               f"the loss {loss:.4g} exceeds {factor:g} x the first step's {first:.4g}")
        super().__init__(f"diverged at step {step + 1}: {why}; a smaller learning rate "
                         "usually cures it")


def check_loss(step: int, loss: float, first: float, factor: float | None) -> None:
    """Raise :class:`Diverged` if ``loss`` is NaN or infinite, or above ``factor`` x ``first``
    (no factor: only the non-finite check)."""
    if not math.isfinite(loss) or (factor is not None and loss > factor * first):
        raise Diverged(step, loss, first, factor or 0.0)


def train(
    model: GPT | MLP,
    batch: Any,
    steps: int = 300,
    precision: str = "float64",
    optimizer: str = "adamw",
    seed: int = 0,
    progress: TextIO | bool | None = None,
    micro_batches: int = 1,
    diverge_factor: float | None = None,
    **opt_kwargs: Any,
) -> dict[str, Any]:
    """Train ``model`` for ``steps`` steps on ``batch(step) -> (inputs, targets)``.

    ``model.cfg.dtype`` must match the precision's parameter dtype.
    ``micro_batches`` M > 1: gradient accumulation — each global batch is cut
    into M row slices (the ``numpy.array_split`` rule of :mod:`minipar.spans`),
    each slice's loss and gradients are weighted by its share of the rows and
    summed.  A dense model gives the full-batch result up to rounding; a
    mixture of experts routes each forward call's tokens as one group (its
    capacity and aux loss are per group), so M slices are the serial oracle of
    a data-parallel run on M ranks.
    ``progress``: a stream for a tqdm bar (:func:`minipar.progress.bar`: redrawn on a
    terminal, one line per tenth of the run elsewhere), True for ``tqdm.auto`` (a
    notebook), None for none.  ``diverge_factor`` f: stop with :class:`Diverged` as soon
    as a loss is NaN or infinite or exceeds f x the first step's loss (None: never stop;
    the parallel runs' serial oracle keeps the whole curve, the verdict judges it).
    Returns ``{"losses": [...], "seconds": float, "states": ModelStates}``.
    """
    pol = get(precision)
    if str(model.cfg.dtype) != pol.model_dtype:
        raise ValueError(f"model dtype {model.cfg.dtype} does not match precision "
                         f"{precision!r} (expects {pol.model_dtype})")
    if steps < 1:
        raise ValueError(f"steps must be >= 1, got {steps}")
    if isinstance(micro_batches, bool) or not isinstance(micro_batches, int) or micro_batches < 1:
        raise ValueError(f"micro_batches must be a positive integer, got {micro_batches!r}")
    init = type(model)(type(model.cfg)(**{**asdict(model.cfg), "dtype": "float64"})).init(seed)
    states = ModelStates(pol, init, optimizer, **opt_kwargs)
    views = states.param_views()
    bar = None if progress is None or progress is False else progress_bar(
        steps, "step", None if progress is True else progress, notebook=progress is True)
    losses: list[float] = []
    t0 = time.perf_counter()
    try:
        for s in range(steps):
            loss = _step(model, states, views, batch(s), micro_batches)
            losses.append(loss)
            if bar is not None:
                bar.set_postfix_str(f"loss {loss:.4f}", refresh=False)
                bar.update(1)
            if diverge_factor is not None:
                check_loss(s, loss, losses[0], diverge_factor)
    finally:
        if bar is not None:
            bar.close()
    return {"losses": losses, "seconds": time.perf_counter() - t0, "states": states}


def _step(model: GPT | MLP, states: ModelStates, views: dict[str, Any], xy: Any,
          micro_batches: int) -> float:
    """One optimizer step on the global batch ``xy``; its loss."""
    x, y = xy
    if micro_batches == 1:
        loss, grads = model.loss_and_grads(views, x, y, loss_scale=states.loss_scale)
        states.set_grads(grads)
    else:
        loss = _accumulate(model, states, views, x, y, micro_batches)
    states.step()
    return float(loss)


def _accumulate(model: GPT | MLP, states: ModelStates, views: dict[str, Any], x: Any, y: Any,
                micro_batches: int) -> float:
    """Σ_m (b_m / B) · loss_m, with the gradients of that sum in ``states.grads``."""
    rows = len(x)
    if micro_batches > rows:
        raise ValueError(f"{micro_batches} micro-batches but the batch has only {rows} rows")
    states.grads[...] = 0
    loss = 0.0
    for m in range(micro_batches):
        lo, hi = spans.span(rows, micro_batches, m)
        w = (hi - lo) / rows
        part, grads = model.loss_and_grads(views, x[lo:hi], y[lo:hi],
                                           loss_scale=w * states.loss_scale)
        states.grads += states.layout.flatten(grads, states.grads.dtype)
        loss += w * part
    return loss


def gpt_task(vocab_size: int = 10, seq_len: int = 16, batch_size: int = 32,
             data_seed: int = 0) -> Any:
    """``batch(step)`` of the modular-sum task."""
    return lambda s: data.modular_sum(data_seed, s, batch_size, seq_len, vocab_size)


def mlp_task(batch_size: int = 64, n_classes: int = 3, data_seed: int = 0,
             dtype: str = "float64") -> Any:
    """``batch(step)`` of the spirals task."""
    return lambda s: data.spirals(data_seed, s, batch_size, n_classes, dtype=dtype)


#: GPT-only and MLP-only options -> their defaults (None in the parser, so that an
#: option given to the other model is refused instead of silently ignored)
GPT_OPTIONS = {"vocab": 10, "seq": 16, "d_model": 64, "layers": 2, "heads": 4, "experts": 0,
               "top_k": 1}
MLP_OPTIONS = {"hidden": 64}


def _parser() -> argparse.ArgumentParser:
    from minipar.cli_errors import ArgumentParser, integer, number, output_file

    p = ArgumentParser(prog="minipar train", description=__doc__.split("\n\n")[0])
    p.add_argument("--model", choices=("gpt", "mlp"), default="gpt",
                   help="gpt: a small GPT on modular-sum sequences; mlp: an MLP on 2-D "
                   "spirals (default %(default)s)")
    p.add_argument("--steps", type=integer(1), default=300,
                   help="optimizer steps (default %(default)s)")
    p.add_argument("--batch", type=integer(1), default=32,
                   help="global batch size, sequences or points (default %(default)s)")
    p.add_argument("--lr", type=number(greater_than=0), default=3e-3,
                   help="learning rate, > 0 (default %(default)s)")
    p.add_argument("--optimizer", choices=("adamw", "sgd"), default="adamw",
                   help="AdamW (weight decay 0 here) or plain SGD (default %(default)s)")
    p.add_argument("--precision", choices=("float64", "float32", "mixed", "mixed-fp16"),
                   default="float32",
                   help="float64, float32, mixed (bf16 + fp32 master weights) or mixed-fp16 "
                   "(fp16 with loss scaling); default %(default)s")
    p.add_argument("--seed", type=integer(0), default=0,
                   help="initialisation seed; the data seed is always 0 (default %(default)s)")
    p.add_argument("--diverge", type=number(greater_than=1), default=DIVERGENCE_FACTOR,
                   help="stop (exit 1) when the loss is NaN or infinite or exceeds this many "
                   "times the first step's loss (default %(default)s)")
    g = GPT_OPTIONS
    p.add_argument("--vocab", type=integer(2),
                   help=f"GPT: vocabulary = modulus V (default {g['vocab']})")
    p.add_argument("--seq", type=integer(2), help=f"GPT: sequence length T (default {g['seq']})")
    p.add_argument("--d-model", type=integer(1), help=f"GPT: width (default {g['d_model']})")
    p.add_argument("--layers", type=integer(1), help=f"GPT: blocks (default {g['layers']})")
    p.add_argument("--heads", type=integer(1),
                   help=f"GPT: attention heads, must divide --d-model (default {g['heads']})")
    p.add_argument("--experts", type=integer(0),
                   help="GPT: experts per MoE block (default 0: dense)")
    p.add_argument("--top-k", type=int, choices=(1, 2),
                   help="GPT with --experts: experts per token, 1 (Switch) or 2 (GShard); "
                   "default 1")
    p.add_argument("--hidden", type=integer(1),
                   help=f"MLP: hidden width (default {MLP_OPTIONS['hidden']})")
    p.add_argument("--json", metavar="PATH", type=output_file,
                   help="write the loss curve as JSON (into a folder that exists)")
    p.add_argument("--quiet", action="store_true", help="no progress bar")
    return p


def _check_options(p: argparse.ArgumentParser, a: argparse.Namespace) -> None:
    """Checks across options, before any model is built: ``p.error`` (one line, exit 2)."""
    own, other = (GPT_OPTIONS, MLP_OPTIONS) if a.model == "gpt" else (MLP_OPTIONS, GPT_OPTIONS)
    stray = [f"--{k.replace('_', '-')}" for k in other if getattr(a, k) is not None]
    if stray:
        p.error(f"{', '.join(stray)} only appl{'ies' if len(stray) == 1 else 'y'} to "
                f"--model {'mlp' if a.model == 'gpt' else 'gpt'}, not --model {a.model}")
    if a.model == "gpt" and a.top_k is not None and not a.experts:
        p.error("--top-k only applies to a mixture of experts: give --experts E (E >= 1) too")
    for k, v in own.items():
        if getattr(a, k) is None:
            setattr(a, k, v)
    if a.model == "gpt":
        if a.d_model % a.heads:
            divisors = [h for h in range(1, a.d_model + 1) if a.d_model % h == 0]
            shown = ", ".join(map(str, divisors[:12])) + (", ..." if len(divisors) > 12 else "")
            p.error(f"--heads {a.heads} does not divide --d-model {a.d_model} (each head takes "
                    f"d_model / heads columns); --heads must be one of {shown}")
        if a.experts and a.top_k > a.experts:
            p.error(f"--top-k {a.top_k} exceeds --experts {a.experts}: "
                    f"--top-k must be 1{' or 2' if a.experts >= 2 else ''}")
    _check_memory(p, a)


def _check_memory(p: argparse.ArgumentParser, a: argparse.Namespace) -> None:
    """Refuse a model whose parameters, gradients and optimizer states alone exceed the RAM."""
    import os

    from minipar.plan import gpt_param_count

    if a.model == "gpt":
        n = gpt_param_count(a.layers, a.d_model, a.vocab, a.seq, n_experts=a.experts)
        sizes = "--d-model, --layers, --vocab or --experts"
    else:
        n = (2 + 1) * a.hidden + (a.hidden + 1) * a.hidden + (a.hidden + 1) * 3  # (w, b) per layer
        sizes = "--hidden"
    pol = get(a.precision)
    per_param = 2 * pol.param_dtype.itemsize + (pol.master_dtype.itemsize if pol.master_dtype
                                                else 0)
    per_param += 2 * pol.state_dtype.itemsize if a.optimizer == "adamw" else 0
    try:
        ram = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (AttributeError, ValueError, OSError):
        return
    if n * per_param > ram:
        p.error(f"{n:.3g} parameters need at least {n * per_param / 1e9:,.0f} GB for parameters, "
                f"gradients and optimizer states ({per_param} bytes each), more than this "
                f"machine's {ram / 1e9:.1f} GB; use a smaller {sizes}")


def main(argv: list[str]) -> int:
    """``minipar train``: 0 after training; 1 (one line on stderr) when the loss is NaN or
    diverges (:class:`Diverged`, ``--diverge``); 2 (one line) on bad input."""
    p = _parser()
    try:
        a = p.parse_args(argv)
        _check_options(p, a)
    except SystemExit as e:  # --help (0), or a bad option: one line already printed (2)
        return int(e.code or 0)
    dtype = get(a.precision).model_dtype
    try:
        if a.model == "gpt":
            model: GPT | MLP = GPT(GPTConfig(
                vocab_size=a.vocab, block_size=a.seq, n_layer=a.layers, n_head=a.heads,
                d_model=a.d_model, n_experts=a.experts, top_k=a.top_k, dtype=dtype))
            batch = gpt_task(a.vocab, a.seq, a.batch)
            floor = f", best possible {data.modular_sum_best_loss(a.seq, a.vocab):.4f}"
        else:
            model = MLP(MLPConfig(sizes=(2, a.hidden, a.hidden, 3), dtype=dtype))
            batch, floor = mlp_task(a.batch, dtype=dtype), ""
        extra = {"weight_decay": 0.0} if a.optimizer == "adamw" else {}
        out = train(model, batch, a.steps, a.precision, a.optimizer, a.seed,
                    None if a.quiet else sys.stderr, diverge_factor=a.diverge, lr=a.lr, **extra)
    except Diverged as e:  # the run, not the input, went wrong: one line, exit 1
        default = _parser().get_default("lr")
        print(f"minipar train: {e} (this run: --lr {a.lr:g}; the default is {default:g})",
              file=sys.stderr)
        return 1
    except ValueError as e:
        print(f"minipar train: {e}", file=sys.stderr)
        return 2
    except MemoryError:
        smaller = "--batch or --hidden" if a.model == "mlp" else "--batch, --seq or model"
        print(f"minipar train: out of memory; use a smaller {smaller}", file=sys.stderr)
        return 1
    losses = out["losses"]
    print(f"{a.model}: {model.n_params()} parameters, {a.precision}, {a.steps} steps in "
          f"{out['seconds']:.1f} s; loss {losses[0]:.4f} -> {losses[-1]:.4f}{floor}")
    if a.json:
        try:
            with open(a.json, "w", encoding="utf-8") as f:
                json.dump({"args": vars(a), "losses": losses, "seconds": out["seconds"]}, f)
        except OSError as e:
            print(f"minipar train: cannot write {a.json}: {e.strerror or e}", file=sys.stderr)
            return 1
    return 0
