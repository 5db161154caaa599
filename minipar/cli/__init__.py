"""The ``minipar`` command: the verb table's :func:`main` (``python -m minipar.cli``, too).

Every verb lives in its own module, imported only when that verb runs, so
``minipar glossary ...`` starts without NumPy or mpi4py.  A verb module
exposes ``main(argv: list[str]) -> int`` and builds its own argparse parser
with ``prog="minipar VERB"`` (:class:`minipar.cli.options.ArgumentParser`).  The verbs' front ends are this package's
modules (:mod:`minipar.cli.plan`, ...); ``bench``, ``run`` and ``exercise``
have their own packages.

To add a verb: add one row to ``minipar.registry.VERBS``; nothing else changes here.

Errors are one line (:mod:`minipar.cli.options`): a bad option exits 2 with
``minipar VERB: --option …``; Ctrl-C exits 130 with ``minipar: interrupted``
and no traceback, SIGTERM (``kill``, ``timeout``, a scheduler) exits 143 with
``minipar: terminated``, SIGHUP (a closed terminal) 129 with ``minipar: hung up``
(:func:`minipar.cli.options.sigterm_as_interrupt`); in every case a multi-rank launch stops every rank and removes its files first
(see :func:`minipar.launch.run`).  ``main`` returns the exit status of the verb,
so it can be called in-process: it is the one place where argparse's
``SystemExit`` (``--help``: 0, a bad option: 2, its line already printed) becomes
that status, for every verb — no verb catches it (``minipar run``, ``exercise``
and each ``minipar bench WHAT`` included; ``python -m minipar.run`` comes here too).
"""

from __future__ import annotations

import importlib
import os
import signal
import sys

from minipar.cli.options import (
    EXIT_INTERRUPTED,
    EXIT_USAGE,
    Terminated,
    sigterm_as_interrupt,
)
from minipar.host_memory import keep_freed_memory
from minipar.registry import VERBS


def _usage() -> str:
    width = max(len(v) for v in VERBS)
    lines = [
        "usage: minipar VERB [options]   (minipar VERB --help for a verb's options)",
        "",
        "minipar: large-model training parallelism, built from scratch on NumPy and MPI.",
        "",
        "verbs:",
    ]
    lines += [f"  {verb:<{width}}  {help_}" for verb, (_, help_) in VERBS.items()]
    return "\n".join(lines)


def _status(code: object) -> int:
    """The exit status ``sys.exit(code)`` would give (None: 0; text: printed, 1)."""
    if code is None or isinstance(code, int):
        return int(code or 0)
    print(code, file=sys.stderr)
    return 1


def _backend_problem() -> str | None:
    """Why the array backend ``MINIPAR_BACKEND`` names cannot load (None when it loads):
    said in one line before anything starts, rather than as a traceback from every rank.
    NumPy, the default, is not tried here: the verbs that need no arrays (``glossary``)
    stay light, and ``doctor`` reports a backend that cannot load among the rest."""
    if os.environ.get("MINIPAR_BACKEND", "").strip().lower() in ("", "numpy"):
        return None
    try:
        importlib.import_module("minipar.backend")
    except (RuntimeError, ValueError) as e:
        return str(e)
    return None


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] in ("-h", "--help", "help"):
        print(_usage())
        return 0 if argv else EXIT_USAGE
    if argv[0] == "--version":
        from minipar import __version__

        print(f"minipar {__version__}")
        return 0
    verb, rest = argv[0], argv[1:]
    if verb not in VERBS:
        print(f"minipar: unknown verb {verb!r}; one of {', '.join(VERBS)} "
              "(minipar --help describes them)", file=sys.stderr)
        return EXIT_USAGE
    why = None if verb in ("doctor", "glossary") else _backend_problem()
    if why:
        print(f"minipar {verb}: {why}", file=sys.stderr)
        return EXIT_USAGE
    keep_freed_memory()  # every step reuses the memory of the last (minipar.host_memory)
    try:
        with sigterm_as_interrupt():  # SIGTERM unwinds like Ctrl-C: launches stop their ranks
            module = importlib.import_module(VERBS[verb][0])
            return int(module.main(rest) or 0)
    except SystemExit as e:  # argparse: --help (0) or a one-line usage error (2)
        return _status(e.code)
    except KeyboardInterrupt as e:  # Ctrl-C, or SIGTERM / SIGHUP (Terminated)
        if not isinstance(e, Terminated):
            why, status = "interrupted", EXIT_INTERRUPTED
        else:
            why = "hung up" if e.signum == getattr(signal, "SIGHUP", None) else "terminated"
            status = e.exit_status
        try:  # after SIGHUP the terminal may be gone: writing to it fails (EIO)
            if sys.stderr.isatty():  # end the line ^C (or a progress bar) left open
                sys.stderr.write("\n")
            print(f"minipar: {why}", file=sys.stderr)
        except (OSError, ValueError):
            pass
        return status
    except BrokenPipeError:  # `minipar plan ... | head`: the reader has all it wanted
        _silence_stdout()
        return 0


def _silence_stdout() -> None:
    """Point stdout at /dev/null so the interpreter's final flush does not fail again."""
    import os

    try:
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
    except (OSError, ValueError, AttributeError):  # not a real file (captured in tests)
        pass
