"""How long a technique is to read: its code lines, counted one way everywhere.

EN code lines · RU строки кода · ZH 代码行数

A glossary term's ``code`` link names the files that hold the technique itself
(its *core*), in reading order, as paths from the repository root
(``minipar/parallel/pipeline/schedule.py``).  :func:`code_file` finds such a path
in a checkout and in an installed package alike; :func:`code_lines` counts what
a learner reads as code: every line that holds a token of Python, minus
docstrings, comments and blank lines (Python's own ``tokenize`` and ``ast``,
not ``wc``).  ``minipar glossary TERM`` prints these counts ("Read the code:")
and ``tests/test_core_budget.py`` holds every term to its budget with the same
function, so the two can never disagree.

Nothing of minipar is imported here (a leaf of the glossary package).
"""

from __future__ import annotations

import ast
import io
import tokenize
from pathlib import Path

from minipar.glossary.data import PKG_DIR

#: tokens that are not code a learner reads
_NOT_CODE = frozenset({tokenize.COMMENT, tokenize.NL, tokenize.NEWLINE, tokenize.INDENT,
                       tokenize.DEDENT, tokenize.ENCODING, tokenize.ENDMARKER})


def code_file(target: str) -> Path | None:
    """The file of a ``code`` link (``minipar/...py``, from the repository root), if it exists.

    Resolved next to the ``minipar`` package that is running, so it works in a
    checkout and in a wheel installed in ``site-packages`` alike."""
    parts = Path(target).parts
    if not parts or parts[0] != "minipar" or not target.endswith(".py"):
        return None
    path = PKG_DIR.joinpath(*parts[1:])
    return path if path.is_file() else None


def docstring_lines(tree: ast.AST) -> set[int]:
    """Line numbers of every string that stands alone as a statement (docstrings)."""
    out: set[int] = set()
    for node in ast.walk(tree):
        if (isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant)
                and isinstance(node.value.value, str)):
            out.update(range(node.lineno, node.end_lineno + 1))
    return out


def code_lines(source: str | Path) -> int:
    """Lines of Python code in a file (a ``Path``) or a source text (a ``str``).

    A line counts if a token other than a comment, a newline or indentation
    starts or continues on it and it is not part of a docstring.  A statement
    wrapped over three lines is three lines: a learner reads all three.

    >>> code_lines("'doc'\\n\\n# note\\nx = 1  # one\\ny = (2,\\n     3)\\n")
    3
    """
    text = source.read_text(encoding="utf-8") if isinstance(source, Path) else source
    doc = docstring_lines(ast.parse(text))
    lines: set[int] = set()
    for tok in tokenize.generate_tokens(io.StringIO(text).readline):
        if tok.type not in _NOT_CODE:
            lines.update(n for n in range(tok.start[0], tok.end[0] + 1) if n not in doc)
    return len(lines)
