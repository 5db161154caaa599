"""Grading an exercise: run the learner's file on N ranks, judge result and algorithm.

EN automatic grading · RU автоматическая проверка · ZH 自动评分

``check(name, file, n)`` launches ``python -m mpi4py -m minipar.exercises.worker``
on ``n`` ranks (through :func:`minipar.launch.run`, the one launcher) and
turns what comes back into a :class:`Report` of ✓/✗ :class:`Check` lines:

* **result** -- compared, case by case, with MPI's own collective (the
  oracle): integer-valued inputs exactly, random floats within the rounding
  bound of a sum of N terms in any order, ``|got - expected| <= N·eps·Σ|x_r|``
  (Higham 2002, "Accuracy and Stability of Numerical Algorithms", §4.2:
  each of the two sums is within (N-1)·u·Σ|x_r| of the exact one, u = eps/2);
* **contract** -- a new array of the input's shape and dtype, input untouched;
* **algorithm** -- measured by :class:`GradingComm`, a
  :class:`~minipar.comm.traced.TracedComm` that also records every call to
  MPI's own collectives (and to the uncounted pickle-based ``send``/``recv``),
  which the plain wrapper would pass through unseen.  Each exercise's
  ``grader.judge`` compares bytes and peers per rank with the algorithm's
  formula.

Failures of the run itself are reported in words a learner can act on: an
exception names the rank and the line of the learner's file; a deadlock is
caught by the traced communicator's watchdog (``MINIPAR_WATCHDOG_S``, a few
seconds here) or, for waits it cannot see, by the grading deadline
(``timeout`` s from the start of the learner's code on each rank; the launch
timeout adds :data:`STARTUP_S` and only stops what the deadline cannot);
``NotImplementedError`` says where to start (and that ``minipar exercise
hint`` gives more).  :mod:`minipar.exercises.diagnosis` names the rest: a
wrong result's pattern (1/N, N x, a partial sum, a rotated chunk order), MPI's
"Message truncated" error as chunk sizes, and, when the ranks run past the
timeout, the line each was on when stopped (an endless loop, or a wait on a
raw communicator).  What the learner's code printed comes back by rank in
:attr:`Report.output` (:mod:`minipar.exercises.report`).
"""

from __future__ import annotations

import json
import tempfile
from collections import Counter
from pathlib import Path
from typing import Any

import numpy as np

from minipar import launch
from minipar.comm.traced import ANY_SOURCE, ANY_TAG, TracedComm
from minipar.comm.waiting import WATCHDOG_ENV
from minipar.exercises import diagnosis, get
from minipar.exercises.report import Check, Report

__all__ = ["Check", "GradingComm", "Report", "check", "first_mismatch"]

WORKER = "minipar.exercises.worker"
DEFAULT_TIMEOUT_S = 60.0
DEFAULT_WATCHDOG_S = 5.0
#: the worker's grading deadline, seconds from the start of the learner's code on a rank
DEADLINE_ENV = "MINIPAR_EXERCISE_DEADLINE"
#: what the launch timeout allows on top of ``timeout`` for starting MPI and importing
#: (on a loaded machine, seconds): the deadline the worker keeps is ``timeout`` itself,
#: counted from the learner's code; the launch timeout only stops what it cannot
STARTUP_S = 60.0

#: MPI's own collectives, buffer and pickle forms, blocking and not: the oracle, not the answer
COLLECTIVES = frozenset(
    """Allreduce allreduce Iallreduce Reduce reduce Ireduce Reduce_local Bcast bcast Ibcast
    Gather gather Igather Gatherv Igatherv Allgather allgather Iallgather Allgatherv Iallgatherv
    Scatter scatter Iscatter Scatterv Iscatterv Alltoall alltoall Ialltoall Alltoallv Ialltoallv
    Alltoallw Ialltoallw Reduce_scatter Ireduce_scatter Reduce_scatter_block
    Ireduce_scatter_block Scan scan Iscan Exscan exscan Iexscan Neighbor_allgather
    Neighbor_alltoall neighbor_allgather neighbor_alltoall""".split()  # noqa: SIM905
)
#: point-to-point calls that move data the traced communicator does not count
UNCOUNTED = frozenset(
    """send recv sendrecv isend irecv ssend issend bsend ibsend Ssend Issend Bsend Ibsend
    Rsend Irsend Send_init Recv_init Ssend_init Bsend_init Rsend_init Sendrecv_replace
    Mrecv mrecv Put Get Accumulate""".split()  # noqa: SIM905
)


class GradingComm(TracedComm):
    """A TracedComm that also counts calls to MPI's collectives and uncounted sends.

    ``calls`` maps a method name (``"Allreduce"``, ``"bcast"``, ``"send"``)
    to how many times this rank called it.  The call still goes through to
    MPI, so the learner's result can be right while the algorithm is not.  Each of
    :data:`COLLECTIVES` and :data:`UNCOUNTED` is a method of its own (:func:`_spied`),
    not a ``__getattr__``: what the learner may call is listed, not guessed.
    """

    def __init__(self, comm: Any = None, *, calls: Counter[str] | None = None,
                 last: dict | None = None, **kw: Any):
        super().__init__(comm, **kw)
        self.calls: Counter[str] = Counter() if calls is None else calls
        #: the receive posted last (``source``, ``nbytes``, ``itemsize``): what a
        #: "Message truncated" error is about (:func:`minipar.exercises.diagnosis.truncation`)
        self.last: dict = {} if last is None else last

    def _posted(self, buf: Any, source: int) -> None:
        self.last.clear()
        self.last.update(source=source, nbytes=getattr(buf, "nbytes", None),
                         itemsize=getattr(buf, "itemsize", None))

    def Irecv(self, buf: Any, source: int = ANY_SOURCE, tag: int = ANY_TAG) -> Any:
        self._posted(buf, source)
        return super().Irecv(buf, source, tag)

    def Sendrecv(self, sendbuf: Any, dest: int, sendtag: int = 0, recvbuf: Any = None,
                 source: int = ANY_SOURCE, recvtag: int = ANY_TAG) -> Any:
        self._posted(recvbuf, source)  # TracedComm.Sendrecv posts its receive on MPI directly
        return super().Sendrecv(sendbuf, dest, sendtag, recvbuf, source, recvtag)

    def Split(self, color: int = 0, key: int = 0) -> GradingComm:
        return GradingComm(self.comm.Split(color, key), timeout=self.timeout, stats=self.stats,
                           calls=self.calls, last=self.last)

    def Dup(self) -> GradingComm:
        return GradingComm(self.comm.Dup(), timeout=self.timeout, stats=self.stats,
                           calls=self.calls, last=self.last)


def _spied(name: str) -> Any:
    """``GradingComm.<name>``: count the call, then pass it to MPI unchanged."""
    def call(self: GradingComm, *args: Any, **kwargs: Any) -> Any:
        self.calls[name] += 1
        return getattr(self.comm, name)(*args, **kwargs)

    call.__name__ = call.__qualname__ = name
    return call


for _name in sorted(COLLECTIVES | UNCOUNTED):
    setattr(GradingComm, _name, _spied(_name))


# -- comparing arrays (rank side) ------------------------------------------------
def first_mismatch(got: np.ndarray, expected: np.ndarray, atol: np.ndarray | None) -> dict | None:
    """The first index where ``got`` differs from ``expected`` (exactly, or by > atol)."""
    g, e = got.reshape(-1), expected.reshape(-1)
    if atol is None:
        bad = np.flatnonzero(g != e)
    else:
        diff = np.abs(g.astype(np.float64) - e.astype(np.float64))
        bad = np.flatnonzero(~(diff <= atol.reshape(-1)))  # NaN counts as wrong
    if bad.size == 0:
        return None
    i = int(bad[0])
    return {"index": i, "expected": e[i].item(), "got": g[i].item(), "wrong": int(bad.size)}


# -- the launcher side -------------------------------------------------------------
def check(
    name: str,
    file: str | Path,
    n: int = 4,
    *,
    timeout: float = DEFAULT_TIMEOUT_S,
    watchdog: float = DEFAULT_WATCHDOG_S,
) -> Report:
    """Grade ``file`` for exercise ``name`` on ``n`` ranks (never hangs: ``timeout`` s)."""
    ex = get(name)
    path = Path(file).resolve()
    if not path.is_file():
        raise ValueError(f"{file}: no such file")
    if not isinstance(n, int) or n < 1:
        raise ValueError(f"number of ranks must be a positive integer, got {n!r}")
    if n < ex.min_ranks:
        raise ValueError(f"{ex.name} needs at least {ex.min_ranks} ranks ({ex.why_min_ranks}); "
                         f"got -n {n}")
    if watchdog <= 0 or timeout <= watchdog:
        raise ValueError(f"need 0 < watchdog ({watchdog}) < timeout ({timeout})")
    report = Report(ex.name, str(file), n)
    with tempfile.TemporaryDirectory(prefix="minipar-exercise-") as out:
        try:
            proc = launch.run(n, WORKER, ex.name, str(path), out, timeout=timeout + STARTUP_S,
                              env={WATCHDOG_ENV: f"{watchdog:g}", DEADLINE_ENV: f"{timeout!r}"})
        except launch.LaunchTimeout as err:
            report.take_output(_outputs(out))
            report.checks.append(_timeout_check(path, out, timeout, err.stdout + err.stderr))
            return report
        report.take_output(_outputs(out))
        if any(Path(out).glob("deadline-*.txt")):  # the worker stopped its ranks at the deadline
            report.checks.append(_timeout_check(path, out, timeout,
                                                (proc.stdout or "") + (proc.stderr or "")))
            return report
        errors = [json.loads(p.read_text()) for p in sorted(Path(out).glob("error-*.json"))]
        result = Path(out, "result.json")
        if errors:
            report.checks.append(_error_check(ex.name, path, errors, n, out, watchdog))
            return report
        if proc.returncode != 0 or not result.exists():
            why = proc.failure or f"the job ended with exit code {proc.returncode} and no result"
            report.checks.append(Check("runs to the end", False,
                                       f"{why}.\n" + _tail(proc.stdout + proc.stderr)))
            return report
        data = json.loads(result.read_text())
    cases, records = data["cases"], data["records"]
    report.checks.append(
        Check(f"runs on {n} rank{'s' if n != 1 else ''}: {len(cases)} cases, no error, "
              "no deadlock", True))
    if data["borrowed"] and ex.writes_communication:
        report.checks.append(Check("written by you", False, (
            "your file uses minipar.collectives, the package's own implementation: "
            "the exercise is to write the algorithm yourself from Send/Recv/Sendrecv.")))
    report.checks += ex.grader().judge(n, cases, records)
    return report


def _outputs(out: str) -> dict[int, str]:
    """rank -> what the learner's code printed on that rank (ranks that printed something)."""
    found = {}
    for p in Path(out).glob("output-*.txt"):
        text = p.read_text(errors="replace")
        if text.strip():
            found[int(p.stem.split("-")[1])] = text
    return found


def _timeout_check(path: Path, out: str, timeout: float, said: str) -> Check:
    """The ranks ran past ``timeout``: where each was stopped (``stack-RANK.txt``).

    ``said``: what the job printed (its tail is shown when no stack names a line)."""
    where = {}
    for p in Path(out).glob("stack-*.txt"):
        at = diagnosis.stopped_at(p.read_text(errors="replace"), path)
        if at:
            where[int(p.stem.split("-")[1])] = at
    if where:
        return Check("runs to the end without hanging", False,
                     diagnosis.endless(where, path.name, timeout))
    return Check("runs to the end without hanging", False, (
        f"the ranks did not finish within {timeout:g} s and were killed. Something "
        "waited where the watchdog cannot see: a blocking call on a raw MPI "
        "communicator (MPI.COMM_WORLD, comm.comm) or an endless loop.\n"
        + _tail(said)))


def _error_check(name: str, path: Path, errors: list[dict], n: int, out: str,
                 watchdog: float) -> Check:
    """The one error to show: a learner's exception before a deadlock it caused."""
    errors.sort(key=lambda e: (e["type"] == "DeadlockError", e["rank"]))
    e = errors[0]
    where = ""
    if e.get("line"):
        where = f"\nat {path.name}:{e['line']}: {e.get('code') or ''}".rstrip()
    case = f" (case: {e['case']})" if e.get("case") else ""
    if e["type"] == "NotImplementedError":
        hint = get(name).grader().FIRST_STEP
        return Check("implemented", False, (
            f"not implemented yet: start with {hint}{where}\n"
            f"Stuck? minipar exercise hint {name} gives one hint at a time."), case=e.get("case"))
    if e["type"] == "DeadlockError":
        return _deadlock_check(name, path, errors, n, out, watchdog)
    said = diagnosis.truncation(e["message"], e["rank"], e.get("recv"), e.get("case_data"), n)
    if said:
        return Check("message sizes agree (sender's chunk = receiver's buffer)", False,
                     f"{said}{case}{where}")
    stage = "while importing your file" if e["stage"] == "import" else f"in your code{case}"
    return Check("runs without error", False,
                 f"rank {e['rank']} raised {e['type']} {stage}: {e['message']}{where}")


def _deadlock_check(name: str, path: Path, errors: list[dict], n: int, out: str,
                    watchdog: float) -> Check:
    """Ranks stopped by the watchdog: the rank that never came, or a true deadlock.

    Each waiting rank's DeadlockError names the rank it waited for; each other
    rank's stack (``running-RANK.txt``, dumped on the waiting rank's signal) says where it was.  A rank
    that was waited for and was running a line that is no wait is the cause,
    and is named with its line; otherwise every rank was waiting: a deadlock."""
    stuck = [x for x in errors if x["type"] == "DeadlockError"]
    e = stuck[0]
    case = f" (case: {e['case']})" if e.get("case") else ""
    waits = {x["rank"]: diagnosis.awaited(x["message"]) for x in stuck}
    here = {}
    for r in range(n):
        dump = Path(out, f"running-{r}.txt")
        text = dump.read_text(errors="replace") if dump.exists() else ""
        here[r] = diagnosis.stopped_at(text, path)
    said = diagnosis.absent(waits, here, path.name, get(name).learner_function, f"{watchdog:g}")
    if said:
        return Check("runs to the end without hanging", False,
                     (f"{e['case']}: " if e.get("case") else "") + said, case=e.get("case"))
    where = f"\nat {path.name}:{e['line']}: {e.get('code') or ''}".rstrip() if e.get("line") else ""
    if "Sendrecv" in (e.get("code") or ""):
        advice = ("Each waiting rank expected a message its peer never sent: check that every "
                  "rank makes the same exchanges, as many times, with matching dest and source.")
    elif all("for Send to" in x["message"] for x in stuck):
        advice = ("Every rank is blocked in a Send: a large blocking Send waits until its "
                  "receive is posted, and every rank is sending first. Exchange pairwise in "
                  "one step with comm.Sendrecv(sendbuf, dest=peer, recvbuf=buf, source=peer), "
                  "or post Irecv before sending.")
    else:
        advice = ("Each waiting rank expected a message its peer never sent: if every rank "
                  "calls Recv before Send, all of them wait for ever. Send and receive in one "
                  "step with comm.Sendrecv(sendbuf, dest=right, recvbuf=buf, source=left).")
    return Check("no deadlock", False, (
        f"deadlock{case}: ranks {', '.join(map(str, sorted(waits)))} were stuck waiting. "
        f"{e['message']}{where}\n{advice}"), case=e.get("case"))


def _tail(text: str, lines: int = 12) -> str:
    kept = [ln for ln in text.strip().splitlines() if ln.strip()][-lines:]
    return "last output:\n" + "\n".join("  " + ln for ln in kept) if kept else "(no output)"
