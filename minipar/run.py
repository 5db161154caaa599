"""``minipar run STRATEGY -n N``: train a few steps in parallel and show the evidence.

A learner runs e.g. ``minipar run zero --stage 2 -n 4`` and sees, at a
glance: the losses next to the serial run's (parity), the bytes each rank
sent next to the paper's formula, and the model-state memory each rank held
next to the formula.

How it works: this process launches N ranks (:func:`minipar.launch.run`)
running ``python -m minipar.run --worker STRATEGY OPTIONS_JSON``; each rank
imports the strategy's module and calls its ``run_worker(options)``.  Rank 0
returns a summary dict, printed as one ``MINIPAR_SUMMARY {json}`` line that
this process parses and formats (or prints as JSON with ``--json``).

A strategy module provides:

* ``run_worker(options: dict) -> dict | None`` — the summary on rank 0
  (``None`` elsewhere); ``options`` holds the parsed command-line options;
* optionally ``add_run_arguments(parser)`` to add its own options.

The summary's keys (required ones first):

=============================  ==============================================
``strategy``, ``ranks``,        what ran
``steps``
``losses``, ``serial_losses``   per step, parallel and serial
``parity``, ``max_param_diff``  final parameters equal to the serial run's?
``bytes_sent_per_rank``         list over ranks: bytes sent per step (counted)
``bytes_formula``,              the paper's figure per rank per step, and its
``bytes_formula_text``          formula as text
``model_state_bytes_per_rank``  list over ranks: bytes of params+grads+optimizer
``model_state_formula``,        the paper's figure and its formula as text
``model_state_formula_text``
``parity_expected``             False when the run cannot equal the serial one
                                (asynchronous updates); default True
``notes``                       list of extra lines to print
=============================  ==============================================
"""

from __future__ import annotations

import argparse
import importlib
import json
import sys
from typing import Any

from minipar.registry import STRATEGIES
SUMMARY_PREFIX = "MINIPAR_SUMMARY "
WORKER_FLAG = "--worker"


def _parser(strategy: str | None) -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="minipar run", description=__doc__.split("\n\n")[0])
    p.add_argument("strategy", choices=sorted(STRATEGIES), help="which technique to run")
    p.add_argument("-n", "--ranks", type=int, default=4, help="number of MPI ranks (default 4)")
    p.add_argument("--steps", type=int, default=5, help="training steps (default 5)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--precision", default="float64",
                   help="float64 (parity), float32, mixed (bf16 + fp32 master), mixed-fp16")
    p.add_argument("--json", action="store_true", help="print the summary as JSON")
    p.add_argument("--timeout", type=float, default=300.0, help="seconds before all ranks are killed")
    if strategy in STRATEGIES:
        module = importlib.import_module(STRATEGIES[strategy][0])
        if hasattr(module, "add_run_arguments"):
            module.add_run_arguments(p)
    return p


def format_summary(s: dict[str, Any]) -> str:
    """The summary as a few lines a learner reads at a glance."""
    lines = [f"minipar run {s['strategy']}: {s['ranks']} ranks, {s['steps']} steps"]
    lines.append(f"{'step':>4}  {'loss (parallel)':>16}  {'loss (serial)':>16}")
    for i, (a, b) in enumerate(zip(s["losses"], s["serial_losses"])):
        lines.append(f"{i:>4}  {a:>16.10f}  {b:>16.10f}")
    verdict = "equal to the serial run" if s["parity"] else "DIFFERENT from the serial run"
    lines.append(f"final parameters: {verdict} (max |diff| = {s['max_param_diff']:.3g})")
    if "bytes_sent_per_rank" in s:
        sent = ", ".join(f"{b:,.0f}" for b in s["bytes_sent_per_rank"])
        lines.append(f"bytes sent per rank per step (counted): {sent}")
        if "bytes_formula" in s:
            lines.append(f"  formula {s.get('bytes_formula_text', '')} = {s['bytes_formula']:,.0f}")
    if "model_state_bytes_per_rank" in s:
        held = ", ".join(f"{b:,.0f}" for b in s["model_state_bytes_per_rank"])
        lines.append(f"model-state bytes held per rank (measured): {held}")
        if "model_state_formula" in s:
            lines.append(f"  formula {s.get('model_state_formula_text', '')} = "
                         f"{s['model_state_formula']:,.0f}")
    lines += list(s.get("notes", []))
    return "\n".join(lines)


def main(argv: list[str]) -> int:
    strategy = next((a for a in argv if a in STRATEGIES), None)
    args = _parser(strategy).parse_args(argv)
    if args.ranks < 1 or args.steps < 1:
        print("minipar run: --ranks and --steps must be >= 1", file=sys.stderr)
        return 2
    from minipar import launch

    options = vars(args)
    proc = launch.run(args.ranks, "minipar.run", WORKER_FLAG, json.dumps(options),
                      timeout=args.timeout)
    summary = None
    for line in proc.stdout.splitlines():
        if line.startswith(SUMMARY_PREFIX):
            summary = json.loads(line[len(SUMMARY_PREFIX):])
        else:
            print(line)
    if proc.returncode != 0 or summary is None:
        sys.stderr.write(proc.stderr)
        print(f"minipar run {args.strategy}: the ranks failed (exit {proc.returncode})",
              file=sys.stderr)
        return proc.returncode or 1
    print(json.dumps(summary, indent=2) if args.json else format_summary(summary))
    # parity is the claim under float64, unless the strategy says the run cannot equal
    # the serial one (e.g. an asynchronous parameter server with staleness > 0)
    claimed = args.precision == "float64" and summary.get("parity_expected", True)
    return 1 if claimed and not summary["parity"] else 0


def _worker(options: dict[str, Any]) -> int:
    module = importlib.import_module(STRATEGIES[options["strategy"]][0])
    summary = module.run_worker(options)
    if summary is not None:
        print(SUMMARY_PREFIX + json.dumps(summary), flush=True)
    return 0


if __name__ == "__main__":
    if len(sys.argv) == 3 and sys.argv[1] == WORKER_FLAG:
        sys.exit(_worker(json.loads(sys.argv[2])))
    sys.exit(main(sys.argv[1:]))
