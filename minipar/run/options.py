"""``minipar run`` options: parsed and checked in the launching process, before MPI starts.

EN option checking · RU проверка параметров · ZH 参数检查

Every value a run needs is checked here, so that a mistake costs a learner one
line and a fraction of a second, not N tracebacks from N ranks:

* argparse with :class:`minipar.cli.options.ArgumentParser` (one line, exit 2)
  and range-checking types (``--timeout 0``, ``--servers 0``, ``--bucket-mb 0``
  are refused while parsing, with the option's name and the allowed values);
* the model and task: :meth:`minipar.parallel.common.RunSpec.from_options`
  raises a ``ValueError`` that names the option (``--heads 3 does not divide
  --d-model 16``), turned into the same one line;
* the strategy's own cross-option checks (``check(options, spec)`` in
  :mod:`minipar.run.dp`, :mod:`~minipar.run.ps`, :mod:`~minipar.run.zero`):
  a global batch too small for the ranks, ``--staleness`` without
  ``--async``, a parameter server with no worker.

Nothing here imports mpi4py: importing ``mpi4py.MPI`` would start MPI in the
launcher.
"""

from __future__ import annotations

import argparse
import importlib
from dataclasses import replace
from pathlib import Path
from types import ModuleType
from typing import Any

from minipar.cli.options import (ArgumentParser, add_fp8_arguments, add_json_options,
                                 check_fp8_options, integer, number, output_file, seconds)
from minipar.registry import PLANNED_STRATEGIES, STRATEGIES

PROG = "minipar run"
DEFAULT_TIMEOUT = 300.0


def strategy_module(name: str) -> ModuleType:
    """The :mod:`minipar.run` module of strategy ``name`` (see ``registry.STRATEGIES``)."""
    return importlib.import_module(STRATEGIES[name][0])


def existing_file(text: str) -> str:
    """An argparse ``type``: a file that exists (``--hostfile``)."""
    path = Path(text)
    if path.is_dir():
        raise argparse.ArgumentTypeError(f"{text} is a folder, not a file")
    if not path.is_file():
        raise argparse.ArgumentTypeError(f"{text}: no such file")
    return text


def parser(strategy: str | None = None) -> ArgumentParser:
    """The parser of ``minipar run STRATEGY``, with that strategy's options when known."""
    from minipar.precision import POLICIES

    epilog = None if strategy in STRATEGIES else (
        "each strategy adds its own options: " + ", ".join(
            f"minipar run {name} --help" for name in sorted(STRATEGIES)))
    p = ArgumentParser(prog=PROG, description="train in parallel and compare with the serial run",
                       epilog=epilog)
    p.add_argument("strategy", choices=sorted(STRATEGIES), help="which technique to run")
    g = p.add_argument_group("the run")
    g.add_argument("-n", "--ranks", type=integer(1), default=4, help="MPI ranks (default 4)")
    g.add_argument("--steps", type=integer(1), default=5, help="training steps (default 5)")
    g.add_argument("--seed", type=integer(0), default=0, help="initialisation seed (default 0)")
    g.add_argument("--precision", choices=list(POLICIES), default="float64",
                   help="float64 (parity), float32, mixed (bf16 + fp32 master), mixed-fp16, "
                   "fp8 (the blocks' GEMMs in FP8; default %(default)s)")
    add_fp8_arguments(g)
    add_json_options(g, "the summary")
    g.add_argument("--timeout", type=seconds, default=DEFAULT_TIMEOUT,
                   help=f"seconds before every rank is killed (default {DEFAULT_TIMEOUT:g})")
    g.add_argument("--hostfile", type=existing_file, default=None,
                   help="hosts to run the ranks on, passed to mpiexec (see MINIPAR_MPIEXEC)")
    g.add_argument("--node", type=integer(1), default=None, metavar="K",
                   help="ranks per node (default: MPI's own, the ranks that share memory); K "
                        "simulates nodes of K consecutive ranks on one machine")
    g.add_argument("--debug", action="store_true",
                   help="on failure, show every rank's output and traceback")
    defaults = {}
    if strategy in STRATEGIES:
        module = strategy_module(strategy)
        module.add_arguments(p)
        defaults = getattr(module, "MODEL_DEFAULTS", {})
        if hasattr(module, "trace_events"):  # a strategy that records a timeline
            g.add_argument("--trace", type=output_file, default=None, metavar="FILE.json",
                           help="write the last step's timeline as Chrome trace events "
                                "(Perfetto, chrome://tracing; default: none)")
    add_model_arguments(p, **defaults)
    add_data_arguments(p)
    add_checkpoint_arguments(p)
    return p


def parse(argv: list[str]) -> dict[str, Any]:
    """Parse and check ``argv``; the options as a dict (JSON-able, sent to every rank).

    A bad value raises ``SystemExit(2)`` after printing one line."""
    strategy = next((a for a in argv if a in STRATEGIES), None)
    p = parser(strategy)
    planned = next((a for a in argv if not a.startswith("-") and a in PLANNED_STRATEGIES), None)
    if strategy is None and planned is not None:
        p.error(f"strategy {planned} ({PLANNED_STRATEGIES[planned]}) is planned, not built "
                f"yet; the strategies built: {', '.join(sorted(STRATEGIES))}")
    options = vars(p.parse_args(argv))
    try:
        check(options)
    except ValueError as e:
        p.error(str(e))
    return options


def check(options: dict[str, Any]) -> Any:
    """Every check that needs no MPI: the model (``RunSpec``), then the strategy's.

    Returns the :class:`~minipar.parallel.common.RunSpec`; raises ValueError
    naming the option."""
    from minipar.parallel.common import RunSpec

    from minipar import checks

    resolve_data_options(options)
    check_fp8_options(options)
    if options.get("node") is not None:
        checks.divides("--node", options["node"], "-n", options["ranks"],
                       "K consecutive ranks share a simulated node")
    spec = RunSpec.from_options(options)
    check_moe_strategy(options, spec)
    strategy_module(options["strategy"]).check(options, spec)
    check_checkpoint_options(options, spec)
    return spec


#: the strategies that keep the loss-free expert bias as state
#: (:mod:`minipar.parallel.expert_bias`)
LOSS_FREE = ("ep", "pp", "hybrid")


def check_moe_strategy(options: dict[str, Any], spec: Any) -> None:
    """DeepSeek-V3's options where the strategy has them: the loss-free bias is state only
    ``ep``, ``pp`` and ``hybrid`` keep; shared experts are not sliced by tensor parallelism."""
    name = options["strategy"]
    if spec.experts and spec.load_balance == "loss-free" and name not in LOSS_FREE:
        raise ValueError(f"--load-balance loss-free: minipar run {name} does not keep the "
                         f"expert bias (state updated after each step); use "
                         f"{', '.join(LOSS_FREE)}, or --load-balance aux|none")
    if spec.experts and spec.shared_experts and (name in ("tp", "sp") or
                                                 (options.get("tp") or 1) > 1):
        raise ValueError(f"--shared-experts {spec.shared_experts} with tensor parallelism: "
                         "the shared experts are not sliced over tp ranks here; use tp = 1")


def add_data_arguments(parser: argparse.ArgumentParser) -> None:
    """The data and optimizer options ``minipar train`` and every ``minipar run`` share."""
    from minipar.parallel.common import EMBEDDED, RunSpec

    d = RunSpec()
    g = parser.add_argument_group("data and optimizer")
    g.add_argument("--text", nargs="?", const=EMBEDDED, default=None, metavar="FILE",
                   help="train on a UTF-8 text, byte by byte (vocabulary 256); without FILE "
                   "the text shipped with minipar (its glossary in English, Russian and "
                   "Chinese, and its docs). Default: the modular-sum task")
    g.add_argument("--data-seed", type=integer(0), default=None,
                   help=f"the seed of the batches (default {d.data_seed})")
    g.add_argument("--betas", type=number(minimum=0, maximum=0.999999), nargs=2, default=None,
                   metavar=("B1", "B2"), help="AdamW's betas (default 0.9 0.999)")
    g.add_argument("--eps", type=number(greater_than=0), default=None,
                   help="AdamW's epsilon (default 1e-8)")
    g.add_argument("--aux-loss-coef", type=number(minimum=0), default=None,
                   help=f"with --experts: the load-balancing loss weight α (default "
                   f"{d.aux_loss_coef:g})")


def add_checkpoint_arguments(parser: argparse.ArgumentParser) -> None:
    """Validation and checkpoints, the same for ``minipar train`` and every strategy."""
    g = parser.add_argument_group("validation and checkpoints")
    g.add_argument("--eval-every", type=integer(0), default=None, metavar="K",
                   help="validation loss every K steps, 0: none (default: none; minipar "
                   "train --text: every tenth of --steps)")
    g.add_argument("--eval-batches", type=integer(1), default=4,
                   help="held-out batches a validation loss averages (default %(default)s)")
    g.add_argument("--save", metavar="DIR", default=None,
                   help="write a checkpoint into DIR every --save-every steps and at the end")
    g.add_argument("--save-every", type=integer(1), default=None, metavar="K",
                   help="with --save: every K steps (default: at the end only)")
    g.add_argument("--keep-last", type=integer(1), default=None, metavar="K",
                   help="with --save: keep only the newest K checkpoints in DIR, removing "
                   "older ones after each save (default: keep every one)")
    g.add_argument("--resume", metavar="DIR", default=None,
                   help="continue from a checkpoint (a step folder, or a root: its latest "
                   "complete one), saved on any layout; --steps is the total")


def resolve_data_options(options: dict[str, Any]) -> None:
    """Fill what follows from other options, in place: the vocabulary of a text run (256
    bytes), absolute paths (the ranks may run elsewhere), betas as a tuple."""
    from minipar.data.tokenizer import VOCAB_SIZE
    from minipar.parallel.common import EMBEDDED

    text = options.get("text")
    if text is not None:
        if options.get("vocab") not in (None, VOCAB_SIZE):
            raise ValueError(f"--vocab is {VOCAB_SIZE} with --text (a token is a byte of "
                             f"UTF-8), got {options['vocab']}")
        options["vocab"] = VOCAB_SIZE
        if text != EMBEDDED:
            options["text"] = str(Path(text).resolve())
    elif options.get("vocab") is None:
        options["vocab"] = options.get("default_vocab")
    for key in ("save", "resume"):
        if options.get(key) is not None:
            options[key] = str(Path(options[key]).resolve())
    if options.get("betas") is not None:
        options["betas"] = tuple(options["betas"])


def check_checkpoint_options(options: dict[str, Any], spec: Any) -> None:
    """Refuse, before any rank starts, a resume that cannot continue this run and a save
    that would overwrite: ValueError (one line) naming the folder.

    ``--resume ROOT`` becomes, in ``options``, the step folder it means now (ROOT's latest
    complete checkpoint), so that every rank and the serial oracle load that one, even
    after this run has saved newer ones into ROOT (``--resume D --save D``)."""
    for key in ("save_every", "keep_last"):
        if options.get(key) is not None and options.get("save") is None:
            raise ValueError(f"--{key.replace('_', '-')} needs --save DIR")
    if options.get("resume") is None and options.get("save") is None:
        return
    from minipar.parallel import checkpoint

    resume = options.get("resume")
    if resume is not None:
        options["resume"] = resume = str(checkpoint.check_resume(resume, spec)[0])
    save = options.get("save")
    if save is not None:
        if Path(save).exists() and not Path(save).is_dir():
            raise ValueError(f"--save {save}: a file, not a folder")
        if not Path(save).parent.is_dir():
            raise ValueError(f"--save {save}: its parent folder does not exist")
        found = checkpoint.latest(save) if Path(save).is_dir() else None
        if found is not None and (resume is None or Path(resume) != found):
            raise ValueError(f"--save {save} already holds a checkpoint ({found.name}); resume "
                             f"from it with --resume {save}, or save into another folder")


def add_model_arguments(parser: argparse.ArgumentParser, **defaults: Any) -> None:
    """The :class:`RunSpec` options for a ``minipar run`` strategy (``--steps``,
    ``--seed`` and ``--precision`` belong to ``minipar run`` itself); ``defaults``
    replace RunSpec's where a strategy needs another model by default (a pipeline
    of 4 stages needs 4 blocks: ``MODEL_DEFAULTS`` of :mod:`minipar.run.pp`)."""
    from minipar.parallel.common import RunSpec

    d = replace(RunSpec(), **defaults)
    g = parser.add_argument_group("model and task")
    g.add_argument("--batch", type=int, default=d.batch, help=f"global batch rows (default {d.batch})")
    g.add_argument("--seq", type=int, default=d.seq, help=f"sequence length T (default {d.seq})")
    g.add_argument("--vocab", type=int, default=None,
                   help=f"vocabulary = modulus V (default {d.vocab}; 256 with --text)")
    parser.set_defaults(default_vocab=d.vocab)  # --vocab's, unless --text makes it 256
    g.add_argument("--d-model", type=int, default=d.d_model,
                   help=f"model width d (default {d.d_model})")
    g.add_argument("--layers", type=int, default=d.layers,
                   help=f"transformer blocks (default {d.layers})")
    g.add_argument("--heads", type=int, default=d.heads,
                   help=f"attention heads, must divide --d-model (default {d.heads})")
    g.add_argument("--kv-heads", type=int, default=d.kv_heads,
                   help="key/value heads of grouped-query attention, must divide --heads "
                   "(default 0: as many as --heads; 1: multi-query)")
    g.add_argument("--lr", type=float, default=d.lr, help=f"learning rate (default {d.lr:g})")
    g.add_argument("--weight-decay", type=float, default=d.weight_decay,
                   help=f"AdamW's decoupled weight decay (default {d.weight_decay:g})")
    g.add_argument("--optimizer", choices=("adamw", "sgd"), default=d.optimizer,
                   help=f"adamw or sgd (default {d.optimizer})")
    g.add_argument("--experts", type=int, default=d.experts,
                   help="experts per block, a mixture of experts (default "
                   + (f"{d.experts})" if d.experts else "0: dense)"))
    g.add_argument("--top-k", type=int, default=d.top_k,
                   help="with --experts: experts per token, 1 (Switch), 2 (GShard), up to "
                   "--experts (DeepSeek-V3: 8); default 1")
    g.add_argument("--capacity-factor", type=capacity_factor, default=d.capacity_factor,
                   help=f"with --experts: expert capacity factor, or none: dropless, no token "
                   f"dropped (default {d.capacity_factor})")
    add_moe_arguments(g, d)


def capacity_factor(text: str) -> float | str:
    """An argparse ``type``: a capacity factor > 0, or ``none`` (dropless)."""
    if text.strip().lower() == "none":
        return "none"
    return number(greater_than=0)(text)


def add_moe_arguments(g: Any, d: Any) -> None:
    """DeepSeek-V3's expert options (:mod:`minipar.nn.moe_routing`), checked by RunSpec."""
    g.add_argument("--shared-experts", type=integer(0), default=None, metavar="S",
                   help="with --experts: S experts every token goes through (default 0)")
    g.add_argument("--expert-width", type=integer(0), default=None, metavar="W",
                   help="with --experts: the experts' hidden width (default 0: 4·d)")
    g.add_argument("--router", choices=("softmax", "sigmoid"), default=None,
                   help="with --experts: the router's scores, softmax (Switch, default) or "
                   "sigmoid (DeepSeek-V3; needs --top-k >= 2)")
    g.add_argument("--load-balance", choices=("aux", "loss-free", "none"), default=None,
                   help="with --experts: aux (the Switch loss, default), loss-free (a bias "
                   "per expert, DeepSeek-V3) or none")
    g.add_argument("--bias-update-rate", type=float, default=None, metavar="U",
                   help=f"with --load-balance loss-free: the bias step u "
                   f"(default {d.bias_update_rate:g})")
    g.add_argument("--seq-aux-loss-coef", type=number(minimum=0), default=None,
                   help="with --experts: DeepSeek-V3's sequence-wise balance loss weight "
                   "(default 0)")
    g.add_argument("--expert-groups", type=int, default=None, metavar="G",
                   help="with --experts: node-limited routing, the experts in G groups "
                   "(default 1)")
    g.add_argument("--groups-per-token", type=int, default=None, metavar="M",
                   help="with --expert-groups: a token's experts in at most M groups "
                   "(default 1)")
