"""``minipar bench WHAT``: benchmarks, measured side by side in one run.

Speed and memory targets live here, never as timed assertions in tests: the
machine is shared and noisy, so a benchmark reports *ratios* of things
measured in the same run (our ring vs MPI's Allreduce, our model vs PyTorch).
Each benchmark is a module with ``main(argv) -> int``; its options are
checked before anything is measured, one line and exit 2 on a bad one
(:mod:`minipar.cli.options`).
"""

from __future__ import annotations

import importlib
import json
import sys
from typing import Any

from minipar.cli.options import EXIT_USAGE
from minipar.registry import BENCHES


def main(argv: list[str]) -> int:
    if not argv or argv[0] in ("-h", "--help"):
        width = max(map(len, BENCHES))
        print("usage: minipar bench WHAT [options]\n\nbenchmarks:")
        for name, (_, help_) in BENCHES.items():
            print(f"  {name:<{width}}  {help_}")
        return 0 if argv else EXIT_USAGE
    name = argv[0]
    if name not in BENCHES:
        print(f"minipar bench: unknown benchmark {name!r}; one of {', '.join(BENCHES)}",
              file=sys.stderr)
        return EXIT_USAGE
    return int(importlib.import_module(BENCHES[name][0]).main(argv[1:]) or 0)


def emit(prog: str, args: Any, data: Any, text: str) -> int:
    """A benchmark's result: ``text`` (or, with ``--json``, ``data`` as JSON) on stdout,
    and ``data`` into ``--json-out FILE`` (:func:`minipar.cli.options.add_json_options`);
    the exit status of :func:`write_json`."""
    print(json.dumps(data, indent=1) if args.json else text)
    return write_json(prog, args.json_out, data)


def write_json(prog: str, path: str | None, data: Any) -> int:
    """``--json-out FILE``: write ``data`` there; the exit status (1, with one line naming
    the file, when it cannot be written; 0 otherwise)."""
    if not path:
        return 0
    try:
        with open(path, "w", encoding="utf-8") as f:
            json.dump(data, f, indent=1)
    except OSError as e:
        print(f"{prog}: cannot write {path}: {e.strerror or e}", file=sys.stderr)
        return 1
    return 0
