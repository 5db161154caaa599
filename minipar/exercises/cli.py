"""``minipar exercise``: list the exercises, start one, check your solution.

EN exercises command · RU команда упражнений · ZH 练习命令

    minipar exercise list
    minipar exercise start ring_allreduce            # writes ./ring_allreduce.py
    minipar exercise start ring_allreduce --dir ex   # creates ./ex if needed, says so
    minipar exercise check ring_allreduce ring_allreduce.py -n 4 [--json]
    minipar exercise check ring_allreduce --solution # grade the reference solution
    minipar exercise hint ring_allreduce             # the next hint: level 1, 2, 3 ...
    minipar exercise check ring_allreduce ring_allreduce.py --verbose  # your prints too

While ``check`` waits for the ranks it says so on stderr (how many ranks,
the timeout and the watchdog).  What your code prints is shown, by rank,
when a check fails, and always with ``--verbose``.  ``hint`` remembers the
level reached per exercise in ``DIR/.minipar-hints.json``
(:mod:`minipar.exercises.hints`).

``check`` exits 0 only when every check passes.  Bad input (an unknown
exercise, a FILE that is not there, ``-n 0``, ``--watchdog`` not below
``--timeout``) is one line on stderr and exit 2 (:mod:`minipar.cli.options`).
``--dir`` names a working folder, so ``start`` creates it (and its parents)
when it does not exist and says so; minipar never creates a folder for a
file option.
"""

from __future__ import annotations

import argparse
import shutil
import sys
from pathlib import Path

from minipar.cli.options import ArgumentParser, error_line, integer, seconds
from minipar.exercises import EXERCISES, get, hints

#: most ranks ``check`` starts on one machine (each rank is a Python process)
MAX_RANKS = 128


def _parser() -> argparse.ArgumentParser:
    p = ArgumentParser(
        prog="minipar exercise",
        description="mpirun exercises: write a collective from Send/Recv, graded on real ranks.",
    )
    sub = p.add_subparsers(dest="action", required=True, metavar="ACTION")
    sub.add_parser("list", help="the exercises, with a one-line description and difficulty")
    names = ", ".join(EXERCISES)
    s = sub.add_parser("start", help="write the skeleton NAME.py into a folder")
    s.add_argument("name", metavar="NAME", choices=list(EXERCISES), help=f"one of {names}")
    s.add_argument("--dir", default=".",
                   help="folder to write into, created if missing (default: %(default)s, the "
                        "current folder)")
    s.add_argument("--force", action="store_true",
                   help="overwrite an existing NAME.py (default: off, never overwrite)")
    h = sub.add_parser("hint", help="the next hint for NAME: level 1, 2, 3 ... (remembered)")
    h.add_argument("name", metavar="NAME", choices=list(EXERCISES), help=f"one of {names}")
    h.add_argument("--dir", default=".",
                   help=f"the exercise's working folder, where {hints.STATE_FILE} remembers "
                        "the level reached (default: %(default)s)")
    h.add_argument("--reset", action="store_true",
                   help="start again from level 1 (default: off)")
    c = sub.add_parser("check", help="grade FILE: result and algorithm, on N ranks")
    c.add_argument("name", metavar="NAME", choices=list(EXERCISES), help=f"one of {names}")
    c.add_argument("file", nargs="?", help="your solution (a .py file; no default: give FILE "
                                           "or --solution)")
    c.add_argument("-n", type=integer(1, MAX_RANKS), default=None,
                   help=f"number of ranks, 1 to {MAX_RANKS} (default: the exercise's, 4 for "
                   "most; 1 where each rank's arithmetic is all there is to check)")
    c.add_argument("--json", action="store_true",
                   help="machine-readable report (default: off, a report for people)")
    c.add_argument("--solution", action="store_true",
                   help="grade the reference solution (default: off)")
    c.add_argument("--verbose", "-v", action="store_true",
                   help="show what your code printed on each rank even when every check passes "
                        "(default: off, shown only when a check fails)")
    c.add_argument("--timeout", type=seconds, default=60.0,
                   help="seconds your code may run on each rank before the run is stopped, "
                        "counted from its start on that rank (starting MPI is not counted) "
                        "(default: %(default)g)")
    c.add_argument(
        "--watchdog",
        type=seconds,
        default=5.0,
        help="seconds a rank may wait for one message before it is a deadlock, below "
             "--timeout (default: %(default)g)",
    )
    return p


def _start_folder(folder: Path) -> str | None:
    """Create ``folder`` (and parents) if it is missing; why it cannot hold a file, or None."""
    if folder.is_dir():
        return None
    if folder.exists():
        return f"--dir {folder} is a file, not a folder"
    try:
        folder.mkdir(parents=True)
    except OSError as e:
        return f"--dir {folder}: cannot create the folder: {e.strerror or e}"
    print(f"created folder {folder}")
    return None


def main(argv: list[str]) -> int:
    """``minipar exercise list|start|check``: 0 on success, 1 if a check fails, 2 on bad input."""
    args = _parser().parse_args(argv)
    if args.action == "list":
        width = max(map(len, EXERCISES))
        for ex in EXERCISES.values():
            print(f"{ex.name:<{width}}  {ex.difficulty}  {ex.description}")
        print("\nstart one with: minipar exercise start NAME")
        return 0
    ex = get(args.name)
    if args.action == "hint":
        return _hint(ex.name, Path(args.dir), args.reset)
    if args.action == "start":
        target = Path(args.dir) / f"{ex.name}.py"
        if target.is_dir():
            return error_line("minipar exercise start", f"{target} is a folder; remove it or "
                              "choose another --dir")
        if target.exists() and not args.force:  # a usage error like the others: exit 2
            return error_line("minipar exercise start",
                              f"{target} exists; not overwriting it (use --force)")
        problem = _start_folder(Path(args.dir))
        if problem:
            return error_line("minipar exercise start", problem)
        try:
            shutil.copyfile(ex.skeleton_path, target)
        except OSError as e:
            return error_line("minipar exercise start", f"cannot write {target}: {e.strerror or e}")
        print(
            f"wrote {target}: fill in {ex.to_fill_in}, then run\n"
            f"  minipar exercise check {ex.name} {target}"
            + (f" -n {ex.ranks}" if ex.ranks != 4 else "")
        )
        return 0
    prog = "minipar exercise check"
    if args.solution == bool(args.file):
        return error_line(prog, "give FILE or --solution (one of them)")
    file = ex.solution_path if args.solution else Path(args.file)
    if file.is_dir():
        return error_line(prog, f"FILE {file} is a folder; give your solution's .py file")
    if not file.is_file():
        return error_line(prog, f"FILE {file}: no such file (minipar exercise start "
                          f"{ex.name} writes one)")
    args.n = ex.ranks if args.n is None else args.n
    if args.n < ex.min_ranks:
        return error_line(prog, f"-n {args.n}: {ex.name} needs at least {ex.min_ranks} ranks "
                          f"({ex.why_min_ranks})")
    if not args.watchdog < args.timeout:
        return error_line(prog, f"--watchdog {args.watchdog:g} must be below --timeout "
                          f"{args.timeout:g} (a deadlock is reported before the run is killed)")
    from minipar import launch
    from minipar.exercises.grading import check  # imports numpy and mpi4py

    print(f"running {file.name} on {args.n} rank{'s' if args.n != 1 else ''}, timeout "
          f"{args.timeout:g} s (a rank waiting {args.watchdog:g} s for one message is a "
          "deadlock) …", file=sys.stderr, flush=True)
    try:
        report = check(ex.name, file, args.n, timeout=args.timeout, watchdog=args.watchdog)
    except ValueError as err:
        return error_line(prog, err)
    except launch.LaunchError as err:  # e.g. MINIPAR_MPIEXEC names no program: one line
        return launch.report(prog, err)
    print(report.json() if args.json else report.text(verbose=args.verbose))
    return 0 if report.passed else 1


def _hint(name: str, folder: Path, reset: bool) -> int:
    """``minipar exercise hint NAME``: print the next level, or forget the levels given."""
    prog = "minipar exercise hint"
    if not folder.is_dir():
        return error_line(prog, f"--dir {folder}: no such folder")
    levels = get(name).hints()
    try:
        if reset:
            hints.reset(folder, name)
            print(f"hints for {name} start again from level 1 of {len(levels)}")
            return 0
        level, text = hints.next_hint(folder, name, levels)
    except OSError as e:
        return error_line(prog, f"cannot write {folder / hints.STATE_FILE}: {e.strerror or e}")
    print(f"hint {level} of {len(levels)} for {name}:\n")
    print(text.strip("\n"))
    if level < len(levels):
        print(f"\n(again for hint {level + 1}: minipar exercise hint {name})")
    else:
        print("\n(that was the last hint; --reset starts again from level 1)")
    return 0
