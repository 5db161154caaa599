"""Hints in levels: ``minipar exercise hint NAME`` gives the next one, and remembers.

EN hints · RU подсказки · ZH 提示

Each exercise's ``hints.py`` holds ``HINTS``, a tuple from a nudge (level 1:
which idea to use) to the detailed steps (the last level: the indices of
every send and receive).  The skeleton teaches the goal and what is graded;
the steps come one level at a time, when the learner asks for them.

The level reached is kept per exercise in a small JSON file in the
exercise's working folder (``--dir``, the folder ``minipar exercise start``
wrote into): ``.minipar-hints.json``, e.g. ``{"ring_allreduce": 2}``.  A
missing or unreadable file means no hint was given yet.
"""

from __future__ import annotations

import json
from pathlib import Path

STATE_FILE = ".minipar-hints.json"


def _read(folder: Path) -> dict[str, int]:
    try:
        data = json.loads((folder / STATE_FILE).read_text())
    except (OSError, ValueError):
        return {}
    return {k: v for k, v in data.items() if isinstance(v, int)} if isinstance(data, dict) else {}


def level_reached(folder: Path, name: str) -> int:
    """How many hints of exercise ``name`` were given in ``folder`` (0: none)."""
    return _read(folder).get(name, 0)


def next_hint(folder: Path, name: str, hints: tuple[str, ...]) -> tuple[int, str]:
    """(level, text) of the next hint, remembered in ``folder``; the last level repeats.

    Raises ``OSError`` when the state file cannot be written."""
    state = _read(folder)
    level = min(state.get(name, 0) + 1, len(hints))
    state[name] = level
    (folder / STATE_FILE).write_text(json.dumps(state, indent=1, sort_keys=True) + "\n")
    return level, hints[level - 1]


def reset(folder: Path, name: str) -> None:
    """Forget the hints of ``name`` given in ``folder`` (the next one is level 1 again)."""
    state = _read(folder)
    if state.pop(name, None) is not None:
        (folder / STATE_FILE).write_text(json.dumps(state, indent=1, sort_keys=True) + "\n")
