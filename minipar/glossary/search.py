"""Lookup: "what is X?" for a query in English, Russian or Chinese.

EN fuzzy lookup · RU нечёткий поиск · ZH 模糊查找

A query's key (:mod:`minipar.glossary.normal_form`) is compared with every
key in the index (:mod:`minipar.glossary.index`), and each term keeps its
best score:

* exact name 1, abbreviation 0.98, alias 0.97;
* one key contains the other: 0.6 + 0.3 x len(short) / len(long);
* a typo: 0.9 x (1 - d / max length), where d is the Levenshtein distance
  (Levenshtein 1966) and at most a quarter of the key's length (1-3 edits;
  none for 1-2 character queries); the distance is computed only where the
  character-bigram Dice coefficient 2|A∩B| / (|A|+|B|) is at least 0.3, or
  the query is short;
* a term named inside a longer query (:func:`minipar.glossary.scan`):
  0.55 + 0.3 x its share of the query;
* a query made only of term names ("流水线并行气泡" = pipeline parallelism +
  bubble) is a compound noun: its *head* scores 0.9, above any partial
  match.  The head is the last name in English and Chinese ("pipeline
  parallelism bubble") and the first in Russian, where modifiers follow in
  the genitive («пузырь конвейерного параллелизма»);
* a word for a family of terms (a *topic*, ``glossary/_topics.toml``:
  "sharding", «шардирование», 分片) gives every term of the family 0.95, so
  they are listed together (:func:`topic`) instead of one being guessed.

"Did you mean" (:func:`closest`) offers only terms whose similarity to the
query (bigram Dice or 1 - edit distance / length) is at least
:data:`SUGGEST_FLOOR` = 0.5: "xyzzyq" gets no suggestion rather than three
unrelated terms.

A query longer than :data:`MAX_FUZZY_KEY` is treated as a text: its terms
are found by scanning, not by edit distance.
"""

from __future__ import annotations

import re
from collections import namedtuple

from minipar.glossary.data import LANGS, Term, Topic, by_id, topics
from minipar.glossary.index import bigrams, index
from minipar.glossary.normal_form import HAN, key
from minipar.glossary.scanning import scan

MAX_FUZZY_KEY = 48  # longer queries are treated as texts: their terms are found by scan()
SUGGEST_FLOOR = 0.5  # closest(): least similarity worth offering as "did you mean"
HEAD_SCORE = 0.9  # the head of a compound query made only of term names
TOPIC_SCORE = 0.95  # each term of a topic: below an exact name, above any fuzzy match
_HAS_HAN = re.compile(f"[{HAN}]")
_HAS_CYR = re.compile("[\u0400-\u04ff]")


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
        matches = scan(query)
        for m in matches:
            offer(m.id, 0.6 + 0.3 * min(1.0, len(m.text) / max(1, len(query))), "in text")
        return _ranked(best)
    qb = bigrams(qk)
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
    found = scan(query)
    for m in found:  # terms named inside a longer query ("张量切分体例")
        offer(m.id, 0.55 + 0.3 * len(key(m.text)) / len(qk), "in query")
    keys = [key(m.text) for m in found]
    if len({m.id for m in found}) >= 2 and "".join(keys) == qk:  # a compound of term names only
        head = found[0] if _HAS_CYR.search(found[0].text) else found[-1]
        offer(head.id, HEAD_SCORE, "head of the query")
    return _ranked(best)


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

    Score: 1 for an exact name (0.98 abbreviation, 0.97 alias), 0.6-0.9 when
    one key contains the other, 0.9 x (1 - distance/length) for a typo within
    a quarter of the key's length (at most 3 edits; none for 1-2 character
    queries), 0.55-0.85 for a term named inside a longer query.
    """
    return [h.term for h in score_all(query)[:limit]]


def closest(query: str, n: int = 3) -> list[Term]:
    """Up to ``n`` terms nearest to ``query`` (bigram Dice or edit similarity), for "did you mean".

    Only terms with similarity >= :data:`SUGGEST_FLOOR` (0.5) are offered: a
    query like "xyzzyq" gets an empty list, not three unrelated terms.
    """
    qk = key(query)[:MAX_FUZZY_KEY] or query[:MAX_FUZZY_KEY].casefold()
    qb = bigrams(qk)
    idx = index()
    best: dict[str, float] = {}
    for k, entries in idx.exact.items():
        kb = idx.bigrams[k]
        d = 2 * len(qb & kb) / (len(qb) + len(kb))
        if len(qk) <= 20 and abs(len(qk) - len(k)) <= 6:  # edit similarity only where it can win
            d = max(d, 1.0 - levenshtein(qk, k) / max(len(qk), len(k), 1))
        for tid, _ in entries:
            best[tid] = max(best.get(tid, 0.0), d)
    table = by_id()
    ranked = sorted(((d, t) for t, d in best.items() if d >= SUGGEST_FLOOR), key=lambda dt: (-dt[0], dt[1]))
    return [table[t] for _, t in ranked[:n]]
