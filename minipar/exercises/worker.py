"""Rank side of ``minipar exercise check``: run the learner's function, measure it.

EN grading worker · RU исполнитель проверки · ZH 评分工作进程

Started on every rank by :func:`minipar.exercises.grading.check` as
``python -m mpi4py -m minipar.exercises.worker NAME FILE OUTDIR``.  For each
case of the exercise's grader (same list on every rank) it

1. builds this rank's input (``grader.make_input``) and keeps a copy;
2. calls the learner's function with a fresh :class:`GradingComm` over a
   ``Dup`` of COMM_WORLD (a private channel per case: a stray message of one
   case cannot be received by the next), inside ``comm.operation(NAME)``;
3. computes the expected result with MPI's own collective (``grader.oracle``)
   on the pristine copy of the input, and records on this rank: the first
   mismatch, whether the input was modified, the array contract, bytes and
   peers sent and received, and calls to MPI's collectives.

When the result is wrong, the rank also names the mistake if it can
(:mod:`minipar.exercises.diagnosis`: the grader's ``parts`` for a sum, or its
own ``diagnose``).  The records reach rank 0 with MPI's own ``gather`` only
at the end, after every case completed.

What the learner's code prints (stdout and stderr, from importing the file
to the last case) goes, line by line, to ``OUTDIR/output-RANK.txt``, so the
report can show it by rank even when the run is killed; a mark line before
each case's first output (:class:`CaseOutput`) ties every line to its case.
Stack dumps are taken only while the rank is stopped, never by a timer
thread reading a running interpreter's frames (``faulthandler``'s repeating
``dump_traceback_later`` did that without the GIL, and a learner printing
thousands of lines made it crash the rank with SIGSEGV):

* on SIGTERM (the launcher stopping ranks that ran past the launch timeout)
  ``faulthandler`` writes the rank's Python stack to ``OUTDIR/stack-RANK.txt``
  from the signal handler, before the rank ends;
* at the grading deadline (``timeout`` seconds after this rank started the
  learner's code, so a slow start on a loaded machine does not count) a timer
  thread that holds the GIL -- the learner's code is paused -- writes every
  thread's stack to ``OUTDIR/stack-RANK.txt`` and marks ``deadline-RANK.txt``;
  once every rank has marked its deadline or ``done-RANK.txt`` (its cases
  all returned), or one more ``timeout`` passed, the rank exits, which ends
  the job: the line an endless loop was on;
* a rank whose learner code raised (a ``DeadlockError`` from the watchdog
  included) first sends SIGUSR1 to every other rank (their ids are in
  ``OUTDIR/pid-RANK.txt``) and waits until each has written its stack to
  ``OUTDIR/running-RANK.txt`` (``faulthandler.register``: the dump runs in the
  signal handler, while that rank is stopped), at most
  :data:`STACKS_WAIT_S`; only then does the job end in ``MPI_Abort``, which
  kills every rank with a signal no handler sees: the line a rank that never
  reached the exchange was running.

If the learner's code raises on any rank (a ``DeadlockError`` from
the watchdog included) that rank writes ``OUTDIR/error-RANK.json`` (rank,
exception, the learner's line) and re-raises: ``python -m mpi4py`` then
aborts the whole job, so no rank waits for ever. Rank 0 writes
``OUTDIR/result.json`` on success.
"""

from __future__ import annotations

import contextlib
import faulthandler
import importlib.util
import io
import json
import os
import signal
import sys
import threading
import time
import traceback
from collections.abc import Callable
from pathlib import Path
from types import ModuleType
from typing import Any

import numpy as np
from mpi4py import MPI

from minipar.exercises import diagnosis, get
from minipar.exercises.grading import DEADLINE_ENV, GradingComm, first_mismatch
from minipar.exercises.report import CASE_MARK, IMPORT_CASE


def load_function(file: Path, name: str) -> Callable[..., Any]:
    """Import the learner's file and return its function ``name``."""
    spec = importlib.util.spec_from_file_location(f"_learner_{file.stem}", file)
    if spec is None or spec.loader is None:
        raise ImportError(f"cannot import {file}")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    fn = getattr(module, name, None)
    if fn is None:
        raise ImportError(f"{file.name} defines no function {name}(comm, x, ...)")
    return fn


def run_case(
    grader: ModuleType, name: str, fn: Callable[..., Any], raw: MPI.Comm, case: dict,
    last: dict | None = None,
) -> dict:
    """Call the learner's function on one case; return what this rank measured.

    ``last`` receives the receive posted last (for a "Message truncated" error)."""
    rank, size = raw.Get_rank(), raw.Get_size()
    x, kwargs = grader.make_input(case, rank, size)
    pristine = x.copy()
    sub = raw.Dup()
    comm = GradingComm(sub, last=last)
    with comm.operation(name):
        out = fn(comm, x, **kwargs)
    expected, atol = grader.oracle(raw, case, pristine)
    st = comm.stats
    rec: dict[str, Any] = {
        "bytes_sent": st.bytes_sent(),
        "bytes_recv": st.bytes_recv(),
        "msgs_sent": st.msgs_sent(),
        "msgs_recv": st.msgs_recv(),
        "peers_sent": sorted(st.peers_sent().items()),
        "peers_recv": sorted(st.peers_recv().items()),
        "calls": dict(comm.calls),
        "touched": x.tobytes() != pristine.tobytes(),
        "contract": None,
        "mismatch": None,
        "mistake": None,
    }
    sub.Free()
    if not isinstance(out, np.ndarray):
        rec["contract"] = f"returned {type(out).__name__}, not a numpy array"
    elif out.shape != expected.shape or out.dtype != expected.dtype:
        rec["contract"] = (
            f"returned shape {out.shape} {out.dtype}, "
            f"expected shape {expected.shape} {expected.dtype}"
        )
    elif out.size and np.shares_memory(out, x):
        rec["contract"] = "returned the input array itself (or a view of it), not a new array"
    else:
        rec["mismatch"] = first_mismatch(out, expected, atol)
    if rec["mismatch"]:
        rec["mistake"] = mistake(grader, case, rank, size, pristine, out, expected, atol)
    return rec


def mistake(grader: ModuleType, case: dict, rank: int, size: int, x: np.ndarray,
            out: np.ndarray, expected: np.ndarray, atol: np.ndarray | None) -> str | None:
    """The learner's mistake in a sentence (local: no message is sent), or None."""
    if hasattr(grader, "diagnose"):
        said = grader.diagnose(case, rank, size, x, out, expected)
        if said:
            return said
    if hasattr(grader, "parts"):
        return diagnosis.sum_mistake(out, expected, grader.parts(case, size), atol)
    return None


def learner_line(exc: BaseException, file: Path) -> tuple[int | None, str | None]:
    """The deepest line of the learner's file in the exception's traceback."""
    if isinstance(exc, SyntaxError) and exc.filename and Path(exc.filename).resolve() == file:
        return exc.lineno, (exc.text or "").strip()
    for frame in reversed(traceback.extract_tb(exc.__traceback__)):
        if Path(frame.filename).resolve() == file:
            return frame.lineno, (frame.line or "").strip()
    return None, None


class CaseOutput(io.TextIOBase):
    """The learner's stdout and stderr, with a mark line before each case's first output.

    ``case`` is set before each case; the first write after a change starts
    with :data:`~minipar.exercises.report.CASE_MARK` and the case's label on a
    line of their own, so the report can say in which case each line was
    printed (:meth:`minipar.exercises.report.Report.output_text`)."""

    def __init__(self, file: Any):
        self.file, self.case, self._said, self._at_start = file, None, None, True

    def writable(self) -> bool:
        return True

    def write(self, text: str) -> int:
        if text and self.case != self._said:
            head = "" if self._at_start else "\n"
            self.file.write(f"{head}{CASE_MARK}{self.case}\n")
            self._said = self.case
        if text:
            self.file.write(text)
            self._at_start = text.endswith("\n")
        return len(text)

    def flush(self) -> None:
        self.file.flush()


def write_json(path: Path, data: Any) -> None:
    """Write atomically: an abort from another rank never leaves half a file."""
    tmp = path.with_suffix(f".tmp{os.getpid()}")
    tmp.write_text(json.dumps(data))
    os.replace(tmp, path)


#: the signal a failing rank sends the others: "write your stack now"
STACK_SIGNAL = signal.SIGUSR1
#: most seconds a failing rank waits for the other ranks' stacks before the job ends
STACKS_WAIT_S = 5.0
#: exit status of a rank stopped at the grading deadline
DEADLINE_EXIT = 124


def wait_for_files(paths: list[Path | list[Path]], seconds: float) -> bool:
    """Wait until every path exists and is not empty (True), at most ``seconds`` (False).

    An entry that is a list is satisfied by any one of its paths."""
    end = time.monotonic() + seconds
    while True:
        if all(any(p.exists() and p.stat().st_size > 0 for p in ([e] if isinstance(e, Path) else e))
               for e in paths):
            return True
        if time.monotonic() >= end:
            return False
        time.sleep(0.01)


def ask_for_stacks(out: Path, rank: int, size: int) -> None:
    """SIGUSR1 to every other rank that is ready for it; wait for their ``running-R.txt``."""
    asked = []
    for r in range(size):
        pid_file = out / f"pid-{r}.txt"
        if r == rank or not pid_file.exists():
            continue  # a rank still starting has no learner line to show yet
        try:
            os.kill(int(pid_file.read_text()), STACK_SIGNAL)
        except (OSError, ValueError):
            continue  # already gone
        asked.append(out / f"running-{r}.txt")
    wait_for_files(asked, STACKS_WAIT_S)


def deadline_timer(seconds: float, out: Path, rank: int, size: int,
                   stack: Any) -> threading.Timer:
    """A started timer that stops this rank ``seconds`` from now (see the module's notes)."""

    def stop() -> None:
        # a Python thread holds the GIL here: the learner's code is paused, its frames still
        faulthandler.dump_traceback(file=stack, all_threads=True)
        stack.flush()
        (out / f"deadline-{rank}.txt").write_text(f"{seconds:g}\n")
        # every rank at its deadline too, or done with the learner's code
        wait_for_files([[out / f"deadline-{r}.txt", out / f"done-{r}.txt"] for r in range(size)],
                       seconds)
        os._exit(DEADLINE_EXIT)

    timer = threading.Timer(seconds, stop)
    timer.daemon = True
    timer.start()
    return timer


def main(argv: list[str]) -> int:
    name, file_arg, outdir = argv
    file, out = Path(file_arg).resolve(), Path(outdir)
    ex = get(name)
    grader = ex.grader()
    raw = MPI.COMM_WORLD
    rank, size = raw.Get_rank(), raw.Get_size()
    cases = grader.cases(size)
    stage, label, current = "import", None, None
    records: list[dict] = []
    last: dict = {}
    stack = (out / f"stack-{rank}.txt").open("w")  # kept open: faulthandler writes from C
    faulthandler.register(signal.SIGTERM, file=stack, all_threads=True, chain=True)
    running = (out / f"running-{rank}.txt").open("w")
    faulthandler.register(STACK_SIGNAL, file=running, all_threads=True)
    (out / f"pid-{rank}.txt").write_text(str(os.getpid()))  # after the handler: safe to signal
    printed = (out / f"output-{rank}.txt").open("w", buffering=1, errors="replace")
    learner = CaseOutput(printed)
    learner.case = IMPORT_CASE
    timer = deadline_timer(float(os.environ[DEADLINE_ENV]), out, rank, size, stack)
    try:
        with contextlib.redirect_stdout(learner), contextlib.redirect_stderr(learner):
            fn = load_function(file, ex.function)
            stage = "call"
            for case in cases:
                label, current = grader.label(case), case
                learner.case = label
                records.append(run_case(grader, ex.function, fn, raw, case, last))
    except BaseException as exc:
        timer.cancel()
        printed.flush()  # a last line without its newline too: the job ends in MPI_Abort
        line, code = learner_line(exc, file)
        write_json(
            out / f"error-{rank}.json",
            {
                "rank": rank,
                "stage": stage,
                "case": label,
                "type": type(exc).__name__,
                "message": str(exc),
                "line": line,
                "code": code,
                "case_data": current,
                "recv": dict(last) or None,
            },
        )
        ask_for_stacks(out, rank, size)  # before the abort kills them
        raise  # python -m mpi4py turns this into MPI_Abort: the whole job ends
    timer.cancel()  # the learner's code is done on this rank
    (out / f"done-{rank}.txt").write_text("every case returned\n")
    printed.close()
    # the answer key: minipar's own collectives (nothing on the grader's side imports it)
    borrowed = raw.gather("minipar.collectives" in sys.modules, root=0)
    gathered = raw.gather(records, root=0)
    if rank == 0:
        write_json(
            out / "result.json", {"cases": cases, "records": gathered, "borrowed": any(borrowed)}
        )
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
