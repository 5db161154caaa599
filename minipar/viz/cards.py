"""Glossary cards in a notebook: the terms a notebook uses, in EN / RU / ZH.

Card · карточка термина · 术语卡片.  A notebook opens with the cards of the
words it is about, rendered from :mod:`minipar.glossary` (the TOML files in
``glossary/``), never copied into the notebook, so a corrected definition
shows up everywhere at once::

    from minipar.viz.cards import show_cards
    show_cards(["all-reduce", "ring-all-reduce"])

prints, for each term id, the card ``minipar glossary all-reduce`` prints:
the names in English, Russian and Chinese, the three definitions, the seed
quotes, the papers and whether each linked module, notebook or command
exists now.  ``minipar glossary --list`` lists every id.

Text, not a figure: nothing here imports matplotlib or NumPy; the renderer
is the glossary library's (:func:`minipar.glossary.render.card`, the one
``minipar glossary TERM`` prints), never a command-line module.
"""

from __future__ import annotations

from collections.abc import Sequence

WIDTH = 100  # columns; a notebook cell is wider than a terminal's default 80


def cards_text(ids: Sequence[str], width: int = WIDTH, lang: str | None = None) -> str:
    """The cards of the term ``ids`` (in the given order) as one string, separated by blank lines.

    ``lang`` ("en", "ru" or "zh") shows that language only: its names, its
    definition and the seed quotes written in it, each with its English correction.  An id that is not in the glossary raises ``ValueError``
    naming the closest ids, before anything is rendered.
    """
    from minipar import glossary as g
    from minipar.glossary.render import card  # the one renderer (``minipar glossary TERM``)

    if isinstance(ids, str):
        raise ValueError(f"show_cards takes a list of term ids, not one string: [{ids!r}]")  # noqa: TRY004
    if lang is not None and lang not in g.LANGS:
        raise ValueError(f"lang must be one of {', '.join(g.LANGS)} or None, not {lang!r}")
    terms = g.by_id()
    for i in ids:
        if i not in terms:
            near = ", ".join(t.id for t in g.closest(i)) or "none close"
            raise ValueError(f"{i!r} is not a glossary id (closest: {near}); "
                             "`minipar glossary --list` shows every id")
    return "\n\n".join(card(terms[i], lang=lang, width=width) for i in ids)


def show_cards(ids: Sequence[str], width: int = WIDTH, lang: str | None = None) -> None:
    """Print the cards of the term ``ids``: names and definitions in EN / RU / ZH.

    >>> show_cards(["all-reduce", "ring-all-reduce"])   # doctest: +SKIP
    ── all-reduce ──────────────────────────────────────────────────────────
    EN  All-reduce ...
    RU  ...
    ZH  ...
    """
    print(cards_text(ids, width=width, lang=lang))
