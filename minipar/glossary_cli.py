"""``minipar glossary``: look up, scan, list and export the trilingual glossary.

    minipar glossary all-reduce            a card: names, definitions (EN/RU/ZH), seeds, papers, links
    minipar glossary "параллелизма данных" --lang ru
    minipar glossary 张量切分体例 --json     matches, best first: id, en, ru, zh, score
    minipar glossary sharding              a word for a family of terms: the family, listed
    minipar glossary --scan FILE|-         every term named in a text, with character offsets
    minipar glossary --list                all terms in three languages
    minipar glossary --export-md docs/glossary.md

Cards show whether each linked module, notebook, exercise and command exists
*now* (computed from the files, never stored): a link that has not landed yet
reads "planned" (a command, too, until its verb, benchmark or strategy is
in ``minipar.registry``).  Seeds are named by title ("Russian glossary"),
never by file name.  ``--list`` wraps long names, never cuts them.  The exported Markdown has no such status, so it does not go
stale when a module lands.  Imports nothing heavy (no NumPy, no mpi4py).
"""

from __future__ import annotations

import argparse
import os
import sys
import unicodedata
from pathlib import Path

from minipar import glossary as g
from minipar.glossary.links import link_status  # re-exported: the library computes it (registry)

LABEL = {"en": "EN", "ru": "RU", "zh": "ZH"}
MAX_QUERY = 1000  # characters; a longer "query" is a text: use --scan


# --------------------------------------------------------------------------- text layout

def _cw(c: str) -> int:
    return 2 if unicodedata.east_asian_width(c) in "WF" else 1


def display_width(s: str) -> int:
    """Terminal columns of ``s`` (CJK characters take two)."""
    return sum(_cw(c) for c in s)


def wrap(text: str, width: int, indent: str = "") -> list[str]:
    """Wrap to ``width`` terminal columns at spaces, after hyphens and between CJK characters.

    Later lines are indented by ``indent``; nothing is ever cut (a word wider
    than ``width`` gets a line of its own).
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


def terminal_width() -> int:
    """Columns to fill: ``shutil.get_terminal_size`` (COLUMNS, else the terminal), 40..100."""
    import shutil

    return max(40, min(100, shutil.get_terminal_size((100, 24)).columns))


# --------------------------------------------------------------------------- rendering

def card(term: g.Term, lang: str | None = None, width: int | None = None, status: bool = True) -> str:
    """A readable card for one term; ``lang`` limits the definitions to one language."""
    w = width or terminal_width()
    langs = [lang] if lang else list(g.LANGS)
    head = f"── {term.id} "
    out = [head + "─" * max(0, w - display_width(head))]
    for la in g.LANGS:
        names = term.names[la]
        if term.aliases.get(la):
            names += "  (" + ", ".join(term.aliases[la]) + ")"
        out += wrap(f"{LABEL[la]}  {names}", w, "    ")
    if term.abbrev:
        out.append("    abbreviations: " + ", ".join(term.abbrev))
    out.append("")
    for la in langs:
        out += wrap(f"{LABEL[la]}  {term.definition[la]}", w, "    ")
    for s in term.seeds:
        out.append("")
        out += wrap(f"Seed ({g.seed_title(s['file'])}): «{s['quote']}»", w, "    ")
        if s.get("correction"):
            out += wrap(f"  Correction: {s['correction']}", w, "    ")
    if term.papers:
        out.append("")
        out.append("Papers:")
        for p in term.papers:
            out += wrap(f"  - {p}", w, "    ")
        out.append("")
    if term.related:
        out += wrap("Related: " + ", ".join(term.related), w, "    ")
    titles = {"modules": "Code", "notebooks": "Notebooks", "commands": "Run", "exercises": "Exercises"}
    for kind, title in titles.items():
        targets = term.links.get(kind, [])
        if targets:
            items = []
            for t in targets:
                st = link_status(kind, t) if status else None
                items.append(f"{t} (planned)" if st == "planned" else t)
            out += wrap(f"{title}: " + "; ".join(items), w, "    ")
    return "\n".join(out)


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
        out += ["      " + x for x in wrap(" · ".join(table_[tid].names[la] for la in langs), w - 6)]
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
        for s in t.seeds:
            quote = s["quote"].replace("\n", " / ")
            out.append(f"> Seed ({g.seed_title(s['file'])}): «{quote}»")
            if s.get("correction"):
                out.append(f">\n> **Correction:** {s['correction']}")
            out.append("")
        if t.papers:
            out += ["Papers:", ""] + [f"- {p}" for p in t.papers] + [""]
        if t.related:
            out += ["Related: " + ", ".join(f"[{r}](#{r})" for r in t.related), ""]
        for kind, title in (("modules", "Code"), ("notebooks", "Notebooks"),
                            ("commands", "Run"), ("exercises", "Exercises")):
            if t.links.get(kind):
                out += [f"{title}: " + ", ".join(f"`{x}`" for x in t.links[kind]), ""]
    return "\n".join(out).rstrip() + "\n"


# --------------------------------------------------------------------------- command

def _read_text(src: str) -> str:
    data = sys.stdin.buffer.read() if src == "-" else Path(src).read_bytes()
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        print(f"minipar glossary: {'standard input' if src == '-' else src} is not valid UTF-8 "
              f"(byte {exc.start}); undecodable bytes were replaced by U+FFFD and offsets refer "
              "to the decoded text", file=sys.stderr)
        return data.decode("utf-8", errors="replace")


def _clean(s: str) -> str:
    """Command-line text with undecodable bytes (surrogate escapes) made printable."""
    return s.encode("utf-8", "surrogateescape").decode("utf-8", "replace")


def _parser() -> argparse.ArgumentParser:
    from minipar.cli_errors import ArgumentParser, output_file_or_stdout

    p = ArgumentParser(prog="minipar glossary", description=__doc__.split("\n\n")[0],
                       formatter_class=argparse.RawDescriptionHelpFormatter,
                       epilog="\n".join(__doc__.split("\n\n")[1].splitlines()))
    p.add_argument("query", nargs="*",
                   help="a term in English, Russian or Chinese (default: none; required without "
                        "--scan, --list or --export-md)")
    p.add_argument("--lang", choices=g.LANGS,
                   help="definitions (and --list columns) in one language (default: all three)")
    p.add_argument("--json", action="store_true",
                   help="machine-readable output (default: off, a readable card)")
    p.add_argument("--all", action="store_true",
                   help="cards for every match, not only the best (default: off, the best card)")
    mode = p.add_mutually_exclusive_group()
    mode.add_argument("--scan", metavar="FILE",
                      help="find every term in FILE ('-' for stdin) (default: off)")
    mode.add_argument("--list", action="store_true", help="table of all terms (default: off)")
    mode.add_argument("--export-md", metavar="PATH", type=output_file_or_stdout,
                      help="write the Markdown glossary ('-': stdout) into a folder that exists "
                           "(default: off)")
    return p


def main(argv: list[str]) -> int:
    try:
        return _main(argv)
    except BrokenPipeError:  # `minipar glossary --list | head`
        sys.stdout = open(os.devnull, "w")  # noqa: SIM115 - silence the flush at exit
        return 0


def _main(argv: list[str]) -> int:
    import json
    if sys.stdout.encoding and sys.stdout.encoding.lower().replace("-", "") != "utf8":
        sys.stdout.reconfigure(errors="backslashreplace")  # type: ignore[union-attr]
    args = _parser().parse_args(argv)
    if args.scan is not None:
        try:
            text = _read_text(args.scan)
        except OSError as exc:
            print(f"minipar glossary: cannot read {args.scan}: {exc.strerror or exc}", file=sys.stderr)
            return 2
        found = g.scan(text)
        if args.json:
            print(json.dumps([m.as_dict() for m in found], ensure_ascii=False))
            return 0
        names = g.by_id()
        for m in found:
            print(f"{m.start:>7}-{m.end:<7} {m.id:<26} {_clean(m.text)!s}  [{names[m.id].names['en']}]")
        ids = sorted({m.id for m in found})
        print(f"\n{len(found)} mentions of {len(ids)} terms: {', '.join(ids) or '-'}")
        return 0
    if args.list:
        print(json.dumps([t.as_dict() for t in g.terms()], ensure_ascii=False)
              if args.json else table(args.lang))
        return 0
    if args.export_md is not None:
        md = markdown()
        if args.export_md == "-":
            sys.stdout.write(md)
        else:
            try:
                Path(args.export_md).write_text(md, encoding="utf-8")
            except OSError as exc:  # checked when parsed; this is what the check cannot see
                print(f"minipar glossary: --export-md: cannot write {args.export_md}: "
                      f"{exc.strerror or exc}", file=sys.stderr)
                return 2
            print(f"wrote {args.export_md} ({len(g.terms())} terms)")
        return 0
    query = _clean(" ".join(args.query)).strip()
    if not query:
        print("minipar glossary: empty query; try `minipar glossary all-reduce` or "
              "`minipar glossary --list`", file=sys.stderr)
        return 2
    if len(query) > MAX_QUERY:
        print(f"minipar glossary: the query is {len(query)} characters long; to find the terms in "
              "a text use `minipar glossary --scan FILE` (or `--scan -` for stdin)", file=sys.stderr)
        return 2
    hits = g.score_all(query)
    if not hits:
        near = g.closest(query)
        if args.json:
            print("[]")
        hint = ("Closest terms: " + ", ".join(f"{t.id} ({t.names['en']})" for t in near) if near
                else f"No term is similar enough to suggest (similarity >= {g.SUGGEST_FLOOR}); "
                     "`minipar glossary --list` shows every term.")
        print(f"minipar glossary: no match for {query!r}. {hint}", file=sys.stderr)
        return 1
    if args.json:
        print(json.dumps([h.as_dict() for h in hits], ensure_ascii=False))
        return 0
    family = None if args.all else g.topic(query)
    if family is not None:
        print(topic_list(family, args.lang))
        return 0
    shown = hits if args.all else hits[:1]
    print("\n\n".join(card(h.term, args.lang) for h in shown))
    rest = hits[len(shown):]
    if rest:
        print("\nSee also: " + ", ".join(f"{h.term.id} ({h.score:.2f})" for h in rest[:8]))
    return 0
