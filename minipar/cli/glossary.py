"""``minipar glossary``: look up, scan, list and export the trilingual glossary.

    minipar glossary all-reduce            a card: names, definitions (EN/RU/ZH), seeds, papers, links
    minipar glossary "параллелизма данных" --lang ru
    minipar glossary 张量切分体例 --json     matches, best first: id, en, ru, zh, score
    minipar glossary sharding              a word for a family of terms: the family, listed
    minipar glossary --scan FILE|-         every term named in a text, with character offsets
    minipar glossary --list                all terms in three languages
    minipar glossary --export-md docs/glossary.md

A query may be inflected, reordered, colloquial or mistyped; a string that is
like no term gets "no match" and the closest terms instead.  ``--scan``
reports short names (DP, PP, 3D) and ordinary words (rank, bubble) only in
context, so a citation's "pp. 12" or ``cp`` names nothing.  ``--lang``
shows one language only (with the English corrections of its seed quotes).

Cards show whether each linked module, notebook, exercise and command
exists *now* (computed from the files, never stored): a link that has not
landed yet reads "planned" (a command, too, until its verb, benchmark or
strategy is in ``minipar.registry``).  Seeds are named by title ("Russian
glossary"), never by file name.  ``--list`` wraps long names, never cuts
them.  The exported Markdown has no such status, so it does not go stale
when a module lands.  Imports nothing heavy (no NumPy, no mpi4py).
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

from minipar import glossary as g
from minipar.glossary.links import link_status  # re-exported: the library computes it (registry)
from minipar.glossary.render import (  # re-exported: the library renders, the CLI prints
    LABEL,
    card,
    display_width,
    markdown,
    table,
    terminal_width,
    topic_list,
    wrap,
)

__all__ = ["LABEL", "card", "display_width", "link_status", "main", "markdown", "table",
           "terminal_width", "topic_list", "wrap"]
MAX_QUERY = 1000  # characters; a longer "query" is a text: use --scan


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
    from minipar.cli.options import ArgumentParser, output_file_or_stdout

    p = ArgumentParser(prog="minipar glossary", description=__doc__.split("\n\n")[0],
                       formatter_class=argparse.RawDescriptionHelpFormatter,
                       epilog="\n".join(__doc__.split("\n\n")[1].splitlines()))
    p.add_argument("query", nargs="*",
                   help="a term in English, Russian or Chinese (default: none; required without "
                        "--scan, --list or --export-md)")
    p.add_argument("--lang", choices=g.LANGS,
                   help="one language: its names, definition and the quotes of seed documents "
                        "written in it, with their English corrections (and --list columns) "
                        "(default: all three)")
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
