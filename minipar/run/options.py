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

from minipar.cli.options import ArgumentParser, integer, output_file, seconds
from minipar.registry import PLANNED_STRATEGIES, STRATEGIES

PROG = "minipar run"
DEFAULT_TIMEOUT = 300.0


def strategy_module(name: str) -> ModuleType:
    """The :mod:`minipar.run` module of strategy ``name`` (see ``registry.STRATEGIES``)."""
    return importlib.import_module(STRATEGIES[name][0])


def existing_file(text: str) -> str:
    """An argparse ``type``: a file that exists (``--hostfile``)."""
    if not Path(text).is_file():
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
                   help="float64 (parity), float32, mixed (bf16 + fp32 master), mixed-fp16 "
                   "(default %(default)s)")
    g.add_argument("--json", action="store_true", help="print the summary as JSON")
    g.add_argument("--timeout", type=seconds, default=DEFAULT_TIMEOUT,
                   help=f"seconds before every rank is killed (default {DEFAULT_TIMEOUT:g})")
    g.add_argument("--hostfile", type=existing_file, default=None,
                   help="hosts to run the ranks on, passed to mpiexec (see MINIPAR_MPIEXEC)")
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

    spec = RunSpec.from_options(options)
    strategy_module(options["strategy"]).check(options, spec)
    return spec


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
    g.add_argument("--vocab", type=int, default=d.vocab, help=f"vocabulary = modulus V (default {d.vocab})")
    g.add_argument("--d-model", type=int, default=d.d_model,
                   help=f"model width d (default {d.d_model})")
    g.add_argument("--layers", type=int, default=d.layers,
                   help=f"transformer blocks (default {d.layers})")
    g.add_argument("--heads", type=int, default=d.heads,
                   help=f"attention heads, must divide --d-model (default {d.heads})")
    g.add_argument("--lr", type=float, default=d.lr, help=f"learning rate (default {d.lr:g})")
    g.add_argument("--weight-decay", type=float, default=d.weight_decay,
                   help=f"AdamW's decoupled weight decay (default {d.weight_decay:g})")
    g.add_argument("--optimizer", choices=("adamw", "sgd"), default=d.optimizer,
                   help=f"adamw or sgd (default {d.optimizer})")
    g.add_argument("--experts", type=int, default=d.experts,
                   help="experts per block, a mixture of experts (default 0: dense)")
    g.add_argument("--top-k", type=int, default=d.top_k,
                   help="with --experts: experts per token, 1 (Switch) or 2 (GShard); default 1")
    g.add_argument("--capacity-factor", type=float, default=d.capacity_factor,
                   help=f"with --experts: expert capacity factor (default {d.capacity_factor})")
