"""The embedded corpus — встроенный корпус — 内置语料.

The text ``minipar train --text`` learns when it is given no file: minipar's
own words, read from the *installed* package, so it is there offline on a
fresh machine, from a checkout, an editable install or a plain wheel alike.
Two parts, in this order:

1. **The glossary cards** (:func:`glossary_cards`): for every term of
   ``glossary/`` (sorted by id), its name and definition in English, Russian
   and Chinese, one after the other, a blank line between terms.  They are
   read through :func:`minipar.glossary.data.terms`, i.e. from the data the
   wheel ships as ``minipar/_glossary`` (a checkout's ``glossary/`` when run
   from one): the same path ``minipar glossary`` reads.  The machine-translated
   seed quotes are left out: they are kept for their mistakes.
2. **The module docstrings** (:func:`module_docstrings`): every ``.py`` file
   of the ``minipar`` package directory (sorted by dotted module name), its
   name on a line and its docstring as :func:`ast.get_docstring` returns it.
   ``docs/`` and the notebooks are not in the wheel; the module docstrings
   are, and they teach the same things (each opens with its term in English,
   Russian and Chinese).

The order matters because :class:`minipar.data.text.TextData` holds out the
*last* 10% of the bytes for validation: every glossary card, the bulk of the
Russian and Chinese text, is in the training split, and validation is the
docstrings of the last modules by name (from within ``minipar.plan`` to
``minipar.viz``) — text in the same voice, and the same three title
languages, that the model has not seen.

Deterministic: the same installed files give the same bytes
(:attr:`~minipar.data.text.TextData.sha256` records which).  When this was
written the corpus was 469 KB: 70 KB of cards (62 terms) and 399 KB of
docstrings (251 modules), 433,000 characters of which 20,300 Cyrillic and
5,800 CJK code points; the unigram entropy of its training split was 3.83
nats per byte.  :func:`stats` measures it now, and ``tests/test_text_data.py``
checks its lower bounds.
"""

from __future__ import annotations

import ast
import io
import re
import tokenize
from functools import cache

from minipar.glossary import data as glossary_data

#: the corpus's name in messages and checkpoints
NAME = "the embedded corpus"

#: code point ranges counted by :func:`script_counts`
SCRIPTS: dict[str, str] = {
    "cyrillic": "\u0400-\u052f",  # Cyrillic and its supplement (Russian: а-я, ё)
    "cjk": "\u3400-\u4dbf\u4e00-\u9fff\uf900-\ufaff",  # Han ideographs (ext. A, unified, compat.)
}


@cache
def glossary_cards() -> str:
    """Every glossary term's name and definition in en, ru, zh; terms sorted by id."""
    cards = []
    for term in glossary_data.terms():
        cards.append("\n".join(f"{term.names[lang]}\n{term.definition[lang]}"
                               for lang in glossary_data.LANGS))
    return "\n\n".join(cards)


def docstring(source: str) -> str | None:
    """``ast.get_docstring`` of a module's source, parsing only its first statement.

    A docstring is a first statement that starts with a string token; that
    statement ends at the first NEWLINE token, so the rest of the file (most of
    the time of ``ast.parse``) is never parsed.
    """
    tokens = tokenize.generate_tokens(io.StringIO(source).readline)
    for tok in tokens:
        if tok.type in (tokenize.COMMENT, tokenize.NL, tokenize.ENCODING):
            continue
        if tok.type != tokenize.STRING:
            return None
        for end in tokens:
            if end.type == tokenize.NEWLINE:
                head = "".join(source.splitlines(keepends=True)[:end.end[0]])
                return ast.get_docstring(ast.parse(head))
    return None


@cache
def module_docstrings() -> str:
    """Every module of the installed ``minipar`` package that has a docstring: its dotted
    name, then its docstring; modules sorted by name."""
    root = glossary_data.PKG_DIR
    found = []
    for path in root.rglob("*.py"):
        parts = path.relative_to(root.parent).with_suffix("").parts
        name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        doc = docstring(path.read_text(encoding="utf-8"))
        if doc:
            found.append((name, doc))
    return "\n\n".join(f"{name}\n{doc}" for name, doc in sorted(found))


def text() -> str:
    """The corpus: the glossary cards, then the module docstrings (each read once per process)."""
    return glossary_cards() + "\n\n" + module_docstrings() + "\n"


def data() -> bytes:
    """The corpus as UTF-8 bytes (what :func:`minipar.data.text.load` trains on)."""
    return text().encode("utf-8")


def script_counts(s: str) -> dict[str, int]:
    """Code points of ``s`` per script of :data:`SCRIPTS`, plus ``ascii`` and ``other``."""
    out = {name: len(re.findall(f"[{ranges}]", s)) for name, ranges in SCRIPTS.items()}
    out["ascii"] = len(re.findall("[\x00-\x7f]", s))
    out["other"] = len(s) - sum(out.values())
    return out


def stats() -> dict[str, int]:
    """The corpus measured: bytes (total, cards, docstrings), characters, and code points
    per script (:func:`script_counts`)."""
    s = text()
    return {"bytes": len(s.encode("utf-8")), "characters": len(s),
            "glossary_bytes": len(glossary_cards().encode("utf-8")),
            "docstring_bytes": len(module_docstrings().encode("utf-8")), **script_counts(s)}
