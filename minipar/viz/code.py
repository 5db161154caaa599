"""The technique itself, shown in a notebook: a function's real source, read from the package.

EN source code · RU исходный код · ZH 源代码

A notebook that draws a schedule or a byte count puts the code that makes it
beside the picture, read from the installed package (never pasted, so it
cannot go stale): ``print(show_source(one_f_one_b))`` prints where the function
lives (the path from the repository root, as the glossary's ``code`` links
write it, and its line numbers), then the function as written.
"""

from __future__ import annotations

import inspect
from pathlib import Path
from typing import Any

import minipar

ROOT = Path(minipar.__file__).resolve().parent.parent


def where(obj: Any) -> str:
    """``minipar/parallel/pipeline/schedule.py, lines 40-58``: the file and lines of ``obj``."""
    path = Path(inspect.getsourcefile(obj) or "").resolve()
    lines, first = inspect.getsourcelines(obj)
    try:
        shown = path.relative_to(ROOT).as_posix()
    except ValueError:
        shown = path.as_posix()
    return f"{shown}, lines {first}-{first + len(lines) - 1}"


def show_source(obj: Any, docstring: bool = True) -> str:
    """The source of a function or class as written, under a line saying where it lives.

    ``docstring=False`` leaves the docstring out (the code alone, as the
    budget counts it)."""
    source = inspect.getsource(obj)
    if not docstring:
        doc = inspect.getdoc(obj)
        raw = obj.__doc__
        if doc and raw and raw in source:
            start = source.index(raw)
            q = source[start - 3:start]
            line_start = source.rfind("\n", 0, start) + 1
            line_end = source.index("\n", start + len(raw)) + 1
            if q in ('"""', "'''") and source[line_start:start - 3].strip() in ("", "r"):
                source = source[:line_start] + source[line_end:]
    return f"# {where(obj)}\n{source}"
