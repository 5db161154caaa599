"""The minipar command: verbs listed, unknown verbs refused, Ctrl-C and SIGTERM are one line.

Bad options of each verb: tests/test_bad_input.py.
"""

import signal
import subprocess
import sys

import pytest

from minipar import cli
from minipar.cli.options import Terminated
from minipar.registry import BENCHES, STRATEGIES, VERBS


def test_help_lists_every_verb(capsys):
    assert cli.main(["--help"]) == 0
    out = capsys.readouterr().out
    for verb in cli.VERBS:
        assert verb in out


def test_unknown_verb_is_refused_in_one_line(capsys):
    assert cli.main(["frobnicate"]) == 2
    err = capsys.readouterr().err
    assert err.splitlines() == [
        (f"minipar: unknown verb 'frobnicate'; one of {', '.join(cli.VERBS)} "
         "(minipar --help describes them)")
    ]


def test_a_verbs_help_and_usage_errors_return_their_status(capsys):
    assert cli.main(["plan", "--help"]) == 0  # argparse's SystemExit(0) becomes a status
    assert "--params" in capsys.readouterr().out
    assert cli.main(["exercise", "nope"]) == 2
    assert capsys.readouterr().err.count("\n") == 1
    assert cli.main(["bench", "dp", "--rounds", "0"]) == 2  # a bench through the same path
    assert capsys.readouterr().err == "minipar bench dp: --rounds must be a positive integer, got 0\n"


def test_only_the_verb_table_turns_systemexit_into_a_status():
    """One error path: no verb catches argparse's ``SystemExit`` (``--help``, a bad option);
    ``minipar.cli.main`` alone turns it into the exit status (the source read, not run).
    A handler that only looks and raises it again (the rank wrapper notes its MPI_Abort
    status) turns nothing into a status, so it is not counted."""
    import ast
    from pathlib import Path

    root = Path(cli.__file__).resolve().parent.parent
    catching = []
    for path in sorted(root.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.ExceptHandler) and (node.type is None or "SystemExit" in {
                    n.id for n in ast.walk(node.type) if isinstance(n, ast.Name)}) and not (
                    isinstance(node.body[-1], ast.Raise) and node.body[-1].exc is None
                    and not any(isinstance(n, ast.Return) for n in ast.walk(node))):
                catching.append(path.relative_to(root.parent).as_posix())
    assert catching == ["minipar/cli/__init__.py"], catching


def test_console_entry_point_runs():
    proc = subprocess.run(
        [sys.executable, "-m", "minipar.cli", "--help"], capture_output=True, text=True, timeout=60, check=False
    )
    assert proc.returncode == 0 and "verbs:" in proc.stdout


def test_keyboard_interrupt_in_a_verb_is_one_line(monkeypatch, capsys):
    import minipar.cli.plan

    def interrupted(argv):
        raise KeyboardInterrupt

    monkeypatch.setattr(minipar.cli.plan, "main", interrupted)
    assert cli.main(["plan", "--params", "1e9", "-n", "4"]) == 130
    out, err = capsys.readouterr()
    assert err == "minipar: interrupted\n" and out == ""


def test_sigterm_in_a_verb_is_one_line_and_exit_143(monkeypatch, capsys):
    """While a verb runs, SIGTERM raises Terminated (a KeyboardInterrupt, so every cleanup
    written for Ctrl-C runs); afterwards SIGTERM's default action is back."""
    import minipar.cli.plan

    seen = []

    def terminated(argv):
        seen.append(signal.getsignal(signal.SIGTERM))
        raise Terminated

    monkeypatch.setattr(minipar.cli.plan, "main", terminated)
    assert cli.main(["plan", "--params", "1e9", "-n", "4"]) == 143
    out, err = capsys.readouterr()
    assert err == "minipar: terminated\n" and out == ""
    assert seen[0] not in (signal.SIG_DFL, signal.SIG_IGN)  # minipar's handler was installed
    assert signal.getsignal(signal.SIGTERM) == signal.SIG_DFL


@pytest.mark.skipif(sys.platform == "win32", reason="signals to a child need POSIX")
@pytest.mark.parametrize("sig, code, line", [
    (signal.SIGTERM, 143, "minipar: terminated"),   # `kill`, `timeout`, a scheduler
    (signal.SIGINT, 130, "minipar: interrupted"),   # what Ctrl-C sends
    (getattr(signal, "SIGHUP", 1), 129, "minipar: hung up"),  # the terminal was closed
])
def test_a_signal_during_training_is_one_line_and_its_exit_code(sig, code, line):
    """SIGTERM, SIGINT or SIGHUP to a real `minipar train` mid-run: one line, 143 / 130 /
    129, no traceback."""
    proc = subprocess.Popen([sys.executable, "-m", "minipar.cli", "train", "--steps", "100000"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        first = proc.stderr.readline()  # the progress bar after step 1: training has started
        assert first.startswith("step "), first
        proc.send_signal(sig)
        out, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == code
    assert "Traceback" not in err and out == ""
    assert err.splitlines()[-1:] == [line]
    assert all(ln.startswith("step ") for ln in err.splitlines()[:-1])


def test_a_closed_pipe_is_not_a_traceback():
    """`minipar plan ... | head -1`: the reader leaves early; minipar exits 0 without a traceback."""
    proc = subprocess.Popen([sys.executable, "-m", "minipar.cli", "plan", "--params", "7.5e9",
                             "-n", "64"], stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    proc.stdout.close()  # before the child writes: its first write gets EPIPE
    err = proc.stderr.read().decode()
    assert proc.wait(timeout=60) == 0 and err == ""


# ------------------------------------------------------------------ every option's help
#: verb argv (before --help) whose parser the walk reads: every verb, every strategy, every bench
HELP_VERBS = [*[[v] for v in VERBS if v not in ("run", "bench")],
              *[["run", s] for s in STRATEGIES], *[["bench", b] for b in BENCHES]]


def _parsers(argv, monkeypatch):
    """The parsers ``minipar ARGV --help`` builds (sub-parsers included), read where they
    parse instead of printing: every verb builds its parser on the way to ``parse_args``."""
    import argparse

    from minipar.cli import options

    seen = []

    def record(self, args=None, namespace=None):
        seen.append(self)
        raise SystemExit(0)

    monkeypatch.setattr(options.ArgumentParser, "parse_args", record)
    assert cli.main([*argv, "--help"]) == 0
    todo = list(seen)
    while todo:
        p = todo.pop()
        yield p
        for a in p._actions:
            if isinstance(a, argparse._SubParsersAction):
                todo.extend(a.choices.values())


def _shows(text, default):
    """Does ``text`` show ``default``: as written, as ``%g`` writes a number, or a list's
    items joined by spaces or commas?"""
    if isinstance(default, (list, tuple)):
        forms = [" ".join(map(str, default)), ",".join(map(str, default))]
    elif isinstance(default, (int, float)) and not isinstance(default, bool):
        forms = [str(default), f"{default:g}"]
    else:
        forms = [str(default)]
    return "default" in text and any(f in text for f in forms)


@pytest.mark.parametrize("argv", HELP_VERBS, ids=[" ".join(a) for a in HELP_VERBS])
def test_every_option_has_help_that_shows_its_default(argv, monkeypatch):
    import argparse

    options = 0
    for p in _parsers(argv, monkeypatch):
        for a in p._actions:
            if (isinstance(a, (argparse._HelpAction, argparse._SubParsersAction))
                    or a.help == argparse.SUPPRESS or not a.option_strings):
                continue
            text = p._get_formatter()._expand_help(a) if a.help else ""
            assert text.strip(), f"minipar {' '.join(argv)} {a.option_strings[-1]}: no help"
            options += 1
            if a.nargs == 0 or a.default is None:  # a flag, or no default to show
                continue
            assert _shows(text, a.default), (
                f"minipar {' '.join(argv)} {a.option_strings[-1]}: the help {text!r} does not "
                f"show the default {a.default!r}")
    assert options >= 2  # the walk found the verb's parser and read its options
