"""Lookup: "what is X?" for a query in English, Russian or Chinese.

EN fuzzy lookup · RU нечёткий поиск · ZH 模糊查找

A query's key (:mod:`minipar.glossary.normal_form`) is compared with every
key in the index (:mod:`minipar.glossary.index`), and each term keeps its
best score:

* exact name 1, abbreviation 0.98, alias 0.97 (a Russian name in another
  word order x 0.99);
* the same words in any order, as a bag ("шардинг оптимизатора" for
  «шардирование состояния оптимизатора»): 0.5 + 0.4 x (shared words /
  the name's words) x (shared words / the query's words), when the query
  shares at least half of the name's words;
* a Chinese query read word by word (:mod:`minipar.glossary.zh_words`:
  全部减少 -> 全 + 归约 = 全归约): its reading that is a name, 0.95 x that
  name's weight;
* one key contains the other: 0.6 + 0.3 x len(short) / len(long), where the
  shorter starts and ends on word boundaries of the longer ("tensor" in
  "tensorparallelism"; a typed prefix like "pipel" may end inside a word) --
  never inside a word ("moe" in a random "xqzmoevbk", "allel" in
  "parallelism");
* a typo: 0.9 x (1 - d / max length), where d is the Levenshtein distance
  (Levenshtein 1966, computed by ``rapidfuzz``) and at most a quarter of the
  key's length (1-3 edits; none for 1-2 character queries, and none when a
  word of the query is a name as typed: "PyTorch FSDP" is FSDP, not two
  edits from "PyTorch DDP");
* a term named inside a longer query (:func:`minipar.glossary.scan`):
  0.55 + 0.3 x its share of the query.  A *context* name (DP, 3D, zero,
  bubble: :mod:`minipar.glossary.scanning`) inside a longer query counts,
  here and for containment, only as a scan of prose would count it, the
  words of the glossary's names giving context: "MoE models" is MoE, "3D
  printing", "zero padding", "pp. 12-19" and "soap bubble" are nothing;
* a query made only of term names ("流水线并行气泡" = pipeline parallelism +
  bubble) is a compound noun: its *head* scores 0.9, above any partial
  match.  The head is the last name in English and Chinese ("pipeline
  parallelism bubble") and the first in Russian, where modifiers follow in
  the genitive («пузырь конвейерного параллелизма»);
* a word for a family of terms (a *topic*, ``glossary/_topics.toml``:
  "sharding", «шардирование», 分片) gives every term of the family 0.95, so
  they are listed together (:func:`topic`) instead of one being guessed.

A similarity floor keeps nonsense out: a fuzzy score (bag of words,
containment, typo) under :data:`MATCH_FLOOR` = 0.65 is no match at all, so a
string of random letters gets "no match" rather than a confident card.
"Did you mean" (:func:`closest`) then offers only terms whose edit
similarity 1 - d / max length to the query is at least
:data:`SUGGEST_FLOOR` = 0.5: "xyzzyq" gets no suggestion rather than three
unrelated terms.

A query longer than :data:`MAX_FUZZY_KEY` is treated as a text: its terms
are found by scanning, not by edit distance.  ``rapidfuzz`` (edit distance)
and ``jieba`` (Chinese words) are imported only by the queries that need
them, so an exact lookup starts without either.
"""

from __future__ import annotations

import re
from collections import namedtuple
from collections.abc import Callable
from functools import cache

from minipar.glossary.data import LANGS, Term, Topic, by_id, topics
from minipar.glossary.index import index
from minipar.glossary.normal_form import HAN, key, words
from minipar.glossary.scanning import scan

MAX_FUZZY_KEY = 48  # longer queries are treated as texts: their terms are found by scan()
SUGGEST_FLOOR = 0.5  # closest(): least similarity worth offering as "did you mean"
MATCH_FLOOR = 0.65  # score_all(): a fuzzy score under this is no match
HEAD_SCORE = 0.9  # the head of a compound query made only of term names
TOPIC_SCORE = 0.95  # each term of a topic: below an exact name, above any fuzzy match
ZH_WORDS_SCORE = 0.95  # a Chinese query whose reading word by word is a name
_HAS_HAN = re.compile(f"[{HAN}]")
_HAS_CYR = re.compile("[\u0400-\u04ff]")
_STOP = frozenset({"the", "a", "an", "of", "in", "for", "and", "with", "on", "и", "в", "с", "по",
                   "для", "на", "的", "和"})


def levenshtein(a: str, b: str, limit: int | None = None) -> int:
    """Edit distance (insertions, deletions, substitutions each cost 1), by ``rapidfuzz``.

    With ``limit``, any distance above it is reported as ``limit + 1`` (and
    the computation stops as soon as it is known to exceed it).
    """
    from rapidfuzz.distance import Levenshtein

    return Levenshtein.distance(a, b, score_cutoff=limit)


class Hit(namedtuple("Hit", "term score why")):
    """A lookup result: the term, a score in (0, 1] (1 = exact name) and why it matched."""

    __slots__ = ()

    def as_dict(self) -> dict[str, object]:
        t = self.term
        return {"id": t.id, **{lang: t.names[lang] for lang in LANGS}, "score": round(self.score, 4),
                "why": self.why}


def _on_bounds(short: str, long_: str, starts: tuple[int, ...], prefix_ok: bool) -> bool:
    """``short`` occurs in ``long_`` starting at a word start of it, and ending at one (or at the end).

    ``prefix_ok``: ``short`` is the query, which may stop inside a word
    ("pipel" for "pipeline").  Han keys have a word start at every character.
    """
    ends = set(starts[1:]) | {len(long_)}
    i = long_.find(short)
    while i >= 0:
        if i in starts and (prefix_ok or i + len(short) in ends):
            return True
        i = long_.find(short, i + 1)
    return False


def _min_contain(k: str) -> int:
    """Shortest key that may match by containment: 2 Han characters, else 3 letters."""
    return 2 if _HAS_HAN.search(k) else 3


def score_all(query: str) -> list[Hit]:
    """Every term with a score > 0 for ``query``, best first (see :func:`lookup`)."""
    if not isinstance(query, str):
        raise TypeError(f"lookup() needs a str, got {type(query).__name__}")
    qk = key(query)
    if not qk:
        return []
    idx = index()
    best: dict[str, tuple[float, str]] = {}

    def offer(tid: str, s: float, why: str) -> None:
        if s > best.get(tid, (0.0, ""))[0]:
            best[tid] = (s, why)

    for tid, w in idx.exact.get(qk, []):
        offer(tid, w, "exact")
    if qk in idx.topics:
        for tid in _topic_table()[idx.topics[qk]].terms:
            offer(tid, TOPIC_SCORE, f"topic {idx.topics[qk]}")
    if len(qk) > MAX_FUZZY_KEY:
        matches = scan(query, prose=False)
        for m in matches:
            offer(m.id, 0.6 + 0.3 * min(1.0, len(m.text) / max(1, len(query))), "in text")
        return _ranked(best)
    fuzzy: dict[str, tuple[float, str]] = {}

    def offer_fuzzy(tid: str, s: float, why: str) -> None:
        if s >= MATCH_FLOOR and s > fuzzy.get(tid, (0.0, ""))[0]:
            fuzzy[tid] = (s, why)

    _words_in_any_order(query, offer_fuzzy)
    if _HAS_HAN.search(qk) and not best:
        from minipar.glossary.zh_words import readings

        for reading in readings(query):
            for tid, w in idx.exact.get(key(reading), []):
                offer_fuzzy(tid, ZH_WORDS_SCORE * w, f"Chinese words {reading}")
    # a context name inside a longer query ("3D printing", "zero padding", "pp. 12", "soap bubble")
    # counts only as a scan of prose would count it, the glossary's words giving context
    trusted = {key(m.text) for m in scan(query, cues=_vocabulary())}
    q_starts = idx.bounds.get(qk) or _query_starts(query)
    allowed = min(3, max(1, len(qk) // 4))
    for k, entries in idx.exact.items():
        if k == qk:
            continue
        if len(qk) <= len(k):
            contains = len(qk) >= _min_contain(qk) and _on_bounds(qk, k, idx.bounds[k], True)
        else:
            contains = (len(k) >= _min_contain(k) and _on_bounds(k, qk, q_starts, False)
                        and (k not in idx.context or k in trusted))
        if contains:
            s = 0.6 + 0.3 * min(len(qk), len(k)) / max(len(qk), len(k))
            for tid, w in entries:
                offer_fuzzy(tid, s * w, "contains")
    qw = words(query)
    named = len(qw) >= 2 and any(len(w) >= 3 and w in idx.exact and not _HAS_HAN.search(w) for w in qw)
    if len(qk) > 2 and not named:  # a typo (not when a word is a name as typed: "PyTorch FSDP")
        from rapidfuzz import process
        from rapidfuzz.distance import Levenshtein

        for k, d, _ in process.extract(qk, list(idx.exact), scorer=Levenshtein.distance,
                                       score_cutoff=allowed, limit=None):
            if k != qk:
                sim = 1.0 - d / max(len(qk), len(k))
                for tid, w in idx.exact[k]:
                    offer_fuzzy(tid, 0.9 * sim * w, f"edit distance {d}")
    for tid, (s, why) in fuzzy.items():
        offer(tid, s, why)
    found = scan(query, prose=False)
    for m in found:  # terms named inside a longer query ("张量切分体例")
        mk = key(m.text)
        if mk not in idx.context or mk in trusted:
            offer(m.id, 0.55 + 0.3 * len(mk) / len(qk), "in query")
    parts = _compound(qw)
    if parts:  # a compound of term names only: its head
        offer(parts[0] if _HAS_CYR.search(qk) else parts[-1], HEAD_SCORE, "head of the query")
    return _ranked(best)


def _compound(ws: tuple[str, ...]) -> list[str] | None:
    """The query's words cut into the fewest (at least 2) term names of 2+ terms, or None.

    Every cut is tried (a shortest path over word positions), not only the
    greedy longest names: «пузырь конвейерного параллелизма» is «пузырь» +
    «конвейерного параллелизма», though «пузырь конвейерного» is a name too.
    """
    exact = index().exact
    n = len(ws)
    paths: dict[int, list[str]] = {0: []}  # word position -> the fewest names that reach it
    for i in range(n):
        if i not in paths:
            continue
        if ws[i] in _STOP and (i + 1 not in paths or len(paths[i + 1]) > len(paths[i])):
            paths[i + 1] = paths[i]  # "流水线并行的气泡": 的 joins two names
        for j in range(i + 1, n + 1):
            hit = exact.get("".join(ws[i:j]))
            if hit and (j - i < n) and (j not in paths or len(paths[j]) > len(paths[i]) + 1):
                paths[j] = [*paths[i], hit[0][0]]
    names = paths.get(n)
    return names if names and len(set(names)) >= 2 else None


@cache
def _vocabulary() -> frozenset[str]:
    """Every stemmed word of every name: in a query, such a word puts a short name in context."""
    idx = index()
    out = {w for ws, _, _ in idx.parts for w in ws}
    out |= {k for k, b in idx.bounds.items() if len(b) == 1 and not _HAS_HAN.search(k)}
    return frozenset(out - _STOP - idx.context)


def _query_starts(query: str) -> tuple[int, ...]:
    """Offsets in the query's key where each of its words starts."""
    out, pos = [], 0
    for w in words(query):
        out.append(pos)
        pos += len(w)
    return tuple(out)


def _words_in_any_order(query: str, offer: Callable[[str, float, str], None]) -> None:
    """Offer every name that shares at least half of its words with the query (a bag of words)."""
    qw = {w for w in words(query) if w not in _STOP and not _HAS_HAN.search(w)}
    if not qw:
        return
    for name_words, tid, w in index().parts:
        nw = {x for x in name_words if x not in _STOP}
        shared = len(qw & nw)
        if shared and 2 * shared >= len(nw) and not _HAS_HAN.search("".join(nw)):
            offer(tid, (0.5 + 0.4 * (shared / len(nw)) * (shared / len(qw))) * w, "same words")


def _topic_table() -> dict[str, Topic]:
    return {t.id: t for t in topics()}


def topic(query: str) -> Topic | None:
    """The family of terms ``query`` names ("sharding", «шардинг», 分片), or None.

    ``Topic(id, title, names, terms)``: ``terms`` are ids, in display order.
    None too when a term has exactly that name (an exact term wins).
    """
    qk = key(query) if isinstance(query, str) else ""
    tid = index().topics.get(qk)
    if tid is None or index().exact.get(qk):
        return None
    return _topic_table()[tid]


def _ranked(best: dict[str, tuple[float, str]]) -> list[Hit]:
    table = by_id()
    hits = [Hit(table[tid], s, why) for tid, (s, why) in best.items()]
    return sorted(hits, key=lambda h: (-h.score, h.term.id))


def lookup(query: str, limit: int = 10) -> list[Term]:
    """Terms matching ``query`` in any language, best first (empty list: no match).

    Score: 1 for an exact name (0.98 abbreviation, 0.97 alias), 0.5-0.9 for
    the same words in another order, 0.95 for a Chinese query read word by
    word, 0.6-0.9 when one key contains the other on word boundaries, 0.9 x
    (1 - distance/length) for a typo within a quarter of the key's length (at
    most 3 edits; none for 1-2 character queries), 0.55-0.85 for a term named
    inside a longer query; a fuzzy score under :data:`MATCH_FLOOR` is dropped.
    """
    return [h.term for h in score_all(query)[:limit]]


def closest(query: str, n: int = 3) -> list[Term]:
    """Up to ``n`` terms nearest to ``query`` (edit similarity), for "did you mean".

    Only terms with similarity 1 - d / max length >= :data:`SUGGEST_FLOOR`
    (0.5) are offered: a query like "xyzzyq" gets an empty list, not three
    unrelated terms.
    """
    from rapidfuzz import process
    from rapidfuzz.distance import Levenshtein

    qk = key(query)[:MAX_FUZZY_KEY] or query[:MAX_FUZZY_KEY].casefold()
    idx = index()
    best: dict[str, float] = {}
    for k, sim, _ in process.extract(qk, list(idx.exact), scorer=Levenshtein.normalized_similarity,
                                     score_cutoff=SUGGEST_FLOOR, limit=None):
        for tid, _ in idx.exact[k]:
            best[tid] = max(best.get(tid, 0.0), sim)
    table = by_id()
    ranked = sorted(best.items(), key=lambda td: (-td[1], td[0]))
    return [table[t] for t, _ in ranked[:n]]
