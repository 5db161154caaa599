"""Serial training loop — последовательный цикл обучения — 串行训练循环 (``minipar train``).

The verb of :mod:`minipar.train`: it builds the small GPT (modular-sum
sequences) or the MLP (2-D spirals) from its options, refuses options that do
not fit before any model is built (one line, exit 2), trains with
:func:`minipar.parallel.loop.train` — the one loop of every engine — on the
serial engine (:class:`minipar.parallel.engine.SerialEngine`) and prints one line (``--json``: the run as JSON; ``--json-out FILE``: the loss curve
into a file).

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
import os
import sys

from minipar.cli.options import (ArgumentParser, add_fp8_arguments, add_json_options,
                                 check_fp8_options, integer, number, output_file)
from minipar.data import synthetic
from minipar.data.tokenizer import VOCAB_SIZE
from minipar.nn import MLP, MLPConfig
from minipar.parallel import loop
from minipar.parallel.common import RunSpec
from minipar.parallel.engine import Batch, SerialEngine
from minipar.plan import gpt_param_count
from minipar.precision import get
from minipar.run.options import (
    add_checkpoint_arguments,
    add_data_arguments,
    check_checkpoint_options,
    resolve_data_options,
)
from minipar.train import Diverged, mlp_task

#: ``minipar train`` stops when the loss exceeds this many times the first step's loss
DIVERGENCE_FACTOR = 10.0

#: GPT-only and MLP-only options -> their defaults (None in the parser, so that an
#: option given to the other model is refused instead of silently ignored)
GPT_OPTIONS = {"vocab": 10, "seq": 16, "d_model": 64, "layers": 2, "heads": 4, "kv_heads": 0,
               "experts": 0, "top_k": 1, "text": None, "data_seed": 0, "aux_loss_coef": None,
               "save": None, "save_every": None, "keep_last": None, "resume": None}
#: with --text: a context of 64 bytes (nanoGPT's CPU setting) unless --seq says otherwise
TEXT_SEQ = 64
MLP_OPTIONS = {"hidden": 64}


def _parser() -> argparse.ArgumentParser:
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
                   help="AdamW or plain SGD (default %(default)s)")
    p.add_argument("--weight-decay", type=number(minimum=0), default=0.0,
                   help="AdamW's decoupled weight decay (default %(default)s; minipar run's is "
                   "0.01: give it to continue a run's checkpoint the same way)")
    p.add_argument("--precision", choices=("float64", "float32", "mixed", "mixed-fp16", "fp8"),
                   default="float32",
                   help="float64, float32, mixed (bf16 + fp32 master weights), mixed-fp16 "
                   "(fp16 with loss scaling) or fp8 (GPT: the blocks' GEMMs in FP8, fp32 "
                   "master weights); default %(default)s")
    add_fp8_arguments(p)
    p.add_argument("--seed", type=integer(0), default=0,
                   help="initialisation seed (default %(default)s)")
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
    p.add_argument("--kv-heads", type=integer(0),
                   help="GPT: key/value heads (grouped-query attention), must divide --heads "
                   "(default 0: as many as --heads; 1: multi-query)")
    p.add_argument("--experts", type=integer(0),
                   help="GPT: experts per MoE block (default 0: dense)")
    p.add_argument("--top-k", type=int, choices=(1, 2),
                   help="GPT with --experts: experts per token, 1 (Switch) or 2 (GShard); "
                   "default 1")
    p.add_argument("--hidden", type=integer(1),
                   help=f"MLP: hidden width (default {MLP_OPTIONS['hidden']})")
    add_data_arguments(p)
    add_checkpoint_arguments(p)
    add_json_options(p, "the run's record (its options, losses, validation, speed)")
    p.add_argument("--plot", metavar="FILE.png", type=output_file,
                   help="draw the training and validation loss into a PNG")
    p.add_argument("--quiet", action="store_true", help="no progress bar")
    return p


def _check_options(p: argparse.ArgumentParser, a: argparse.Namespace) -> None:
    """Checks across options, before any model is built: ``p.error`` (one line, exit 2)."""
    own, other = (GPT_OPTIONS, MLP_OPTIONS) if a.model == "gpt" else (MLP_OPTIONS, GPT_OPTIONS)
    stray = [f"--{k.replace('_', '-')}" for k in other if getattr(a, k) is not None]
    if stray:
        p.error(f"{', '.join(stray)} only appl{'ies' if len(stray) == 1 else 'y'} to "
                f"--model {'mlp' if a.model == 'gpt' else 'gpt'}, not --model {a.model}")
    try:
        check_fp8_options(vars(a))
    except ValueError as e:
        p.error(str(e))
    if a.model == "mlp" and a.precision == "fp8":
        p.error("--precision fp8 serves --model gpt (the FP8 GEMMs are a transformer block's "
                "linear layers); the MLP trains in float64, float32, mixed or mixed-fp16")
    if a.model == "gpt" and a.top_k is not None and not a.experts:
        p.error("--top-k only applies to a mixture of experts: give --experts E (E >= 1) too")
    if a.model == "gpt" and a.text is not None:
        a.seq = TEXT_SEQ if a.seq is None else a.seq
        a.vocab = VOCAB_SIZE if a.vocab is None else a.vocab
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
    if a.model == "gpt":
        options = vars(a)
        try:
            resolve_data_options(options)
            a.spec = _spec(a)
            check_checkpoint_options(options, a.spec)
        except ValueError as e:  # RunSpec's and the checkpoint's one-line reasons
            p.error(str(e))
        if a.text is not None and a.eval_every is None:  # --eval-every 0: none
            a.eval_every = max(1, a.steps // 10)


def _spec(a: argparse.Namespace) -> RunSpec:
    """The run of ``--model gpt`` as the :class:`RunSpec` every engine takes."""
    extra = {k: getattr(a, k) for k in ("aux_loss_coef", "betas", "eps")
             if getattr(a, k) is not None}
    return RunSpec(vocab=a.vocab, seq=a.seq, d_model=a.d_model, layers=a.layers, heads=a.heads,
                   kv_heads=a.kv_heads, batch=a.batch, steps=a.steps, seed=a.seed, data_seed=a.data_seed, lr=a.lr,
                   weight_decay=a.weight_decay, optimizer=a.optimizer, precision=a.precision,
                   **{k: getattr(a, k) for k in ("fp8_scaling", "fp8_block")
                      if getattr(a, k) is not None},
                   experts=a.experts, top_k=a.top_k, text=a.text, **extra)


def _check_memory(p: argparse.ArgumentParser, a: argparse.Namespace) -> None:
    """Refuse a model whose parameters, gradients and optimizer states alone exceed the RAM."""
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
    a = p.parse_args(argv)
    _check_options(p, a)
    progress = None if a.quiet else sys.stderr
    try:
        if a.model == "gpt":
            spec: RunSpec = a.spec
            model = spec.model()
            engine = SerialEngine(model, spec.precision, spec.optimizer, spec.seed,
                                  **spec.opt_kwargs())
            out = loop.fit(engine, spec, save_dir=a.save, save_every=a.save_every or 0,
                           keep_last=a.keep_last or 0,
                           resume=a.resume, eval_every=a.eval_every or 0,
                           eval_batches=a.eval_batches,
                           progress=progress, diverge_factor=a.diverge)
            if spec.text is not None:
                floor, floor_label = spec.text_data().unigram_entropy(), "unigram entropy"
            else:
                floor = synthetic.modular_sum_best_loss(a.seq, a.vocab)
                floor_label = "best possible"
        else:
            if a.eval_every:
                p.error("--eval-every applies to --model gpt (a held-out split of its data)")
            dtype = get(a.precision).model_dtype
            model = MLP(MLPConfig(sizes=(2, a.hidden, a.hidden, 3), dtype=dtype))
            batch, floor, floor_label = mlp_task(a.batch, dtype=dtype), None, ""
            extra = {"weight_decay": a.weight_decay} if a.optimizer == "adamw" else {}
            extra.update({k: getattr(a, k) for k in ("betas", "eps")
                          if getattr(a, k) is not None and a.optimizer == "adamw"})
            engine = SerialEngine(model, a.precision, a.optimizer, a.seed, lr=a.lr, **extra)
            out = loop.train(engine, lambda s: Batch(s, *batch(s)), a.steps, progress=progress,
                             diverge_factor=a.diverge)
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
    losses = out.losses
    trained = f"steps {out.start + 1}-{a.steps}" if out.start else f"{a.steps} steps"
    took = f"{out.seconds:.1f}" if out.seconds >= 1 else f"{out.seconds:.2f}"  # not "0.0 s"
    line = (f"{a.model}: {model.n_params()} parameters, {a.precision}, {trained} in "
            f"{took} s ({out.tokens_per_second:,.0f} tokens/s); loss {losses[0]:.4f} "
            f"-> {losses[-1]:.4f}")
    if out.validation:
        last = max(out.validation)
        line += f"; validation {out.validation[last]:.4f} after step {last}"
    if floor is not None:
        line += f" ({floor_label} {floor:.4f})"
    if a.save:
        line += (f"\ncheckpoints in {a.save} (minipar checkpoint info {a.save}; minipar sample "
                 f"{a.save})" if a.text is not None else f"\ncheckpoints in {a.save}")
    if a.plot:
        from minipar.viz.model import train_and_validation

        fig = train_and_validation(losses, out.validation, out.start, floor, floor_label)
        try:
            fig.savefig(a.plot, dpi=120)
        except OSError as e:
            print(f"minipar train: cannot write {a.plot}: {e.strerror or e}", file=sys.stderr)
            return 1
    args = {k: v for k, v in vars(a).items() if k != "spec"}
    record = {"args": args, "start": out.start, "losses": losses, "seconds": out.seconds,
              "tokens_per_second": out.tokens_per_second,
              "validation": {str(k): v for k, v in out.validation.items()}}
    record["precision"] = a.precision
    if a.precision == "fp8":  # what it ran: the recipe, in the record and one line
        from minipar.nn.gpt import param_shapes
        from minipar.precision import fp8_recipe

        record.update(fp8_recipe(a.spec.fp8_scaling, a.spec.fp8_block, sum(
            k.startswith("blocks.") and ".w_" in k for k in param_shapes(model.cfg))))
        line += "\n" + record["fp8_recipe"]
    if a.model == "gpt" and a.text is not None:
        record["text"] = a.spec.text_data().as_dict()
        record["unigram_entropy"] = floor
    print(json.dumps(record) if a.json else line)
    if a.json_out:
        try:
            with open(a.json_out, "w", encoding="utf-8") as f:
                json.dump(record, f)
        except OSError as e:
            print(f"minipar train: cannot write {a.json_out}: {e.strerror or e}",
                  file=sys.stderr)
            return 1
    return 0
