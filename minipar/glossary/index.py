"""The matching index: every name of every term, by its key.

EN inverted index · RU обратный индекс · ZH 倒排索引

Each term is entered under the key (:func:`minipar.glossary.normal_form.key`)
of its id, its names in three languages (weight 1), its abbreviations
(0.98) and aliases (0.97); a name of the form "Всеобщая редукция
(All-Reduce)" is entered in both parts too.  Besides the exact table the
index keeps every prefix of every key (:func:`minipar.glossary.scan` stops
extending a match when it leaves that set), the most tokens in one name, and
each key's character bigrams (the prefilter of the typo search), and the
keys of the topics' names (``glossary/_topics.toml``: "sharding" -> the
sharding terms, answered as a list by :func:`minipar.glossary.search.topic`).  Built once
per data change and cached with the data (:mod:`minipar.glossary.data`).
"""

from __future__ import annotations

import re
from collections import namedtuple
from functools import cache

from minipar.glossary.data import LANGS, cached_blob, save_blob, terms
from minipar.glossary.normal_form import key, normalise, tokens

# exact: key -> [(term id, weight)]; prefixes: every prefix of a key; max_tokens: the most
# tokens in a name; bigrams: key -> its bigrams; topics: key -> topic id
Index = namedtuple("Index", "exact prefixes max_tokens bigrams topics")
_PAREN = re.compile(r"\s*(.+?)\s*[(（](.+)[)）]\s*")


def bigrams(k: str) -> frozenset[str]:
    """The set of adjacent character pairs of ``k`` (``k`` itself when shorter than 2)."""
    return frozenset(k[i: i + 2] for i in range(len(k) - 1)) if len(k) > 1 else frozenset([k])


@cache
def index() -> Index:
    """The index, from the cached blob, or built now (and then saved with the blob)."""
    blob = cached_blob()
    if "exact" not in blob:
        blob["exact"], blob["max_tokens"] = _build()
        blob["prefixes"] = frozenset(k[:i] for k in blob["exact"] for i in range(1, len(k) + 1))
        blob["topic_keys"] = {key(n): tid for tid, _, names, _ in blob["topics"] for n in names}
        save_blob(blob)
    exact = blob["exact"]
    return Index(exact, blob["prefixes"], blob["max_tokens"], {k: bigrams(k) for k in exact},
                 blob["topic_keys"])


def _build() -> tuple[dict[str, list[tuple[str, float]]], int]:
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
            toks = tokens(normalise(name)[0])
            k = "".join(x[0] for x in toks)
            if not k:
                continue
            max_tokens = max(max_tokens, len(toks))
            entries = exact.setdefault(k, [])
            if all(tid != t.id for tid, _ in entries):
                entries.append((t.id, w))
    return exact, max_tokens
