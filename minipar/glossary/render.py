"""Glossary cards as text — карточки глоссария — 术语卡片: cards, the term table, families, Markdown.

EN rendering · RU отображение · ZH 渲染

The text forms of :mod:`minipar.glossary` that the ``minipar glossary``
command prints, that notebooks show (:mod:`minipar.viz.cards`) and that
``docs/glossary.md`` is made of.  Widths are counted in terminal columns (a
CJK character takes two); long names wrap, never get cut.  Imports nothing
heavy and nothing of the command line.
"""

from __future__ import annotations

import unicodedata

from minipar import glossary as g
from minipar.glossary.code_lines import code_file, code_lines
from minipar.glossary.links import link_status

LABEL = {"en": "EN", "ru": "RU", "zh": "ZH"}


# --------------------------------------------------------------------------- text layout

def _cw(c: str) -> int:
    return 2 if unicodedata.east_asian_width(c) in "WF" else 1


def display_width(s: str) -> int:
    """Terminal columns of ``s`` (CJK characters take two)."""
    return sum(_cw(c) for c in s)


#: CJK and Latin punctuation that closes (never starts a line) or opens (never ends one):
#: 「专家容量（容量因子）」 must not leave 「）」 alone on the next line (the rule 禁則 / 避头尾)
CLOSING = set("）」』】》〉〕］｝”’。，、；：！？…・·)]}")
OPENING = set("（「『【《〈〔［｛“‘([{")


def _glue(units: list[str]) -> list[str]:
    """Join a closing mark to the unit before it and an opening mark to the unit after it."""
    out: list[str] = []
    for u in units:
        if out and out[-1] != " " and (u[0] in CLOSING or out[-1][-1] in OPENING) and u != " ":
            out[-1] += u
        else:
            out.append(u)
    return out


def wrap(text: str, width: int, indent: str = "") -> list[str]:
    """Wrap to ``width`` terminal columns at spaces, after hyphens and between CJK characters.

    Later lines are indented by ``indent``; nothing is ever cut (a word wider
    than ``width`` gets a line of its own).  A line never starts with closing
    punctuation (「）」, 「。」) nor ends with opening punctuation (「（」).
    """
    width = max(width, len(indent) + 10)
    units: list[str] = []
    word = ""
    text = text.replace("\n", " ")
    for i, c in enumerate(text):
        if c == " " or _cw(c) == 2:
            if word:
                units.append(word)
                word = ""
            units.append(c)
        elif c == "-" and len(word) >= 3 and text[i + 1: i + 3].isalpha():  # "communication-|efficient"
            units.append(word + c)
            word = ""
        else:
            word += c
    if word:
        units.append(word)
    units = _glue(units)
    lines: list[str] = []
    cur = ""
    for u in units:
        if u == " " and not cur.strip():
            continue
        if display_width(cur) + display_width(u) > width and cur.strip():
            lines.append(cur.rstrip())
            cur = indent + ("" if u == " " else u)
        else:
            cur += u
    if cur.strip():
        lines.append(cur.rstrip())
    return lines


def fill_names(names: list[str], width: int, sep: str = " ·") -> list[str]:
    """Lay ``names`` out on lines of ``width`` columns, joined by ``sep``, never split needlessly.

    A name that does not fit on the current line starts the next one whole
    («ZeRO（零冗余优化器）», not «ZeRO（零冗余优» / «化器）»); only a name wider
    than a whole line is wrapped (by :func:`wrap`).
    """
    lines: list[str] = []
    cur = ""
    for i, name in enumerate(names):
        piece = name + (sep if i < len(names) - 1 else "")
        joined = f"{cur} {piece}" if cur else piece
        if display_width(joined) <= width:
            cur = joined
        elif cur and display_width(piece) <= width:
            lines.append(cur)
            cur = piece
        else:
            *done, cur = wrap(joined, width)
            lines += done
    return lines + ([cur] if cur else [])


def terminal_width() -> int:
    """Columns to fill: ``shutil.get_terminal_size`` (COLUMNS, else the terminal), 40..100."""
    import shutil

    return max(40, min(100, shutil.get_terminal_size((100, 24)).columns))


# --------------------------------------------------------------------------- rendering

def seed_groups(term: g.Term, lang: str | None = None) -> list[tuple[str, list[dict]]]:
    """The term's seed quotes grouped by document, each under its label, in the data's order.

    The label says what the quotes are ("As written in a machine-translated
    Chinese article (errors kept)", :func:`minipar.glossary.seed_label`): the
    seeds' own words, mistakes included, shown after the clean definitions so
    that they never read as the glossary's.  With ``lang``, only the
    documents written in that language (:func:`minipar.glossary.seed_lang`).
    """
    groups: dict[str, list[dict]] = {}
    for s in term.seeds:
        if lang is not None and g.seed_lang(s["file"]) != lang:
            continue
        groups.setdefault(g.seed_label(s["file"]), []).append(s)
    return list(groups.items())


def card(term: g.Term, lang: str | None = None, width: int | None = None, status: bool = True) -> str:
    """A readable card for one term.

    ``lang`` limits it to one language: that language's names and
    definition, and only the quotes of the seed documents written in it
    (with their corrections, which are in English); papers and links stay.
    """
    w = width or terminal_width()
    langs = [lang] if lang else list(g.LANGS)
    head = f"── {term.id} "
    out = [head + "─" * max(0, w - display_width(head))]
    for la in langs:
        names = term.names[la]
        if term.aliases.get(la):
            names += "  (" + ", ".join(term.aliases[la]) + ")"
        out += wrap(f"{LABEL[la]}  {names}", w, "    ")
    if term.abbrev:
        out.append("    abbreviations: " + ", ".join(term.abbrev))
    out.append("")
    for la in langs:
        out += wrap(f"{LABEL[la]}  {term.definition[la]}", w, "    ")
    for label, seeds in seed_groups(term, lang):
        out.append("")
        out += wrap(label + ":", w, "    ")
        for s in seeds:  # wrap() drops leading spaces: indent after wrapping
            out += ["  " + x for x in wrap(f"«{s['quote']}»", w - 2, " ")]
            if s.get("correction"):
                out += ["    " + x for x in wrap(f"Correction: {s['correction']}", w - 4, "  ")]
    if term.papers:
        out.append("")
        out.append("Papers:")
        for p in term.papers:
            out += wrap(f"  - {p}", w, "    ")
        out.append("")
    if term.related:
        out += wrap("Related: " + ", ".join(term.related), w, "    ")
    out += read_the_code(term)
    titles = {"modules": "Modules", "notebooks": "Notebooks", "commands": "Run",
              "exercises": "Exercises"}
    for kind, title in titles.items():
        targets = term.links.get(kind, [])
        if targets:
            items = []
            for t in targets:
                st = link_status(kind, t) if status else None
                items.append(f"{t} (planned)" if st == "planned" else t)
            out += wrap(f"{title}: " + "; ".join(items), w, "    ")
    return "\n".join(out)


def read_the_code(term: g.Term) -> list[str]:
    """The card's "Read the code:" lines: each core file of the term and its code lines.

    Counted by :func:`minipar.glossary.code_lines.code_lines`, the counter the
    budget test uses; a file that is not there reads "(missing)"."""
    files = term.links.get("code", [])
    if not files:
        return []
    width = max(len(f) for f in files)
    out, total = ["Read the code: (the technique itself, in reading order)"], 0
    for f in files:
        path = code_file(f)
        n = code_lines(path) if path else None
        total += n or 0
        out.append(f"  {f:<{width}}  " + (f"{n:>4} code lines" if path else "(missing)"))
    if len(files) > 1:
        out.append(f"  {'in all':<{width}}  {total:>4} code lines")
    return out


def table(lang: str | None = None, width: int | None = None) -> str:
    """All terms: id and the names in each language, in columns fitted to the width.

    A name longer than its column wraps onto the next lines of its row (at
    spaces, or between CJK characters); no name is ever cut.  A column is
    never narrower than its longest unbreakable word.
    """
    w = width or terminal_width()
    langs = [lang] if lang else list(g.LANGS)
    rows = [("id", *[LABEL[la] for la in langs])]
    rows += [(t.id, *[t.names[la] for la in langs]) for t in g.terms()]
    idw = max(len(r[0]) for r in rows)
    # each column at least its longest unbreakable piece, then widened in turn up to its longest name
    cols = [max(display_width(x) for r in rows for x in wrap(r[i], 10)) for i in range(1, len(langs) + 1)]
    full = [max(display_width(r[i]) for r in rows) for i in range(1, len(langs) + 1)]
    spare = w - idw - 2 * len(langs) - sum(cols)
    while spare > 0 and any(c < f for c, f in zip(cols, full)):
        for i in range(len(cols)):
            if spare > 0 and cols[i] < full[i]:
                cols[i] += 1
                spare -= 1

    def pad(s: str, col: int) -> str:
        return s + " " * (col - display_width(s))

    lines = []
    for r in rows:
        cells = [wrap(c, col) or [""] for c, col in zip(r[1:], cols)]
        for k in range(max(len(c) for c in cells)):
            left = r[0].ljust(idw) if k == 0 else " " * idw
            parts = [pad(c[k] if k < len(c) else "", col) for c, col in zip(cells, cols)]
            lines.append("  ".join([left, *parts]).rstrip())
    lines.insert(1, "-" * min(w, idw + sum(c + 2 for c in cols)))
    lines.append(f"\n{len(rows) - 1} terms.  minipar glossary TERM for a card.")
    return "\n".join(lines)


def topic_list(topic: g.Topic, lang: str | None = None, width: int | None = None) -> str:
    """A family of terms ("sharding"): one line per term with its names, and how to see a card."""
    w = width or terminal_width()
    langs = [lang] if lang else list(g.LANGS)
    table_ = g.by_id()
    out = wrap(f"«{topic.title}» names a family of {len(topic.terms)} terms:", w, "    ")
    for tid in topic.terms:
        out.append(f"  {tid}")
        out += ["      " + x for x in fill_names([table_[tid].names[la] for la in langs], w - 6)]
    out.append("")
    out.append(f"A card: minipar glossary {topic.terms[0]}   (or --all for every card)")
    return "\n".join(out)


def markdown() -> str:
    """``docs/glossary.md``: every term from the data, with no computed status (never stale)."""
    ts = g.terms()
    out = ["# Glossary · Глоссарий · 术语表", "",
           ("<!-- Generated from glossary/*.toml by `minipar glossary --export-md docs/glossary.md`;"
            " do not edit by hand (tests/test_glossary_data.py fails when it is stale). -->"), "",
           (f"{len(ts)} terms in English, Russian and Chinese. Look one up with "
            "`minipar glossary QUERY` (any language, typos and inflected forms welcome), or find "
            "the terms in a text with `minipar glossary --scan FILE`."), "",
           "| id | English | Русский | 中文 |", "|---|---|---|---|"]
    out += [f"| [{t.id}](#{t.id}) | {t.names['en']} | {t.names['ru']} | {t.names['zh']} |" for t in ts]
    for t in ts:
        out += ["", f"## {t.id}", ""]
        for la in g.LANGS:
            al = f" ({', '.join(t.aliases[la])})" if t.aliases.get(la) else ""
            out.append(f"- **{LABEL[la]}** {t.names[la]}{al}")
        if t.abbrev:
            out.append(f"- **Abbreviations** {', '.join(t.abbrev)}")
        out.append("")
        for la in g.LANGS:
            out += [f"**{LABEL[la]}** {t.definition[la]}", ""]
        for label, seeds in seed_groups(t):
            out += [f"{label}:", ""]
            for s in seeds:
                quote = s["quote"].replace("\n", " / ")
                out.append(f"> «{quote}»")
                if s.get("correction"):
                    out.append(f">\n> **Correction:** {s['correction']}")
                out.append("")
        if t.papers:
            out += ["Papers:", ""] + [f"- {p}" for p in t.papers] + [""]
        if t.related:
            out += ["Related: " + ", ".join(f"[{r}](#{r})" for r in t.related), ""]
        if t.links.get("code"):
            out += ["Read the code: " + ", ".join(f"`{x}`" for x in t.links["code"]), ""]
        for kind, title in (("modules", "Modules"), ("notebooks", "Notebooks"),
                            ("commands", "Run"), ("exercises", "Exercises")):
            if t.links.get(kind):
                out += [f"{title}: " + ", ".join(f"`{x}`" for x in t.links[kind]), ""]
    return "\n".join(out).rstrip() + "\n"
