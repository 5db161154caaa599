"""The minipar command: verbs listed, unknown verbs refused."""

import subprocess
import sys

from minipar import cli


def test_help_lists_every_verb(capsys):
    assert cli.main(["--help"]) == 0
    out = capsys.readouterr().out
    for verb in cli.VERBS:
        assert verb in out


def test_unknown_verb_is_refused(capsys):
    assert cli.main(["frobnicate"]) == 2
    assert "unknown verb" in capsys.readouterr().err


def test_console_entry_point_runs():
    proc = subprocess.run(
        [sys.executable, "-m", "minipar.cli", "--help"], capture_output=True, text=True, timeout=60, check=False
    )
    assert proc.returncode == 0 and "verbs:" in proc.stdout
