"""Glossary data: one TOML file per term, parsed once and cached.

EN glossary data · RU данные глоссария · ZH 术语表数据

Every term of the field is one TOML file in ``glossary/`` (schema:
``glossary/README.md``), shipped in the wheel as ``minipar/_glossary``.
:func:`terms` returns them as :class:`Term` tuples, sorted by id.

Parsing 50-odd TOML files and building the matching index
(:mod:`minipar.glossary.index`) costs more than the rest of ``minipar
glossary X`` together, so both are kept in one marshal file (the *blob*)
under ``$MINIPAR_CACHE_DIR`` (default ``$XDG_CACHE_HOME/minipar`` or
``~/.cache/minipar``).  The file's name is a CRC of a *stamp*: the names,
sizes and mtimes of every data file and of this package's source files, so
any change to either names another file.  ``MINIPAR_NO_CACHE=1`` turns it
off; an unwritable or corrupt cache is ignored.

Besides the terms, three small tables (files starting with ``_`` are not
terms): ``_topics.toml`` -- words for a *family* of terms ("sharding",
«шардирование», 分片) and the terms each lists (:func:`topics`),
``_sources.toml`` -- the seed documents by title ("Russian glossary"), so
cards never show a seed's file name (:func:`seed_title`), and the label a
card writes above a seed's quotes (:func:`seed_label`), and
``_normalise.toml`` -- what the matcher treats as the same word (spun
Chinese, :func:`spun_table`; Russian and Chinese word synonyms,
:func:`word_table`) and which names need context in a text
(:func:`scan_table`).
"""

from __future__ import annotations

import marshal
import os
import sys
import zlib
from collections import namedtuple
from functools import cache
from pathlib import Path

LANGS = ("en", "ru", "zh")
#: the ``minipar`` package directory (``glossary/`` data sits next to it in a checkout)
PKG_DIR = Path(__file__).resolve().parent.parent
_SRC_DIR = Path(__file__).resolve().parent  # this package: its code shapes the cached index


#: a family of terms: its title, the names it is asked by, and its term ids in display order
Topic = namedtuple("Topic", "id title names terms")


class Term(namedtuple("Term", "id names aliases abbrev definition seeds papers related links")):
    """One glossary entry, as read from ``glossary/<id>.toml``.

    ``names``/``aliases``/``definition`` map a language (en, ru, zh) to the
    main name / other names / definition; ``seeds`` is a list of dicts (file,
    quote, correction?); ``links`` maps modules, notebooks, commands and
    exercises to lists of targets.  (A named tuple, not a dataclass: importing
    ``dataclasses`` alone costs more start-up time than the whole lookup.)
    """

    __slots__ = ()

    def __repr__(self) -> str:
        return f"Term({self.id!r})"

    def all_names(self) -> list[str]:
        """Every name this term is known by: id, names, abbreviations, aliases."""
        out = [self.id, *self.names.values(), *self.abbrev]
        for lang in LANGS:
            out += self.aliases.get(lang, [])
        return out

    def as_dict(self) -> dict[str, object]:
        return {"id": self.id, **{lang: self.names[lang] for lang in LANGS}, "abbrev": self.abbrev,
                "aliases": self.aliases, "definition": self.definition, "seeds": self.seeds,
                "papers": self.papers, "related": self.related, "links": self.links}


def data_dir() -> Path:
    """The glossary data: the wheel's ``minipar/_glossary``, else the checkout's ``glossary/``."""
    for cand in (PKG_DIR / "_glossary", PKG_DIR.parent / "glossary"):
        if cand.is_dir() and any(cand.glob("*.toml")):
            return cand
    raise FileNotFoundError(f"no glossary data next to {PKG_DIR} (looked for _glossary/ and ../glossary/)")


def parse_term(data: dict, source: str = "?") -> Term:
    """A :class:`Term` from one file's parsed TOML; ValueError names what is missing."""
    try:
        return Term(
            id=data["id"],
            names={lang: data[lang]["name"] for lang in LANGS},
            aliases={lang: list(data[lang].get("aliases", [])) for lang in LANGS},
            abbrev=list(data.get("abbrev", [])),
            definition={lang: data[lang]["definition"].strip() for lang in LANGS},
            seeds=[dict(s) for s in data.get("seeds", [])],
            papers=list(data.get("papers", [])),
            related=list(data.get("related", [])),
            links={k: list(v) for k, v in data.get("links", {}).items()},
        )
    except (KeyError, TypeError, AttributeError) as exc:
        raise ValueError(f"{source}: malformed glossary entry ({exc!r}); see glossary/README.md") from None


# --------------------------------------------------------------------------- the cache

def _stamp() -> list[object]:
    """What the cache depends on: data files and this package's code (names, sizes, mtimes)."""
    d = data_dir()
    code = [(p.name, p.stat()) for p in sorted(_SRC_DIR.glob("*.py"))]
    files = [(p.name, p.stat()) for p in sorted(d.glob("*.toml"))]
    head: list[object] = [str(d), sys.version_info[:2]]
    return head + [(n, st.st_mtime_ns, st.st_size) for n, st in code + files]


def _cache_file(stamp: list[object]) -> Path | None:
    if os.environ.get("MINIPAR_NO_CACHE"):
        return None
    base = os.environ.get("MINIPAR_CACHE_DIR") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "minipar")
    return Path(base) / f"glossary-{zlib.crc32(repr(stamp).encode()):08x}.marshal"


@cache
def cached_blob() -> dict:
    """Parsed data files (``raw``, ``spun``), and the index once built: from the cache if valid."""
    stamp = _stamp()
    path = _cache_file(stamp)
    if path is not None:
        try:
            blob = marshal.loads(path.read_bytes())
            if isinstance(blob, dict) and blob.get("stamp") == stamp and "exact" in blob:
                return blob
        except (OSError, ValueError, EOFError, TypeError):
            pass
    if sys.version_info >= (3, 11):  # imported here: a cache hit needs no TOML parser
        import tomllib
    else:  # pragma: no cover
        import tomli as tomllib
    d = data_dir()
    raw = [(p.name, tomllib.loads(p.read_text(encoding="utf-8")))
           for p in sorted(d.glob("*.toml"), key=lambda p: p.stem) if not p.name.startswith("_")]
    def table(name: str) -> dict:
        path = d / name
        return tomllib.loads(path.read_text(encoding="utf-8")) if path.is_file() else {}

    norm = table("_normalise.toml")
    return {"stamp": stamp, "raw": raw, "spun": dict(norm.get("zh", {})),
            "words": {lang: dict(norm.get(f"{lang}_words", {})) for lang in LANGS},
            "scan": {k: list(v) for k, v in norm.get("scan", {}).items()},
            "topics": [(tid, t["title"], list(t["names"]), list(t["terms"]))
                       for tid, t in table("_topics.toml").items()],
            "sources": {f: dict(v) for f, v in table("_sources.toml").items()}}


def save_blob(blob: dict) -> None:
    """Write the blob (index included) to the cache file, atomically; any failure is ignored."""
    path = _cache_file(blob["stamp"])
    if path is None:
        return
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(f".{os.getpid()}.tmp")
        tmp.write_bytes(marshal.dumps(blob))
        os.replace(tmp, path)
    except (OSError, ValueError):
        pass


# --------------------------------------------------------------------------- the terms

@cache
def terms() -> tuple[Term, ...]:
    """All terms, sorted by id."""
    return tuple(parse_term(data, name) for name, data in cached_blob()["raw"])


def by_id() -> dict[str, Term]:
    """Every term by its id."""
    return {t.id: t for t in terms()}


def spun_table() -> dict[str, str]:
    """Spun Chinese -> standard Chinese (``glossary/_normalise.toml``)."""
    return cached_blob()["spun"]


def word_table(lang: str) -> dict[str, str]:
    """Word -> the standard word (``[en_words]``, ``[ru_words]``, ``[zh_words]`` of ``_normalise.toml``)."""
    return cached_blob()["words"].get(lang, {})


def scan_table(name: str) -> list[str]:
    """A list of ``[scan]`` in ``glossary/_normalise.toml``: ``context_words`` or ``cues``."""
    return cached_blob()["scan"].get(name, [])


def topics() -> tuple[Topic, ...]:
    """The families of terms (``glossary/_topics.toml``), in file order."""
    return tuple(Topic(*t) for t in cached_blob()["topics"])


def seed_title(file: str) -> str:
    """A seed document's title ("Russian glossary"), from ``glossary/_sources.toml``.

    A file not listed there is named "seed document" rather than by its file
    name (the data test requires every quoted seed to have a title).
    """
    return cached_blob()["sources"].get(file, {}).get("title", "seed document")


def seed_lang(file: str) -> str | None:
    """The language a seed document is written in (``lang`` in ``glossary/_sources.toml``)."""
    return cached_blob()["sources"].get(file, {}).get("lang")


def seed_label(file: str) -> str:
    """What a card writes above a seed's quotes: what the document is, and that its errors are kept.

    The seeds are machine-translated texts quoted verbatim, mistakes included
    (the glossary exists to decode them), so a card must not show them bare:
    "As written in a machine-translated Chinese article (errors kept)", the
    ``label`` of ``glossary/_sources.toml``, else one made from the title.
    """
    src = cached_blob()["sources"].get(file, {})
    return src.get("label") or f"As written in the {seed_title(file)} (errors kept)"
