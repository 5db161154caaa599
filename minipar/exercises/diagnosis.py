"""Naming the learner's mistake: wrong values, MPI's truncation error, an endless loop.

EN diagnosis of mistakes · RU диагностика ошибок · ZH 错误诊断

A grader that only says "index 7: expected 10.0, got 2.5" leaves the
learner to guess.  These functions turn what was measured into the sentence
a teacher would say:

* :func:`sum_mistake` (rank side, where the arrays are): the result of a
  sum over ranks, compared with the sum ``Σ_r parts[r]`` it should be --
  exactly 1/N of it ("did you average instead of sum?"), N x it, a
  **partial sum** (chunk c holds only some ranks' contributions: solved as
  ``out_c = P_c · a`` by least squares, with every ``a_r`` 0 or 1), or the
  right sums in a **rotated chunk order** (chunk c holds chunk (c+k) % N's).
  A partial sum is blamed on the **all-gather** when the reduce-scatter
  visibly finished: some chunk holds the complete sum while others do not, or
  each chunk c holds exactly rank c's own values (the chunk rank c never
  added into, passed around by an all-gather that used the reduce-scatter's
  indices); otherwise on the reduce-scatter.
  Only on inputs whose N contributions are linearly independent: on
  proportional ones (rank r holds (r+1) x the same values) 1/N of a sum can
  also be one rank's own x, and a guess would mislead.
* :func:`truncation` -- MPI's ``Message truncated, error stack: ...`` (the
  message was larger than the receive buffer) as a sentence about chunk
  sizes: which ranks, how many elements each way, and which
  ``numpy.array_split`` chunk indices have those sizes.
* :func:`stopped_at` -- where a rank was when the launcher stopped it: the
  innermost line of the learner's file in the traceback ``faulthandler``
  wrote when the rank was stopped (see :mod:`minipar.exercises.worker`).
* :func:`absent` -- ranks stopped by the watchdog while waiting for a rank
  that never came: the waiting ranks' ``DeadlockError`` names whom each
  waited for, the missing rank's stack (dumped on their signal) where
  it was instead (an endless loop, a long computation, or already gone).
"""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np

_TRUNCATED = re.compile(r"(\d+) bytes received but buffer size is (\d+)")
_FRAME = re.compile(r'File "(.+)", line (\d+) in (\S+)')


def _close(a: np.ndarray, b: np.ndarray, tol: np.ndarray | float) -> bool:
    return bool(a.size) and bool(np.all(np.abs(a - b) <= tol))


def sum_mistake(out: np.ndarray, expected: np.ndarray, parts: list[np.ndarray],
                atol: np.ndarray | None) -> str | None:
    """Why ``out`` is not ``expected = Σ parts``, in a sentence; None if no pattern fits."""
    n = len(parts)
    o, e = out.astype(np.float64).ravel(), expected.astype(np.float64).ravel()
    tol = np.zeros_like(e) if atol is None else np.asarray(atol, dtype=np.float64).ravel()
    if n < 2 or not np.any(e) or o.shape != e.shape:
        return None
    P = np.stack([p.astype(np.float64).ravel() for p in parts], axis=1)
    if P.shape[0] < n or np.linalg.matrix_rank(P) < n:
        return None  # proportional inputs ((r+1) x the same values): any pattern could be luck
    whole = tol + (1.0 if np.issubdtype(out.dtype, np.integer) else 0.0)  # floor division
    if _close(o, e / n, whole + np.abs(e) * 1e-12):
        return (f"Every element is exactly 1/N of the expected sum (N = {n}): did you average "
                "instead of sum?")
    if _close(o, e * n, tol * n + np.abs(e) * 1e-12):
        return (f"Every element is exactly N = {n} times the expected value: each contribution "
                "was added N times (a sum summed again, or an all-reduce run twice).")
    bounds = np.cumsum([0] + [len(c) for c in np.array_split(e, n)])
    spans = [slice(bounds[c], bounds[c + 1]) for c in range(n)]
    wrong = [c for c, s in enumerate(spans) if not _close(o[s], e[s], tol[s] + 1e-300)
             and o[s].size]
    if not wrong:
        return None
    moved = {}
    for c in wrong:
        size = bounds[c + 1] - bounds[c]
        moved[c] = next((d for d in range(n) if d != c and bounds[d + 1] - bounds[d] == size
                         and _close(o[spans[c]], e[spans[d]], tol[spans[d]])), None)
    shifts = {(d - c) % n for c, d in moved.items() if d is not None}
    if None not in moved.values() and len(shifts) == 1:
        k = shifts.pop()
        return (f"The sums are right but in a rotated chunk order: chunk c holds what belongs in "
                f"chunk (c + {k}) % N (N = {n}; e.g. chunk {wrong[0]} holds chunk "
                f"{moved[wrong[0]]}'s sum). Check which chunk index you receive into, and in what "
                "order you put the chunks together.")
    partial = []
    for c in wrong:
        block = P[spans[c]]
        if block.shape[0] < n or np.linalg.matrix_rank(block) < n:
            continue  # the ranks' contributions cannot be told apart on this chunk
        a = np.linalg.lstsq(block, o[spans[c]], rcond=None)[0]
        on = np.round(a)
        if (np.all(np.abs(a - on) < 1e-6) and set(on) <= {0.0, 1.0} and 0 < on.sum() < n
                and _close(block @ on, o[spans[c]], tol[spans[c]] + 1e-9 * np.abs(e[spans[c]]))):
            partial.append((c, [r for r in range(n) if on[r] == 0]))
    complete = [c for c, s in enumerate(spans) if c not in wrong and o[s].size]
    if partial:
        if all(m == [r for r in range(n) if r != c] for c, m in partial):
            return (f"Each chunk c holds only rank c's own values (N = {n}). Two mistakes "
                    "give exactly this; check both. (1) The reduce-scatter ASSIGNS what it "
                    "receives instead of adding it: each step must do `recv += buf` (receive "
                    "into a scratch buffer, then +=), not `recv[:] = buf` or a Recv straight "
                    "into the chunk, which overwrites the partial sum so that one rank's values "
                    "go around. (2) The all-gather passed around the chunks the reduce-scatter "
                    "never added into (rank r's chunk r, which it only sends at its first "
                    "step), overwriting the finished sums. The reduce-scatter leaves rank r "
                    "with the complete sum of chunk (r + 1) % N: in the all-gather send "
                    "chunks[(r + 1 - s) % N] and receive into chunks[(r - s) % N] -- its "
                    "indices are one ahead of the reduce-scatter's.")
        if complete:
            said = ", ".join(map(str, complete[:4]))
            return (f"An all-gather problem: chunk{'s' if len(complete) > 1 else ''} {said} "
                    "hold the complete sum, so the reduce-scatter finished its sums, but the "
                    "all-gather did not deliver them to every chunk (others still hold partial "
                    "sums). After the reduce-scatter rank r holds the complete sum of chunk "
                    "(r + 1) % N: in the all-gather step s send chunks[(r + 1 - s) % N] and "
                    "receive straight into chunks[(r - s) % N] (a copy, no +=).")
    if partial:
        said = "; ".join(f"chunk {c} lacks rank{'s' if len(m) > 1 else ''} "
                         f"{', '.join(map(str, m))}" for c, m in partial[:3])
        return (f"A partial sum: some chunks hold the contributions of only some ranks ({said}). "
                "Each chunk must collect all N contributions: N-1 reduce-scatter steps, each "
                "adding what arrived into the chunk that was received.")
    return None


def chunk_sizes(length: int, n: int) -> list[int]:
    """Element counts of ``numpy.array_split(range(length), n)``: the first L % N one longer."""
    q, extra = divmod(length, n)
    return [q + (c < extra) for c in range(n)]


def truncation(message: str, rank: int, recv: dict | None, case: dict | None,
               n: int) -> str | None:
    """MPI's 'Message truncated' error as a sentence about chunk sizes, or None.

    ``recv``: the receive this rank had posted last (``source``, ``nbytes``,
    ``itemsize``: :class:`minipar.exercises.grading.GradingComm`); ``case``:
    the case being graded (its ``length`` gives the chunk sizes)."""
    if "truncated" not in message.lower():
        return None
    m = _TRUNCATED.search(message)
    src = re.search(r"from rank (\d+)", message)
    source = int(src.group(1)) if src else (recv or {}).get("source")
    buf = (recv or {}).get("nbytes")
    sizes = [int(m.group(1)), int(m.group(2))] if m else []
    # MPICH's two numbers are not in a reliable order: the buffer is the one this rank posted
    msg = next((b for b in sizes if b != buf), None) if buf is not None else None
    item = (recv or {}).get("itemsize") or 1
    who = f"from rank {source}" if source is not None else "from another rank"
    if msg is None or buf is None:
        return (f"rank {rank} received a message {who} larger than its receive buffer (MPI: "
                "message truncated). Sender and receiver must agree on every message's size: "
                "the receiver's buffer must be exactly the chunk the sender sends.")
    what = (f"rank {rank} received {_elements(msg // item)} ({msg} bytes) {who} into a buffer "
            f"of {_elements(buf // item)} ({buf} bytes): MPI refuses a message larger than the "
            "receive buffer.")
    if not case or "length" not in case:
        return what + " Size the buffer for the message that will come."
    sizes = chunk_sizes(case["length"], n)
    sent = [c for c, s in enumerate(sizes) if s == msg // item]
    room = [c for c, s in enumerate(sizes) if s == buf // item]
    return (what + f" With length {case['length']} on {n} ranks, np.array_split gives chunks of "
            f"{sizes} elements: rank {source} sent {_which(sent)}, while rank {rank} "
            f"expected {_which(room)}. At each step the index rank r sends and the index "
            "rank r+1 receives must be the same chunk: size the buffer with the chunk you "
            "receive into (np.empty_like(chunks[received])), not the one you send.")


def _elements(k: int) -> str:
    return f"{k} element" + ("" if k == 1 else "s")


def _which(chunks: list[int]) -> str:
    if not chunks:
        return "a piece no chunk has the size of"
    if len(chunks) == 1:
        return f"chunk {chunks[0]}"
    return "one of chunks " + ", ".join(map(str, chunks))


def stopped_at(dump: str, file: Path) -> tuple[int, str] | None:
    """(line, code) of the innermost frame in ``file`` of a ``faulthandler`` traceback."""
    for m in _FRAME.finditer(dump):  # each thread's frames are listed innermost first
        if Path(m.group(1)).resolve() == file:
            line = int(m.group(2))
            try:
                code = file.read_text().splitlines()[line - 1].split("  #")[0].strip()
            except (OSError, IndexError):
                code = ""
            return line, code
    return None


#: words of a line that waits for a message (then the loop is a wait, not a computation)
WAITS = ("Recv", "recv", "Wait", "wait", "Probe", "Barrier", "Sendrecv", "sleep")


def endless(where: dict[int, tuple[int, str]], name: str, timeout: float) -> str:
    """The timeout sentence when ranks were stopped at known lines of the learner's file."""
    lines: dict[tuple[int, str], list[int]] = {}
    for rank, at in sorted(where.items()):
        lines.setdefault(at, []).append(rank)
    said = "; ".join(f"rank{'s' if len(rs) > 1 else ''} {', '.join(map(str, rs))} at "
                     f"{name}:{ln}: {code}" for (ln, code), rs in lines.items())
    waiting = all(any(w in code for w in WAITS) for ln, code in lines)
    if waiting:
        why = ("They were waiting in MPI for a message nobody sent, somewhere the watchdog cannot "
               "see: a blocking call on a raw MPI communicator (MPI.COMM_WORLD, comm.comm), or a "
               "loop that never ends around a send and receive.")
    else:
        why = ("An endless loop: look at the loop around that line -- does its counter advance, "
               "and can its condition become false on every rank?")
    return f"the ranks did not finish within {timeout:g} s and were stopped there ({said}). {why}"


_AWAITED = re.compile(r"for \w+ from rank (\d+)")


def awaited(message: str) -> int | None:
    """The peer a :class:`~minipar.comm.errors.DeadlockError` says its rank waited for."""
    m = _AWAITED.search(message)
    return int(m.group(1)) if m else None


def absent(waits: dict[int, int | None], where: dict[int, tuple[int, str] | None], name: str,
           function: str, watchdog: str) -> str | None:
    """The sentence for ranks that waited for a rank that never came, or None.

    ``waits``: waiting rank -> the rank it waited for (its DeadlockError);
    ``where``: every other rank -> its line of the learner's file in its last
    stack dump (None: it was outside the learner's function).  A rank that no
    one saw waiting and that was running a line that is no wait is the one
    at fault: an endless loop, or a computation longer than the watchdog."""
    if not waits:
        return None
    running = {r: at for r, at in where.items()
               if r not in waits and at and not any(w in at[1] for w in WAITS)}
    gone = sorted(r for r in set(waits.values()) - set(waits) - {None}
                  if r not in running and where.get(r) is None)
    if not running and not gone:
        return None
    said = []
    for r, (line, code) in sorted(running.items()):
        said.append(f"rank {r} never reached the exchange: it was still running at "
                    f"{name}:{line}: {code} (an endless loop or a very long computation)")
    for r in gone:
        said.append(f"rank {r} never sent what its neighbour waited for: it was no longer in "
                    f"{function}() (it returned early, or skipped the exchange)")
    waiting = sorted(waits)
    pairs = ", ".join(f"rank {w} for rank {p}" for w, p in sorted(waits.items()) if p is not None)
    tail = (f". Ranks {', '.join(map(str, waiting))} waited ({pairs}) until the watchdog "
            f"stopped them after {watchdog} s: the ranks wait for each other in turn, so one "
            "rank that does not arrive stops them all.")
    return "; ".join(said) + tail
