"""Progress bars — индикатор выполнения — 进度条: tqdm, set up once for every long command.

EN progress bar · RU индикатор выполнения · ZH 进度条

``minipar train`` and the long benchmarks show how far they are with `tqdm
<https://tqdm.github.io>`_ (a kept library, instead of a hand-written bar), on
**stderr**, so that stdout holds only the results (a table, JSON) and
``minipar bench collectives --json > rows.json`` stays clean:

* on a terminal: one line redrawn in place, at most every ``mininterval`` =
  0.1 s (tqdm's own default rate);
* anywhere else (a log file, a pipe, CI, pytest's capture): one whole line
  per tenth of the run (``miniters`` = total // 10, ``mininterval`` 0), the
  ``\\r`` redraws turned into newlines by :class:`_Lines`, so that a log reads
  ``step 30/300 [###...] , loss 1.2345 00:01<00:09`` ten times, not one
  line of 300 carriage returns;
* in a notebook: ``notebook=True`` takes ``tqdm.auto`` (a widget in Jupyter,
  the text bar elsewhere).

A benchmark's ranks run under :func:`minipar.launch.run_json`, whose output
is read only when the launch ends; to show their progress while they run,
:func:`watched` gives the launch a file to which rank 0 appends one byte per
unit of work (:func:`tick`), and a thread of the launching process moves the
bar as the file grows.

Start-up cost (``python -X importtime``): ``import tqdm`` took 58 ms on this
shared 2-core machine, paid only by the verbs that draw a bar (it is imported
inside :func:`bar`); ``minipar glossary`` never imports it.
"""

from __future__ import annotations

import contextlib
import os
import sys
import tempfile
import threading
from collections.abc import Iterator
from typing import Any, TextIO

#: the bar's layout: ``step 30/300 [#########.....], loss 1.2345 00:01<00:09``
BAR_FORMAT = "{desc} {n_fmt}/{total_fmt} [{bar:30}]{postfix} {elapsed}<{remaining}"
#: seconds between two polls of a :func:`watched` file
POLL_S = 0.2
#: a launch's bar appears after this many seconds: a launch that fails at once (mpiexec
#: missing, a rank's bad import) says so in its one line, with no bar before it
LAUNCH_DELAY_S = 1.0


class _Lines:
    """A stream for tqdm off a terminal: each redraw (``\\r`` + line) becomes one whole line.

    tqdm's ``close`` redraws the last count once more: a line whose count and bar (the
    text up to ``]``) repeat the previous line's is dropped."""

    def __init__(self, stream: TextIO) -> None:
        self.stream, self.last = stream, ""

    def write(self, text: str) -> None:
        line = text.replace("\r", "").rstrip()
        key = line.split("]")[0]
        if line and key != self.last:
            self.stream.write(line + "\n")
            self.last = key

    def flush(self) -> None:
        self.stream.flush()


def _is_tty(stream: Any) -> bool:
    try:
        return bool(stream.isatty())
    except (AttributeError, ValueError):  # no isatty, or a closed stream
        return False


def bar(total: int, desc: str = "step", stream: TextIO | None = None,
        notebook: bool = False, delay: float = 0.0) -> Any:
    """A tqdm bar of ``total`` units labelled ``desc``, written to ``stream`` (default stderr).

    Off a terminal it prints one line per tenth of ``total``; ``notebook=True``
    uses ``tqdm.auto``; ``delay`` s: nothing is drawn before (nor at all by work that
    ends sooner).  Call ``update(k)`` and ``close()`` (or use it in ``with``)."""
    if notebook:
        from tqdm.auto import tqdm as auto_tqdm

        return auto_tqdm(total=total, desc=desc, delay=delay)
    from tqdm import tqdm

    stream = sys.stderr if stream is None else stream
    common = {"total": total, "desc": desc, "bar_format": BAR_FORMAT, "ascii": ".#",
              "delay": delay}
    if _is_tty(stream):
        return tqdm(file=stream, mininterval=0.1, **common)
    return tqdm(file=_Lines(stream), miniters=max(1, total // 10), mininterval=0,
                **common)


@contextlib.contextmanager
def watched(total: int, desc: str, stream: TextIO | None = None,
            delay: float = LAUNCH_DELAY_S) -> Iterator[str]:
    """A progress file for a launch: yields its path (give it to the ranks; rank 0 calls
    :func:`tick` per unit of work) and moves a :func:`bar` as the file grows.

    The bar appears after ``delay`` seconds (see :data:`LAUNCH_DELAY_S`).  The file is
    removed and the bar closed in every case (a failed or interrupted launch)."""
    fd, path = tempfile.mkstemp(prefix="minipar-progress-")
    os.close(fd)
    b = bar(total, desc, stream, delay=delay)
    stop = threading.Event()

    def follow() -> None:
        b.update(min(total, os.path.getsize(path)) - b.n)

    def poll() -> None:
        while not stop.wait(POLL_S):
            follow()

    thread = threading.Thread(target=poll, daemon=True)
    thread.start()
    try:
        yield path
        follow()
    finally:
        stop.set()
        thread.join()
        b.close()
        os.remove(path)


def tick(path: str | None, units: int = 1) -> None:
    """Rank side of :func:`watched`: ``units`` more done.  No path (no bar wanted), or a file
    this rank cannot reach (another machine), is no error: progress is only shown."""
    if not path:
        return
    try:  # append, never create: a removed file (the launch is over) stays removed
        fd = os.open(path, os.O_WRONLY | os.O_APPEND)
    except OSError:
        return
    try:
        os.write(fd, b"." * units)
    finally:
        os.close(fd)
