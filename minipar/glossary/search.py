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
  0.55 + 0.3 x its share of the query.

A query longer than :data:`MAX_FUZZY_KEY` is treated as a text: its terms
are found by scanning, not by edit distance.
"""

from __future__ import annotations

import re
from collections import namedtuple

from minipar.glossary.data import LANGS, Term, by_id
from minipar.glossary.index import bigrams, index
from minipar.glossary.normal_form import HAN, key
from minipar.glossary.scanning import scan

MAX_FUZZY_KEY = 48  # longer queries are treated as texts: their terms are found by scan()
_HAS_HAN = re.compile(f"[{HAN}]")


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
    ranked = sorted(((d, t) for t, d in best.items() if d > 0), key=lambda dt: (-dt[0], dt[1]))
    return [table[t] for _, t in ranked[:n]]
