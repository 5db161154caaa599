"""show_source: a notebook prints a function's real source, read from the package."""

from __future__ import annotations

import inspect

from minipar.spans import span
from minipar.viz.code import show_source, where


def test_show_source_says_where_and_prints_the_function_as_written() -> None:
    text = show_source(span)
    first, body = text.split("\n", 1)
    lines, start = inspect.getsourcelines(span)
    assert first == f"# minipar/spans.py, lines {start}-{start + len(lines) - 1}"
    assert body == inspect.getsource(span)
    assert where(span) == first[2:]


def test_show_source_without_the_docstring_keeps_the_code() -> None:
    text = show_source(span, docstring=False)
    assert span.__doc__.strip().splitlines()[0] not in text
    assert "def span(" in text and "return" in text
