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
On SIGTERM (the launcher stopping ranks that ran past the timeout)
``faulthandler`` writes the rank's Python stack to ``OUTDIR/stack-RANK.txt``
before the rank ends: the line an endless loop was on. The job aborted by
another rank's watchdog (``MPI_Abort``) ends this rank with a signal no
handler sees, so a timer (``faulthandler.dump_traceback_later``, a C thread)
also writes the stack to ``OUTDIR/running-RANK.txt`` several times per
watchdog period: the line a rank that never reached the exchange was
running. If the learner's code raises on any rank (a ``DeadlockError`` from
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
import traceback
from collections.abc import Callable
from pathlib import Path
from types import ModuleType
from typing import Any

import numpy as np
from mpi4py import MPI

from minipar.comm.waiting import DEFAULT_WATCHDOG_S, WATCHDOG_ENV
from minipar.exercises import diagnosis, get
from minipar.exercises.grading import GradingComm, first_mismatch
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


def dump_period() -> float:
    """Seconds between two stack dumps: well below the watchdog (at most 1 s).

    The ranks waiting for a rank that never came abort the job one watchdog
    period after they started waiting; the last dump before that shows where
    the missing rank was (:func:`minipar.exercises.diagnosis.last_dump`)."""
    try:
        watchdog = float(os.environ.get(WATCHDOG_ENV, DEFAULT_WATCHDOG_S))
    except ValueError:
        watchdog = DEFAULT_WATCHDOG_S
    return max(0.05, min(1.0, watchdog / 3))


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
    # MPI_Abort (another rank's watchdog) kills this rank without a signal it can catch:
    # so its stack is also written every PERIOD s, from a C thread that needs no GIL
    running = (out / f"running-{rank}.txt").open("w")
    faulthandler.dump_traceback_later(dump_period(), repeat=True, file=running)
    printed = (out / f"output-{rank}.txt").open("w", buffering=1, errors="replace")
    learner = CaseOutput(printed)
    learner.case = IMPORT_CASE
    try:
        with contextlib.redirect_stdout(learner), contextlib.redirect_stderr(learner):
            fn = load_function(file, ex.function)
            stage = "call"
            for case in cases:
                label, current = grader.label(case), case
                learner.case = label
                records.append(run_case(grader, ex.function, fn, raw, case, last))
    except BaseException as exc:
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
        raise  # python -m mpi4py turns this into MPI_Abort: the whole job ends
    faulthandler.cancel_dump_traceback_later()
    running.write(f"{diagnosis.DUMP_HEADER}every case returned)!\n")  # out of the learner's code
    running.flush()
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
