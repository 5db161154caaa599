"""``minipar exercise``: list the exercises, start one, check your solution.

EN exercises command · RU команда упражнений · ZH 练习命令

    minipar exercise list
    minipar exercise start ring_allreduce            # writes ./ring_allreduce.py
    minipar exercise check ring_allreduce ring_allreduce.py -n 4 [--json]
    minipar exercise check ring_allreduce --solution # grade the reference solution

``check`` exits 0 only when every check passes.
"""

from __future__ import annotations

import argparse
import shutil
import sys
from pathlib import Path

from minipar.exercises import EXERCISES, get


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="minipar exercise",
        description="mpirun exercises: write a collective from Send/Recv, graded on real ranks.",
    )
    sub = p.add_subparsers(dest="action", required=True)
    sub.add_parser("list", help="the exercises, with a one-line description and difficulty")
    s = sub.add_parser("start", help="write the skeleton NAME.py into a folder")
    s.add_argument("name", choices=list(EXERCISES))
    s.add_argument("--dir", default=".", help="folder to write into (default: current)")
    s.add_argument("--force", action="store_true", help="overwrite an existing NAME.py")
    c = sub.add_parser("check", help="grade FILE: result and algorithm, on N ranks")
    c.add_argument("name", choices=list(EXERCISES))
    c.add_argument("file", nargs="?", help="your solution (a .py file)")
    c.add_argument("-n", type=int, default=4, help="number of ranks (default 4)")
    c.add_argument("--json", action="store_true", help="machine-readable report")
    c.add_argument("--solution", action="store_true", help="grade the reference solution")
    c.add_argument("--timeout", type=float, default=60.0, help="seconds before the run is killed")
    c.add_argument(
        "--watchdog",
        type=float,
        default=5.0,
        help="seconds a rank may wait for one message before it is a deadlock",
    )
    return p


def main(argv: list[str]) -> int:
    args = _parser().parse_args(argv)
    if args.action == "list":
        width = max(map(len, EXERCISES))
        for ex in EXERCISES.values():
            print(f"{ex.name:<{width}}  {ex.difficulty}  {ex.description}")
        print("\nstart one with: minipar exercise start NAME")
        return 0
    ex = get(args.name)
    if args.action == "start":
        target = Path(args.dir) / f"{ex.name}.py"
        if target.exists() and not args.force:
            print(
                f"minipar exercise: {target} exists; not overwriting it (use --force)",
                file=sys.stderr,
            )
            return 1
        shutil.copyfile(ex.skeleton_path, target)
        print(
            f"wrote {target}: fill in {ex.function}(), then run\n"
            f"  minipar exercise check {ex.name} {target}"
        )
        return 0
    from minipar.exercises.grading import check  # imports numpy and mpi4py

    if args.solution == bool(args.file):
        print("minipar exercise check: give FILE or --solution (one of them)", file=sys.stderr)
        return 2
    file = ex.solution_path if args.solution else Path(args.file)
    if not file.is_file():
        print(f"minipar exercise check: {file}: no such file", file=sys.stderr)
        return 2
    try:
        report = check(ex.name, file, args.n, timeout=args.timeout, watchdog=args.watchdog)
    except ValueError as err:
        print(f"minipar exercise check: {err}", file=sys.stderr)
        return 2
    print(report.json() if args.json else report.text())
    return 0 if report.passed else 1
