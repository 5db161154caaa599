"""``minipar run STRATEGY -n N``: train a few steps in parallel and show the evidence.

EN parallel training run · RU параллельный запуск обучения · ZH 并行训练运行

A learner runs e.g. ``minipar run zero --stage 2 -n 4`` and sees, at a
glance: the losses next to the serial run's and the verdict (equal, different,
or not comparable and why: :mod:`minipar.parallel.parity`), the bytes each
rank sent next to the paper's formula, and the model-state memory each rank
held next to the formula.

How it works, in three places:

* **the launcher** (this process): :mod:`minipar.run.options` parses and
  checks every option before MPI starts (a bad value: one line, exit 2);
  :func:`main` starts N ranks with :func:`minipar.launch.run_json`;
* **the ranks** run :mod:`minipar.run.worker`: every strategy's engine is built
  by :func:`minipar.parallel.strategies.build` on the strategy's grid, trained by
  :func:`minipar.parallel.loop.train`, and its parameters come from
  ``full_params()`` — the same code for every strategy;
* **the summary**: rank 0 builds it (:mod:`minipar.run.summary`, the keys
  are documented there), the launcher formats it or prints it as JSON.

A strategy is one small module here, named in ``minipar.registry.STRATEGIES``
(:mod:`minipar.run.dp`, :mod:`minipar.run.ps`, :mod:`minipar.run.zero`) with
``add_arguments(parser)``, ``check(options, spec)`` (launcher side, raises
ValueError naming the option), and, rank side, ``grid_sizes(options, spec)``,
``engine_options(options, spec)`` and ``report(engine, grid, options, spec,
history)`` (its own measurements and notes, on rank 0; None elsewhere), and
optionally ``not_comparable(options)``; the technique itself lives in
:mod:`minipar.parallel`.

Exit status: 0, or 1 when the verdict is "different" or the ranks failed
(one line names the rank and the error; ``--debug`` shows every rank's
output), 2 for a bad option.  ``--hostfile FILE`` and the environment
variables ``MINIPAR_MPIEXEC`` / ``MINIPAR_MPIEXEC_ARGS`` take the run to
other machines (:mod:`minipar.launch`).
"""

from __future__ import annotations

import json
import sys

from minipar.run.options import PROG, parse
from minipar.run.summary import SUMMARY_PREFIX, build, format_summary

__all__ = ["PROG", "SUMMARY_PREFIX", "build", "format_summary", "main", "parse"]


def main(argv: list[str]) -> int:
    """``minipar run ARGV``; the exit status."""
    options = parse(argv)
    from minipar import launch

    try:
        summary, proc = launch.run_json(options["ranks"], "minipar.run.worker", options,
                                        check=True, timeout=options["timeout"],
                                        hostfile=options["hostfile"], prefix=SUMMARY_PREFIX)
    except launch.LaunchError as e:  # any failure of the launch
        return launch.report(f"{PROG} {options['strategy']}", e, options["debug"])
    printed = [ln for ln in proc.stdout.splitlines() if not ln.startswith(SUMMARY_PREFIX)]
    if printed:  # whatever the ranks printed besides the summary
        print("\n".join(printed))
    if options.get("trace"):  # the strategy's timeline as Chrome trace events
        from minipar import trace
        from minipar.run.options import strategy_module

        events = strategy_module(options["strategy"]).trace_events(summary)
        trace.write(options["trace"], events, strategy=options["strategy"])
        summary.setdefault("notes", []).append(
            f"trace written to {options['trace']}: open it in https://ui.perfetto.dev")
    print(json.dumps(summary, indent=2) if options["json"] else format_summary(summary))
    if options.get("json_out"):  # its folder was checked before the launch
        try:
            with open(options["json_out"], "w", encoding="utf-8") as f:
                json.dump(summary, f, indent=2)
        except OSError as e:
            print(f"{PROG} {options['strategy']}: cannot write {options['json_out']}: "
                  f"{e.strerror or e}", file=sys.stderr)
            return 1
    return 1 if summary["verdict"]["status"] == "different" else 0
