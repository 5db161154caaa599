"""Every verb's options: their types, and the one path of a bad one (one line, exit 2).

EN command-line options · RU опции командной строки · ZH 命令行选项

The home of what every ``minipar`` verb (``minipar run``, ``demo``, ``exercise``
and each ``minipar bench WHAT`` too) does with its command line, so that a
learner who mistypes an option reads one sentence that says what to change:

* a bad value prints ONE line on stderr that names the option and the values
  it accepts, ``minipar train: --steps must be a positive integer, got 0``, and
  exits with status :data:`EXIT_USAGE` (2, as argparse and the shell's own
  builtins do), in the launching process, before any model is built or any
  MPI rank started; never a traceback;
* ``--help`` still prints the full help (exit 0);
* Ctrl-C prints ``minipar: interrupted`` and exits :data:`EXIT_INTERRUPTED`
  (130 = 128 + SIGINT, the shell's convention); SIGTERM (what ``kill``,
  ``timeout`` and a cluster's scheduler send) is handled the same way —
  :class:`Terminated`, ``minipar: terminated``, :data:`EXIT_TERMINATED`
  (143 = 128 + SIGTERM) — and so is SIGHUP (a closed terminal, a lost ssh
  session: ``minipar: hung up``, :data:`EXIT_HANGUP`, 129 = 128 + SIGHUP) — so a
  multi-rank launch stops every rank and removes its files either way
  (:func:`sigterm_as_interrupt`, :mod:`minipar.cli`);
* a duration (``--timeout``, ``--watchdog``) is a number of seconds > 0 and at
  most :data:`MAX_SECONDS` (1e6 s, 11.6 days): past about 2.1e6 s the
  operating system's wait, counted in milliseconds in a 32-bit integer, overflows;
* files and folders: an output FILE (``--json-out FILE``, ``--export-md PATH``)
  must go into a folder that exists — minipar never creates folders for a
  file, so a typo in a path is an error, not a stray folder; the one option
  that names a *working folder*, ``minipar exercise start --dir DIR``,
  creates it (with its parents) and says so.

What this module offers, for every verb's parser:

* :class:`ArgumentParser` — argparse whose ``error`` prints one line
  (``minipar VERB: --option …``) instead of the usage block and raises
  ``SystemExit(2)``; sub-parsers inherit it.  Cross-option checks call
  ``parser.error(...)``.  No verb catches that ``SystemExit`` (nor ``--help``'s
  ``SystemExit(0)``): :func:`minipar.cli.main`, through which every verb is
  dispatched, turns it into the exit status, once for all of them; run as
  ``python -m minipar.bench.WHAT``, Python's own exit does the same.
* option types that check ranges as they parse, so the message names the
  option without extra code: :func:`integer`, :func:`number`,
  :func:`seconds`, :func:`output_file`.
* :func:`error_line` — print one line for a ``ValueError`` caught in a verb
  and return 2.

Imports only the standard library: ``minipar glossary`` must start without
NumPy.
"""

from __future__ import annotations

import argparse
import contextlib
import math
import os
import re
import signal
import sys
from collections.abc import Callable, Iterator
from typing import Any, NoReturn

from minipar.checks import integers

#: exit status of a bad command line (argparse's and the shell's convention)
EXIT_USAGE = 2
#: exit status after Ctrl-C: 128 + SIGINT (2), as a shell reports a process killed by it
EXIT_INTERRUPTED = 130
#: exit status after SIGTERM: 128 + SIGTERM (15)
EXIT_TERMINATED = 143
#: exit status after SIGHUP (the terminal was closed): 128 + SIGHUP (1)
EXIT_HANGUP = 129
#: the signals :func:`sigterm_as_interrupt` turns into :class:`Terminated` (SIGHUP: POSIX only)
STOP_SIGNALS = tuple(getattr(signal, n) for n in ("SIGTERM", "SIGHUP") if hasattr(signal, n))
#: the longest duration a ``--timeout`` / ``--watchdog`` accepts, in seconds (11.6 days)
MAX_SECONDS = 1e6


def one_line(text: str) -> str:
    """``text`` with its lines joined by spaces: an error is one line, whatever it quotes."""
    return " ".join(part.strip() for part in str(text).splitlines() if part.strip())


def error_line(prog: str, message: object) -> int:
    """Print ``PROG: MESSAGE`` as one line on stderr; return :data:`EXIT_USAGE`."""
    print(f"{prog}: {one_line(str(message))}", file=sys.stderr)
    return EXIT_USAGE


_ARGUMENT = re.compile(r"argument (\S+?): (.*)", re.DOTALL)
_HINTED = ("unrecognized arguments", "the following arguments are required",
           "one of the arguments", "expected ")


class ArgumentParser(argparse.ArgumentParser):
    """argparse, except that a usage error is one line on stderr and exit 2.

    argparse's ``argument --steps: must be ...`` becomes ``--steps must be ...``
    (the option first, as a sentence); its other messages keep their words
    (``--model: invalid choice: 'foo' (choose from 'gpt', 'mlp')``).  A
    message that does not name the values (unknown option, missing argument)
    ends with a pointer to ``--help``.  A description taken from a module's
    docstring is shown without its reStructuredText quotes (````minipar demo````).
    """

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        if isinstance(kwargs.get("description"), str):
            kwargs["description"] = kwargs["description"].replace("``", "")
        super().__init__(*args, **kwargs)

    def error(self, message: str) -> NoReturn:
        m = _ARGUMENT.fullmatch(message)
        if m:
            name, rest = m.groups()
            message = f"{name} {rest}" if rest.startswith("must") else f"{name}: {rest}"
        if message.startswith(_HINTED) or " expected " in message:
            message += f" (see {self.prog} --help)"
        error_line(self.prog, message)
        raise SystemExit(EXIT_USAGE)


def _got(text: str) -> str:
    """How a rejected value is quoted: numbers bare, anything else in quotes."""
    try:
        float(text)
    except ValueError:
        return repr(text)
    return text


def integer(minimum: int | None = None, maximum: int | None = None) -> Callable[[str], int]:
    """An argparse ``type``: a whole number in [minimum, maximum] (either bound optional).

    ``p.add_argument("--steps", type=integer(1))`` rejects ``--steps 0`` with
    ``--steps must be a positive integer, got 0`` (the words of :func:`minipar.checks.integers`,
    which every engine's check uses too).
    """
    want = integers(minimum, maximum)

    def parse(text: str) -> int:
        try:
            v = int(text, 10)
        except ValueError:
            raise argparse.ArgumentTypeError(f"must be {want}, got {_got(text)}") from None
        if (minimum is not None and v < minimum) or (maximum is not None and v > maximum):
            raise argparse.ArgumentTypeError(f"must be {want}, got {text}")
        return v

    parse.__name__ = "integer"
    return parse


def number(greater_than: float | None = None, minimum: float | None = None,
           maximum: float | None = None) -> Callable[[str], float]:
    """An argparse ``type``: a finite float, > ``greater_than`` / >= ``minimum`` / <= ``maximum``.

    ``type=number(greater_than=0)`` rejects ``--lr 0``, ``--lr -1``, ``--lr nan``
    and ``--lr inf`` with ``--lr must be a finite number > 0, got 0``.
    """
    bounds = [f"> {greater_than:g}"] if greater_than is not None else []
    bounds += [f">= {minimum:g}"] if minimum is not None else []
    bounds += [f"<= {maximum:g}"] if maximum is not None else []
    want = "a finite number" + (" " + " and ".join(bounds) if bounds else "")

    def parse(text: str) -> float:
        try:
            v = float(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"must be {want}, got {_got(text)}") from None
        if (not math.isfinite(v)
                or (greater_than is not None and not v > greater_than)
                or (minimum is not None and v < minimum)
                or (maximum is not None and v > maximum)):
            raise argparse.ArgumentTypeError(f"must be {want}, got {text}")
        return v

    parse.__name__ = "number"
    return parse


#: what a duration must be, as the messages say it
SECONDS_WANTED = (f"a number of seconds > 0 and at most {MAX_SECONDS:.0e} "
                  f"({MAX_SECONDS / 86400:.1f} days)").replace("e+0", "e")


def check_seconds(name: str, value: float) -> float:
    """``value`` if it is a usable duration (> 0, at most :data:`MAX_SECONDS`), else
    ``ValueError: NAME must be a number of seconds > 0 and at most 1e6 (11.6 days), got V``."""
    try:
        v = math.nan if isinstance(value, (bool, str)) else float(value)
    except (TypeError, ValueError):
        v = math.nan
    if not 0 < v <= MAX_SECONDS:  # also refuses nan
        raise ValueError(f"{name} must be {SECONDS_WANTED}, got {value!r}")
    return v


def seconds(text: str) -> float:
    """An argparse ``type``: a duration in seconds, > 0 and at most :data:`MAX_SECONDS`.

    ``--timeout 0``, ``--timeout nan`` and ``--timeout 3e6`` are refused with
    ``--timeout must be a number of seconds > 0 and at most 1e6 (11.6 days), got 3e6``:
    a longer wait would overflow the operating system's timer, not wait longer.
    """
    try:
        return check_seconds("", float(text))
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be {SECONDS_WANTED}, got {_got(text)}") from None


class Terminated(KeyboardInterrupt):
    """SIGTERM arrived (``kill PID``, ``timeout``, a scheduler ending the job), or SIGHUP
    (the terminal was closed); ``signum`` says which.

    A subclass of ``KeyboardInterrupt``, so every ``except KeyboardInterrupt``
    and ``finally`` that cleans up after Ctrl-C also runs for SIGTERM — above
    all :func:`minipar.launch.run`, which stops its ranks."""

    def __init__(self, signum: int = signal.SIGTERM) -> None:
        super().__init__()
        self.signum = int(signum)

    @property
    def exit_status(self) -> int:
        """128 + the signal's number, the shell's convention (143 for SIGTERM, 129 SIGHUP)."""
        return 128 + self.signum


def _raise_terminated(signum: int, frame: object) -> None:
    # one is enough: a second SIGTERM (or SIGHUP) must not cut short the stopping of the ranks
    for sig in STOP_SIGNALS:
        signal.signal(sig, signal.SIG_IGN)
    raise Terminated(signum)


@contextlib.contextmanager
def sigterm_as_interrupt() -> Iterator[None]:
    """Within the block, SIGTERM and SIGHUP raise :class:`Terminated`, so that ``except``
    and ``finally`` blocks run, instead of their default action: ending the process at
    once, running none of them.  A second one while the first unwinds is ignored.

    Only where nobody else decided: in the main thread (the only one Python
    delivers signals to) and while the signal has its default action; a handler
    already set (the caller's own, or ``minipar.cli``'s, or SIG_IGN — ``nohup``
    ignores SIGHUP) is left in place.  The previous handling is restored when
    the block ends."""
    installed = []
    try:
        for sig in STOP_SIGNALS:
            if signal.getsignal(sig) == signal.SIG_DFL:
                signal.signal(sig, _raise_terminated)
                installed.append(sig)
    except ValueError:  # not the main thread
        pass
    try:
        yield
    finally:
        for sig in installed:
            signal.signal(sig, signal.SIG_DFL)


def check_output_file(path: str) -> str | None:
    """Why ``path`` cannot be written as a file (None if it can), leaving nothing behind.

    Its folder must exist and be writable, and ``path`` must not be a folder.  Then the
    file is really opened (an existing one for appending, untouched; a new one created and
    removed at once): permission bits do not tell root that ``/proc`` or a read-only file
    system refuses files.
    """
    if not path:
        return "needs a file name, got ''"
    folder = os.path.dirname(os.path.abspath(path))
    if os.path.isdir(path):
        return f"{path} is a folder; give a file name inside it"
    if not os.path.isdir(folder):
        what = "is not a folder" if os.path.exists(folder) else "does not exist"
        return f"cannot write {path}: the folder {folder} {what} (minipar does not create it)"
    if os.path.exists(path) and not os.access(path, os.W_OK):
        return f"cannot write {path}: permission denied"
    if not os.path.exists(path) and not os.access(folder, os.W_OK | os.X_OK):
        return f"cannot write {path}: the folder {folder} is not writable"
    try:
        if not os.path.exists(path):
            os.close(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666))
            os.remove(path)
        elif os.path.isfile(path):  # (a pipe or a device is left alone: opening may block)
            with open(path, "a", encoding="utf-8"):
                pass
    except OSError as e:
        return f"cannot write {path}: {e.strerror or e}"
    return None


def output_file(text: str) -> str:
    """An argparse ``type``: a file path that can be written (see :func:`check_output_file`).

    Checked when the command line is parsed, so ``--json /no/such/dir/x.json``
    fails at once, not after a long run.
    """
    problem = check_output_file(text)
    if problem:
        raise argparse.ArgumentTypeError(problem)
    return text


def output_file_or_stdout(text: str) -> str:
    """:func:`output_file`, or ``-`` for standard output."""
    return text if text == "-" else output_file(text)


__all__ = [
    "EXIT_HANGUP",
    "EXIT_INTERRUPTED",
    "EXIT_TERMINATED",
    "EXIT_USAGE",
    "MAX_SECONDS",
    "SECONDS_WANTED",
    "STOP_SIGNALS",
    "ArgumentParser",
    "Terminated",
    "check_output_file",
    "check_seconds",
    "error_line",
    "integer",
    "number",
    "one_line",
    "output_file",
    "output_file_or_stdout",
    "seconds",
    "sigterm_as_interrupt",
]


def add_fp8_arguments(p: Any) -> None:
    """``--fp8-scaling`` and ``--fp8-block``: the recipe of ``--precision fp8``
    (:func:`check_fp8_options` refuses them with another precision)."""
    p.add_argument("--fp8-scaling", choices=("block", "tensor"), default=None,
                   help="--precision fp8: block (DeepSeek-V3: 1x128 tiles, 128x128 blocks, "
                   "E4M3) or tensor (one scale per tensor, E5M2 gradients; current scaling); "
                   "default block")
    p.add_argument("--fp8-block", type=integer(1), default=None, metavar="B",
                   help="--precision fp8 block: the tile length B (1xB tiles, BxB blocks; "
                   "default 128)")


def check_fp8_options(options: dict[str, Any]) -> None:
    """ValueError (one line) when ``--fp8-scaling`` / ``--fp8-block`` come without
    ``--precision fp8``, or ``--fp8-block`` with ``--fp8-scaling tensor``: they would
    change nothing."""
    given = [f"--fp8-{k}" for k in ("scaling", "block") if options.get(f"fp8_{k}") is not None]
    if given and options.get("precision") != "fp8":
        verb = "sets" if len(given) == 1 else "set"
        raise ValueError(f"{' and '.join(given)} {verb} the recipe of --precision fp8, not of "
                         f"--precision {options.get('precision')}: add --precision fp8 or "
                         f"drop {'it' if len(given) == 1 else 'them'}")
    if options.get("fp8_block") is not None and options.get("fp8_scaling") == "tensor":
        raise ValueError("--fp8-block is the tile of block scaling; --fp8-scaling tensor has one "
                         "scale per tensor: drop --fp8-block or use --fp8-scaling block")


def add_json_options(p: argparse.ArgumentParser, what: str) -> None:
    """The one meaning of ``--json`` across verbs: ``--json`` prints ``what`` as JSON on
    stdout (instead of the text), ``--json-out FILE`` also writes it into FILE (a folder
    that exists; checked while parsing, before any work)."""
    p.add_argument("--json", action="store_true", help=f"print {what} as JSON instead of text")
    p.add_argument("--json-out", metavar="FILE", type=output_file,
                   help=f"also write {what} as JSON into FILE (into a folder that exists)")

