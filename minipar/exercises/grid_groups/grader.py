"""Grader of the grid_groups exercise: coordinates and Split groups against minipar's Layout.

EN process grid grader · RU проверка сетки процессов · ZH 进程网格评分

The learner writes ``grid_groups(comm, dp, pp, tp, cp)`` -> ``(coords, comms)``:
this rank's coordinates and one sub-communicator per axis, made with
``comm.Split(color, key)``.  For every grid of N ranks (every ordered
factorisation N = dp·pp·cp·tp) each rank checks, against
:class:`minipar.comm.topology.Layout` (Megatron-LM's order, Narayanan et al.
2021, arXiv 2104.04473, §3: rank = ((d·pp + p)·cp + c)·tp + t):

1. the coordinates;
2. each axis's communicator: its size and the world ranks it holds (MPI
   group translation, no message), in coordinate order (the Split key: my
   rank in it is my coordinate);
3. an all-reduce of one-hot vectors over it (MPI's own ``Allreduce`` on the
   raw communicator, uncounted) sums exactly its group's ranks;
4. no messages: coordinates are arithmetic, groups need Split alone.

A wrong grid is named by :mod:`minipar.exercises.grid_groups.mistakes`.
Every ``comm.Split`` the learner calls first waits (polling an
``Ibarrier``, watched: ``MINIPAR_WATCHDOG_S``) until every rank has called
it, so a Split that some rank skips is an error within seconds, not a hang;
the all-reduces then run over the Split-made communicators in the order they
were made, the same on every rank (never in axis order: with Splits in a
different order on different ranks that could deadlock the grader).

How it fits the framework (the worker calls ``FUNCTION(comm, x, **kwargs)``
and compares an array with the oracle's): as in the pipeline-schedule
exercises, the learner's file ends with a fixed ``run_grid(comm, x, **case)``
that hands ``grid_groups`` to :func:`run_grid` here; it returns ``[0.]``
when nothing was found, else ``[1.]`` and the findings, as JSON, through
:func:`diagnose`.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from typing import Any

import numpy as np
from mpi4py import MPI

from minipar.comm.topology import AXES
from minipar.comm.traced import TracedComm
from minipar.exercises.grading import Check, GradingComm
from minipar.exercises.grid_groups import mistakes
from minipar.exercises.judging import Records

FIRST_STEP = (
    "the coordinates: peel them off your rank like digits, tp first: t = rank % tp, "
    "c = (rank // tp) % cp, p = (rank // (tp*cp)) % pp, d = rank // (tp*cp*pp)."
)
NAMES = {
    "contract": "returns (coords, comms): dicts keyed dp, pp, cp, tp (ints; communicators)",
    "coords": "coordinates = minipar's Layout: rank = ((d·pp + p)·cp + c)·tp + t",
    "members": "each comms[axis] holds exactly its group: the ranks that differ from you "
               "only on that axis (size and who)",
    "order": "in coordinate order: your rank in comms[axis] is your coordinate (the Split key)",
    "allreduce": "an all-reduce over comms[axis] sums exactly its group's ranks",
}
_notes: dict[str, str] = {}  # case label -> findings, for diagnose (same process, rank side)


# -- cases ----------------------------------------------------------------------------------
def _factorisations(n: int, parts: int) -> list[tuple[int, ...]]:
    if parts == 1:
        return [(n,)]
    return [(f, *rest) for f in range(1, n + 1) if n % f == 0
            for rest in _factorisations(n // f, parts - 1)]


def cases(n: int) -> list[dict]:
    """Every grid of n ranks: those with most axes of size > 1 first (tp > 1 first among
    them: where tp's place shows), cp > 1 last."""
    grids = [dict(zip(AXES, f, strict=True)) for f in _factorisations(n, 4)]
    grids.sort(key=lambda g: (g["cp"] > 1, -sum(v > 1 for v in g.values()),
                              -g["tp"], -g["dp"], -g["pp"]))
    return grids


def label(case: dict) -> str:
    return " x ".join(f"{a} {case[a]}" for a in AXES)


def make_input(case: dict, rank: int, size: int) -> tuple[np.ndarray, dict]:
    return np.zeros(1), {a: case[a] for a in AXES}


def oracle(raw: Any, case: dict, x: np.ndarray) -> tuple[np.ndarray, None]:
    """Nothing found: [0.]."""
    return np.zeros(1), None


def diagnose(case: dict, rank: int, size: int, x: np.ndarray, out: np.ndarray,
             expected: np.ndarray) -> str | None:
    return _notes.get(label(case))


# -- the rank side --------------------------------------------------------------------------
class SplitNotCalledEverywhere(RuntimeError):
    """Some rank did not call the k-th comm.Split within the watchdog's time."""


class SplitLog(GradingComm):
    """The communicator the learner gets: each ``Split`` waits for every rank, and is logged."""

    def __init__(self, comm: GradingComm):
        super().__init__(comm.comm, timeout=comm.timeout, stats=comm.stats, calls=comm.calls,
                         last=comm.last)
        self.log: list[GradingComm] = []

    def Split(self, color: int = 0, key: int = 0) -> GradingComm:
        k = len(self.log) + 1
        req, t0, nap = self.comm.Ibarrier(), time.perf_counter(), 2e-5
        while not req.Test():
            if time.perf_counter() - t0 > self.timeout:
                raise SplitNotCalledEverywhere(
                    f"rank {self.rank} waited more than {self.timeout:g} s in comm.Split call "
                    f"#{k} for the other ranks to call it too. Split is collective: EVERY rank "
                    "calls it, as many times, in the same order (no Split under an if that "
                    "differs between ranks; a rank alone on an axis still calls it).")
            time.sleep(nap)
            nap = min(1e-3, 2 * nap)
        child = super().Split(color, key)
        self.log.append(child)
        return child


def _raw(c: Any) -> Any:
    return c.comm if isinstance(c, TracedComm) else c


def _contract(got: Any) -> str | None:
    """What is wrong with the returned value's form, or None."""
    if not isinstance(got, (tuple, list)) or len(got) != 2:
        return f"grid_groups returned {type(got).__name__}, not a pair (coords, comms)"
    co, cm = got
    for what, d in (("coords", co), ("comms", cm)):
        if not isinstance(d, dict) or any(a not in d for a in AXES):
            keys = sorted(map(str, d)) if isinstance(d, dict) else type(d).__name__
            return f"{what} must be a dict with the keys dp, pp, cp, tp; got {keys}"
    bad = [a for a in AXES if isinstance(co[a], bool) or not isinstance(co[a], (int, np.integer))]
    if bad:
        return f"coords[{bad[0]!r}] is {co[bad[0]]!r}, not an integer"
    for a in AXES:
        r = _raw(cm[a])
        if not isinstance(r, MPI.Comm) or r == MPI.COMM_NULL:
            return (f"comms[{a!r}] is {type(cm[a]).__name__}"
                    f"{' (COMM_NULL)' if r == MPI.COMM_NULL else ''}, not a communicator")
    return None


def _members(c: Any, parent: MPI.Comm) -> list[int]:
    """Ranks of ``parent`` in communicator ``c``, by their rank in ``c`` (no message)."""
    mine, theirs = c.Get_group(), parent.Get_group()
    try:
        return [int(r) for r in MPI.Group.Translate_ranks(mine, list(range(c.Get_size())), theirs)]
    finally:
        mine.Free()
        theirs.Free()


def _reduce(c: MPI.Comm, rank: int, n: int) -> list[int]:
    """The ranks whose one-hot vectors an all-reduce over ``c`` summed (MPI's own, uncounted)."""
    one, total = np.zeros(n), np.zeros(n)
    one[rank] = 1.0
    c.Allreduce(one, total)
    return [int(q) for q in np.flatnonzero(total)]


def measure(fn: Callable, comm: GradingComm, sizes: dict[str, int]) -> dict:
    """Call the learner's function on this rank; what it returned, measured (see mistakes)."""
    log = SplitLog(comm)
    raw, n = comm.comm, comm.Get_size()
    rank = raw.Get_rank()
    got = fn(log, dp=sizes["dp"], pp=sizes["pp"], tp=sizes["tp"], cp=sizes["cp"])
    rec: dict[str, Any] = {"contract": _contract(got), "coords": None, "members": None,
                           "reduced": None, "split_axes": [None] * len(log.log)}
    comms = got[1] if rec["contract"] is None else {}
    made = {a: next((i for i, ch in enumerate(log.log) if ch is comms[a]), None) for a in comms}
    for a in AXES[::-1]:  # name each Split by the first axis it was returned for
        if made.get(a) is not None:
            rec["split_axes"][made[a]] = a
    # every rank holds the same Split-made communicators, made in the same order: reduce in it
    reduced = [_reduce(ch.comm, rank, n) if ch.comm != MPI.COMM_NULL else None
               for ch in log.log]  # (a communicator you freed already: None)
    if rec["contract"] is None:
        rec["coords"] = {a: int(got[0][a]) for a in AXES}
        rec["members"] = {a: _members(_raw(comms[a]), raw) for a in AXES}
        rec["reduced"] = {a: (reduced[made[a]] if made[a] is not None
                              else rec["members"][a] if len(rec["members"][a]) == 1 else None)
                          for a in AXES}
    everyone = raw.allgather(rec)
    for ch in log.log:  # collective, in the order made: the same on every rank
        if ch.comm != MPI.COMM_NULL:
            ch.comm.Free()
    rec["everyone"] = everyone
    return rec


def run_grid(fn: Callable, comm: Any, x: np.ndarray, **case: Any) -> np.ndarray:
    """One case on this rank (called through the learner's file's ``run_grid``)."""
    key = label(case)
    _notes.pop(key, None)
    sizes = {a: int(case[a]) for a in AXES}
    if not isinstance(comm, GradingComm):  # run outside the grader: plain TracedComm or MPI
        comm = GradingComm(_raw(comm))
    rec = measure(fn, comm, sizes)
    found = mistakes.findings(sizes, comm.Get_rank(), rec["everyone"])
    if found:
        _notes[key] = json.dumps(found)
    return np.array([1.0 if found else 0.0])


# -- the launcher side ----------------------------------------------------------------------
def judge(n: int, cases: list[dict], records: Records) -> list[Check]:
    found: dict[str, tuple[str, str]] = {}  # key -> (case label, words): first case, rank
    for i, case in enumerate(cases):
        for recs in records:
            said = recs[i]["mistake"]
            for k, words in (json.loads(said) if said else {}).items():
                found.setdefault(k, (label(case), words))
    checks = []
    for k, name in NAMES.items():
        where, words = found.get(k, (None, ""))
        if k != "contract" and "contract" in found and k not in found:
            checks.append(Check(name, None, "not graded where grid_groups does not return "
                                "(coords, comms) (the ✗ above)"))
            continue
        checks.append(Check(name, k not in found, words, case=where))
    checks.append(quiet_check(cases, records))
    return checks


def quiet_check(cases: list[dict], records: Records) -> Check:
    """No byte sent and no MPI collective called: the grid is arithmetic plus Split."""
    name = "no messages: coordinates by arithmetic, groups by comm.Split alone"
    for i, case in enumerate(cases):
        for r, recs in enumerate(records):
            rec = recs[i]
            if rec["bytes_sent"] or rec["calls"]:
                did = [f"sent {rec['bytes_sent']} bytes"] if rec["bytes_sent"] else []
                did += [f"called comm.{f} {k} time{'s' if k > 1 else ''}"
                        for f, k in rec["calls"].items()]
                return Check(name, False, (
                    f"{label(case)}: rank {r} {' and '.join(did)}. Your coordinates follow from your "
                    "rank and the sizes alone, and comm.Split builds the groups: no rank needs "
                    "to ask another anything."), case=label(case))
    return Check(name, True)
