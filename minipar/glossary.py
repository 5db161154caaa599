"""Glossary · Глоссарий · 术语表: trilingual lookup and scan over ``glossary/``.

Every term of the field is one TOML file in ``glossary/`` (schema:
``glossary/README.md``), shipped in the wheel as ``minipar/_glossary``.
This module loads them and answers two questions:

* :func:`lookup` -- "what is X?" for a query in English, Russian or Chinese:
  exact names, aliases and abbreviations first, then inflected Russian forms
  (a light suffix stemmer), spun Chinese (the seed article's synonym-spinner
  vocabulary, normalised by the table in ``glossary/_normalise.toml``), and
  typos (Levenshtein distance, prefiltered by character-bigram Dice).
* :func:`scan` -- "which terms does this text use?": every term found in a
  text, with ``start``/``end`` character offsets into the *original* text, so
  ``text[start:end]`` is exactly what was matched.

Both work on one normal form: NFKC, case-folded, ``ё`` -> ``е``, spun Chinese
replaced, split into tokens (a run of letters/digits, or one Han character),
each word stemmed, separators dropped.  "All-Reduce", "allreduce" and
"all reduce" all become ``allreduce``; "параллелизма данных" becomes
``параллелизмдан``.

Nothing heavy is imported here: ``minipar glossary`` must start without
NumPy or mpi4py (checked by ``tests/test_glossary_cli.py``).
"""

from __future__ import annotations

import marshal
import os
import re
import sys
import unicodedata
import zlib
from collections import namedtuple
from collections.abc import Sequence
from functools import cache, lru_cache
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from typing import ClassVar


LANGS = ("en", "ru", "zh")
PKG_DIR = Path(__file__).resolve().parent

#: Link targets the architecture plans but that may not have landed yet.  A link
#: in the data must either exist now or be named here (tests/test_glossary_data.py).
PLANNED: dict[str, frozenset[str]] = {
    "modules": frozenset(
        ["minipar.collectives", "minipar.comm.traced", "minipar.comm.topology", "minipar.comm.pairs",
         "minipar.launch", "minipar.nn", "minipar.nn.moe", "minipar.optim", "minipar.precision",
         "minipar.memory", "minipar.plan"]
        + [f"minipar.parallel.{m}" for m in (
            "data_parallel", "parameter_server", "zero", "tensor_parallel", "sequence_parallel",
            "expert_parallel", "pipeline", "checkpointing", "offload", "hybrid")]
    ),
    "notebooks": frozenset([
        "00_overview.ipynb", "01_collectives.ipynb", "02_serial_model.ipynb",
        "03_data_parallel.ipynb", "04_zero.ipynb", "05_tensor_parallel.ipynb",
        "06_pipeline.ipynb", "07_sequence_parallel.ipynb", "08_expert_parallel.ipynb",
        "09_checkpointing_offload.ipynb", "10_hybrid.ipynb"]),
    "exercises": frozenset(["ring_allreduce", "tree_broadcast", "dp_grad_sync", "zero1_step"]),
    # `minipar VERB ...`: the verbs the architecture plans (run lands with the strategies)
    "verbs": frozenset(["run", "bench", "plan", "demo", "train", "exercise", "glossary"]),
}


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


# --------------------------------------------------------------------------- loading

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


# Parsing 50-odd TOML files and building the index costs more than the rest of
# `minipar glossary X` together, so both are kept in a marshal file under
# $MINIPAR_CACHE_DIR (default $XDG_CACHE_HOME/minipar or ~/.cache/minipar), valid
# while no data file and not this module changed (names, sizes, mtimes).
# MINIPAR_NO_CACHE=1 turns it off; an unwritable or corrupt cache is ignored.

def _stamp() -> list[object]:
    d = data_dir()
    me = Path(__file__).stat()
    files = [(p.name, p.stat()) for p in sorted(d.glob("*.toml"))]
    head: list[object] = [str(d), sys.version_info[:2], me.st_mtime_ns, me.st_size]
    return head + [(n, st.st_mtime_ns, st.st_size) for n, st in files]


def _cache_file(stamp: list[object]) -> Path | None:
    if os.environ.get("MINIPAR_NO_CACHE"):
        return None
    base = os.environ.get("MINIPAR_CACHE_DIR") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "minipar")
    return Path(base) / f"glossary-{zlib.crc32(repr(stamp).encode()):08x}.marshal"


@cache
def _blob() -> dict:
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
    spun = dict(tomllib.loads((d / "_normalise.toml").read_text(encoding="utf-8"))["zh"])
    return {"stamp": stamp, "raw": raw, "spun": spun}


def _save(blob: dict) -> None:
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


@cache
def terms() -> tuple[Term, ...]:
    """All terms, sorted by id."""
    return tuple(parse_term(data, name) for name, data in _blob()["raw"])


def by_id() -> dict[str, Term]:
    return {t.id: t for t in terms()}


def spun_table() -> dict[str, str]:
    """Spun Chinese -> standard Chinese (``glossary/_normalise.toml``)."""
    return _blob()["spun"]


def clear_caches() -> None:
    """Forget everything loaded (for tests and benchmarks); the next call reloads."""
    for f in (_blob, terms, _spun_regex, _index):
        f.cache_clear()


# --------------------------------------------------------------------------- normal form

_HAN = "\u3400-\u4dbf\u4e00-\u9fff\uf900-\ufaff"
_TOKEN = re.compile(rf"[{_HAN}]|[^\W_{_HAN}]+")
_GAP_OK = re.compile(r"[\s\-‐‑‒–—_/·+]*")
_RU_ENDINGS = sorted(
    ["ами", "ями", "ого", "его", "ому", "ему", "ыми", "ими", "ией", "иям", "иях", "ых", "их", "ий", "ый", "ой", "ей", "ая", "яя", "ое", "ее", "ие", "ые", "ую", "юю", "ом", "ем", "ах", "ях", "ов", "ев", "ам", "ям", "ым", "им", "ия", "ию", "ии", "ью", "ья", "ье", "ьи", "ы", "и", "а", "я", "о", "е", "у", "ю", "ь"], key=len, reverse=True)
_CYR = re.compile(r"[а-я]")
_PAREN = re.compile(r"\s*(.+?)\s*[(（](.+)[)）]\s*")
class _CharTable(dict):
    """str.translate table filled on demand: char -> NFKC, case-folded, ё -> е."""

    odd: ClassVar[set[str]] = set()  # chars whose normal form is not exactly one char

    def __missing__(self, code: int) -> str:
        c = chr(code)
        n = unicodedata.normalize("NFKC", c).casefold().replace("ё", "е")
        if len(n) != 1:
            self.odd.add(c)
        self[code] = n
        return n


_CHARS = _CharTable()


def _norm_char(c: str) -> str:
    return _CHARS[ord(c)]


@lru_cache(maxsize=65536)
def stem(word: str) -> str:
    """Light stemmer: Russian case/number endings, English plurals; other words unchanged."""
    if _CYR.search(word):
        for end in _RU_ENDINGS:
            if word.endswith(end) and len(word) - len(end) >= 3:
                return word[: -len(end)]
        return word
    if len(word) > 4 and word.isalpha():
        if word.endswith(("ches", "shes", "xes")):
            return word[:-2]
        if word.endswith("s") and not word.endswith(("ss", "us", "is")):
            return word[:-1]
    return word


def _normalise(text: str) -> tuple[str, Sequence[int], Sequence[int]]:
    """Normal form of ``text`` and, per normal-form char, its [start, end) in ``text``."""
    norm = text.translate(_CHARS)
    if len(norm) == len(text) and not (_CHARS.odd and _CHARS.odd.intersection(text)):
        starts: Sequence[int] = range(len(text))  # one char for one char: offsets unchanged
        ends: Sequence[int] = range(1, len(text) + 1)
    else:
        chars: list[str] = []
        starts, ends = [], []
        for i, c in enumerate(text):
            for ch in _norm_char(c):
                chars.append(ch)
                starts.append(i)  # type: ignore[union-attr]
                ends.append(i + 1)  # type: ignore[union-attr]
        norm = "".join(chars)
    rx = _spun_regex()
    if rx is None or not rx.search(norm):
        return norm, starts, ends
    table = spun_table()
    out: list[str] = []
    s2: list[int] = []
    e2: list[int] = []
    starts, ends = list(starts), list(ends)
    pos = 0
    for m in rx.finditer(norm):
        a, b = m.span()
        out.append(norm[pos:a])
        s2 += starts[pos:a]
        e2 += ends[pos:a]
        rep = table[m.group()]
        out.append(rep)
        s2 += [starts[a]] * len(rep)
        e2 += [ends[b - 1]] * len(rep)
        pos = b
    out.append(norm[pos:])
    s2 += starts[pos:]
    e2 += ends[pos:]
    return "".join(out), s2, e2


@cache
def _spun_regex() -> re.Pattern[str] | None:
    table = spun_table()
    parts = []
    for k in sorted(table, key=len, reverse=True):
        v = table[k]
        pat = re.escape(k)
        if k in v and v != k:  # 由选择 -> 路由选择: leave an already standard 路由选择 alone
            pre, post = v.split(k, 1)
            pat = (f"(?<!{re.escape(pre)})" if pre else "") + pat + (f"(?!{re.escape(post)})" if post else "")
        parts.append(pat)
    return re.compile("|".join(parts)) if parts else None


def _tokens(norm: str) -> list[tuple[str, int, int]]:
    """(stemmed token, start, end) for each token of a normal-form string."""
    return [(stem(m.group()), m.start(), m.end()) for m in _TOKEN.finditer(norm)]


def key(text: str) -> str:
    """The matching key of a name or query: normal form, stemmed tokens, no separators."""
    return "".join(t[0] for t in _tokens(_normalise(text)[0]))


# --------------------------------------------------------------------------- index

# exact: key -> [(term id, weight)]; prefixes: every prefix of a key (scan stops extending a
# match when it leaves this set); max_tokens: the most tokens in a name; bigrams: key -> its bigrams
_Index = namedtuple("_Index", "exact prefixes max_tokens bigrams")


def _bigrams(k: str) -> frozenset[str]:
    return frozenset(k[i: i + 2] for i in range(len(k) - 1)) if len(k) > 1 else frozenset([k])


@cache
def _index() -> _Index:
    blob = _blob()
    if "exact" not in blob:
        blob["exact"], blob["max_tokens"] = _build_index()
        blob["prefixes"] = frozenset(k[:i] for k in blob["exact"] for i in range(1, len(k) + 1))
        _save(blob)
    exact = blob["exact"]
    return _Index(exact, blob["prefixes"], blob["max_tokens"], {k: _bigrams(k) for k in exact})


def _build_index() -> tuple[dict[str, list[tuple[str, float]]], int]:
    """Matching key -> [(term id, weight)] over every name, and the most tokens in one name."""
    exact: dict[str, list[tuple[str, float]]] = {}
    max_tokens = 1
    for t in terms():
        weighted = [(t.id, 1.0)] + [(n, 1.0) for n in t.names.values()] + [(a, 0.98) for a in t.abbrev]
        weighted += [(a, 0.97) for lang in LANGS for a in t.aliases.get(lang, [])]
        for name in t.names.values():  # "Всеобщая редукция (All-Reduce)": both parts are names too
            m = _PAREN.fullmatch(name)
            if m:
                weighted += [(m.group(1), 1.0), (m.group(2), 0.97)]
        for name, w in weighted:
            toks = _tokens(_normalise(name)[0])
            k = "".join(x[0] for x in toks)
            if not k:
                continue
            max_tokens = max(max_tokens, len(toks))
            entries = exact.setdefault(k, [])
            if all(tid != t.id for tid, _ in entries):
                entries.append((t.id, w))
    return exact, max_tokens


# --------------------------------------------------------------------------- scan

class Match(namedtuple("Match", "id start end text")):
    """A term found in a text: ``text[start:end]`` (character offsets) names term ``id``."""

    __slots__ = ()

    def as_dict(self) -> dict[str, object]:
        return {"id": self.id, "start": self.start, "end": self.end, "text": self.text}


def scan(text: str) -> list[Match]:
    """Every glossary term named in ``text`` (any language), left to right, longest match first.

    Tokens must be adjacent, separated only by spaces, hyphens, slashes or
    ``+``; offsets refer to the original ``text``.
    """
    if not isinstance(text, str):
        raise TypeError(f"scan() needs a str, got {type(text).__name__}")
    idx = _index()
    norm, starts, ends = _normalise(text)
    toks = _tokens(norm)
    found: list[Match] = []
    i = 0
    while i < len(toks):
        concat = ""
        best: tuple[int, str] | None = None
        for j in range(i, min(len(toks), i + idx.max_tokens)):
            if j > i and not _GAP_OK.fullmatch(norm, toks[j - 1][2], toks[j][1]):
                break
            concat += toks[j][0]
            if concat not in idx.prefixes:
                break
            hit = idx.exact.get(concat)
            if hit:
                best = (j, hit[0][0])
        if best is None:
            i += 1
            continue
        j, tid = best
        a = min(starts[k] for k in range(toks[i][1], toks[j][2]))
        b = max(ends[k] for k in range(toks[i][1], toks[j][2]))
        found.append(Match(tid, a, b, text[a:b]))
        i = j + 1
    return found


# --------------------------------------------------------------------------- lookup

def levenshtein(a: str, b: str, limit: int | None = None) -> int:
    """Edit distance (insertions, deletions, substitutions each cost 1).

    With ``limit``, any distance above it is reported as ``limit + 1``, and the
    computation stops as soon as a whole row of the table exceeds it.
    """
    if len(a) < len(b):
        a, b = b, a
    if limit is not None and len(a) - len(b) > limit:
        return limit + 1
    prev = list(range(len(b) + 1))
    for i, ca in enumerate(a, 1):
        cur = [i]
        for j, cb in enumerate(b, 1):
            cur.append(min(prev[j] + 1, cur[j - 1] + 1, prev[j - 1] + (ca != cb)))
        if limit is not None and min(cur) > limit:
            return limit + 1
        prev = cur
    return prev[-1]


class Hit(namedtuple("Hit", "term score why")):
    """A lookup result: the term, a score in (0, 1] (1 = exact name) and why it matched."""

    __slots__ = ()

    def as_dict(self) -> dict[str, object]:
        t = self.term
        return {"id": t.id, **{lang: t.names[lang] for lang in LANGS}, "score": round(self.score, 4),
                "why": self.why}


MAX_FUZZY_KEY = 48  # longer queries are treated as texts: their terms are found by scan()


_HAS_HAN = re.compile(f"[{_HAN}]")


def _min_contain(k: str) -> int:
    return 2 if _HAS_HAN.search(k) else 3


def score_all(query: str) -> list[Hit]:
    """Every term with a score > 0 for ``query``, best first (see :func:`lookup`)."""
    if not isinstance(query, str):
        raise TypeError(f"lookup() needs a str, got {type(query).__name__}")
    qk = key(query)
    if not qk:
        return []
    idx = _index()
    best: dict[str, tuple[float, str]] = {}

    def offer(tid: str, s: float, why: str) -> None:
        if s > best.get(tid, (0.0, ""))[0]:
            best[tid] = (s, why)

    for tid, w in idx.exact.get(qk, []):
        offer(tid, w, "exact")
    if len(qk) > MAX_FUZZY_KEY:
        matches = scan(query)
        for m in matches:
            offer(m.id, 0.6 + 0.3 * min(1.0, len(m.text) / max(1, len(query))), "in text")
        return _ranked(best)
    qb = _bigrams(qk)
    allowed = min(3, max(1, len(qk) // 4))
    for k, entries in idx.exact.items():
        if k == qk:
            continue
        short, long_ = (qk, k) if len(qk) <= len(k) else (k, qk)
        s = 0.0
        why = ""
        if short in long_ and len(short) >= _min_contain(short):
            s, why = 0.6 + 0.3 * len(short) / len(long_), "contains"
        kb = idx.bigrams[k]
        dice = 2 * len(qb & kb) / (len(qb) + len(kb))
        # a typo: within `allowed` edits (so lengths within `allowed` too: cheap to rule out)
        if len(qk) > 2 and abs(len(qk) - len(k)) <= allowed and (dice >= 0.3 or len(qk) <= 4):
            d = levenshtein(qk, k, allowed)
            sim = 1.0 - d / max(len(qk), len(k))
            if d <= allowed and sim * 0.9 > s:
                s, why = sim * 0.9, f"edit distance {d}"
        if s > 0:
            for tid, w in entries:
                offer(tid, s * w, why)
    for m in scan(query):  # terms named inside a longer query ("张量切分体例")
        offer(m.id, 0.55 + 0.3 * len(key(m.text)) / len(qk), "in query")
    return _ranked(best)


def _ranked(best: dict[str, tuple[float, str]]) -> list[Hit]:
    table = by_id()
    hits = [Hit(table[tid], s, why) for tid, (s, why) in best.items()]
    return sorted(hits, key=lambda h: (-h.score, h.term.id))


def lookup(query: str, limit: int = 10) -> list[Term]:
    """Terms matching ``query`` in any language, best first (empty list: no match).

    Score: 1 for an exact name (0.98 abbreviation, 0.97 alias), 0.6-0.9 when
    one key contains the other, 0.9 x (1 - distance/length) for a typo within
    a quarter of the key's length (at most 3 edits; none for 1-2 character
    queries), 0.55-0.85 for a term named inside a longer query.
    """
    return [h.term for h in score_all(query)[:limit]]


def closest(query: str, n: int = 3) -> list[Term]:
    """Up to ``n`` terms nearest to ``query`` (bigram Dice or edit similarity), for "did you mean".

    Terms with nothing in common with the query (similarity 0) are not offered.
    """
    qk = key(query)[:MAX_FUZZY_KEY] or query[:MAX_FUZZY_KEY].casefold()
    qb = _bigrams(qk)
    idx = _index()
    best: dict[str, float] = {}
    for k, entries in idx.exact.items():
        kb = idx.bigrams[k]
        d = 2 * len(qb & kb) / (len(qb) + len(kb))
        if len(qk) <= 20 and abs(len(qk) - len(k)) <= 6:  # edit similarity only where it can win
            d = max(d, 1.0 - levenshtein(qk, k) / max(len(qk), len(k), 1))
        for tid, _ in entries:
            best[tid] = max(best.get(tid, 0.0), d)
    table = by_id()
    ranked = sorted(((d, t) for t, d in best.items() if d > 0), key=lambda dt: (-dt[0], dt[1]))
    return [table[t] for _, t in ranked[:n]]
