"""The ``minipar`` command.

Every verb lives in its own module, imported only when that verb runs, so
``minipar glossary ...`` starts without NumPy or mpi4py.  A verb module
exposes ``main(argv: list[str]) -> int`` and builds its own argparse parser
with ``prog="minipar VERB"``.

To add a verb: add one row to ``minipar.registry.VERBS``; nothing else changes here.
"""

from __future__ import annotations

import importlib
import sys

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


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] in ("-h", "--help", "help"):
        print(_usage())
        return 0 if argv else 2
    if argv[0] == "--version":
        from minipar import __version__

        print(f"minipar {__version__}")
        return 0
    verb, rest = argv[0], argv[1:]
    if verb not in VERBS:
        print(f"minipar: unknown verb {verb!r}\n\n{_usage()}", file=sys.stderr)
        return 2
    module = importlib.import_module(VERBS[verb][0])
    return int(module.main(rest) or 0)


if __name__ == "__main__":
    sys.exit(main())
