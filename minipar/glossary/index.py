"""The matching index: every name of every term, by its key.

EN inverted index · RU обратный индекс · ZH 倒排索引

Each term is entered under the key (:func:`minipar.glossary.normal_form.key`)
of its id, its names in three languages (weight 1), its abbreviations
(0.98) and aliases (0.97); a name of the form "Всеобщая редукция
(All-Reduce)" is entered in both parts too.  A Russian name of two or three
words is entered in every order of its words as well (weight x 0.99):
Russian word order is free, «градиентное накопление» is «накопление
градиентов» (an order that another term owns is left to it).

Besides the exact table the index keeps

* ``prefixes``: every prefix of every key (:func:`minipar.glossary.scan`
  stops extending a match when it leaves that set), and ``max_tokens``, the
  most tokens in one name;
* ``bounds``: for each key, the offsets where one of its words starts (a
  typed query may match *inside* a key only from such a place, never from
  the middle of a word: "allel" is not "parallelism");
* ``parts``: each name of two or more words as a set of its stemmed words,
  for the order-free comparison of :mod:`minipar.glossary.search`;
* ``forms`` and ``context``: what a scan of prose needs to trust a short
  name (:mod:`minipar.glossary.scanning`): the written forms of each Latin
  key that has capitals (DP, ZeRO, MoE: "dp" in prose is not DP), and the
  keys that need context (every Latin key of at most 3 characters, and the
  ordinary words listed under ``[scan]`` of ``glossary/_normalise.toml``);
* ``cues``: the stems of the words that give such a name its context;
* ``zh_words``: the Chinese words of the glossary with a count each -- the
  dictionary :mod:`minipar.glossary.zh_words` gives jieba (every Han run of a
  name of at most 3 characters, every 2-4 character piece shared by the
  names of two terms, and the words of ``[zh_words]``);
* ``topics``: the keys of the topics' names (``glossary/_topics.toml``:
  "sharding" -> the sharding terms, answered as a list by
  :func:`minipar.glossary.search.topic`).

Built once per data change and cached with the data (:mod:`minipar.glossary.data`).
"""

from __future__ import annotations

import re
from collections import Counter, namedtuple
from functools import cache
from itertools import permutations

from minipar.glossary.data import LANGS, cached_blob, save_blob, scan_table, terms, word_table
from minipar.glossary.normal_form import HAN, key, normalise, tokens

Index = namedtuple("Index", "exact prefixes max_tokens bounds parts forms context cues zh_words topics")
_PAREN = re.compile(r"\s*(.+?)\s*[(（](.+)[)）]\s*")
_HAN_RUN = re.compile(f"[{HAN}]+")
_LATIN_KEY = re.compile(r"[a-z0-9+]+")
SHORT_KEY = 3  # a Latin key this short (DP, PP, 3D, MoE) is trusted in prose only in context


@cache
def index() -> Index:
    """The index, from the cached blob, or built now (and then saved with the blob)."""
    blob = cached_blob()
    if "exact" not in blob:
        blob.update(_build())
        save_blob(blob)
    return Index(blob["exact"], blob["prefixes"], blob["max_tokens"], blob["bounds"],
                 blob["parts"], blob["forms"], blob["context"], blob["cues"], blob["zh_words"],
                 blob["topic_keys"])


def _names(t) -> list[tuple[str, float]]:
    """Every name of a term with its weight: id, names, abbreviations, aliases, parenthesised parts."""
    weighted = [(t.id, 1.0)] + [(n, 1.0) for n in t.names.values()] + [(a, 0.98) for a in t.abbrev]
    weighted += [(a, 0.97) for lang in LANGS for a in t.aliases.get(lang, [])]
    for name in t.names.values():  # "Всеобщая редукция (All-Reduce)": both parts are names too
        m = _PAREN.fullmatch(name)
        if m:
            weighted += [(m.group(1), 1.0), (m.group(2), 0.97)]
    return weighted


def _build() -> dict[str, object]:
    """Every table of the index (see the module docstring), as plain data the cache can hold."""
    exact: dict[str, list[tuple[str, float]]] = {}
    bounds: dict[str, tuple[int, ...]] = {}
    parts: list[tuple[tuple[str, ...], str, float]] = []
    forms: dict[str, list[str]] = {}
    lower_forms: set[str] = set()
    max_tokens = 1
    reordered: list[tuple[str, str, float, tuple[int, ...]]] = []

    def enter(k: str, tid: str, w: float, starts: tuple[int, ...]) -> None:
        entries = exact.setdefault(k, [])
        if all(t != tid for t, _ in entries):
            entries.append((tid, w))
        bounds.setdefault(k, starts)

    for t in terms():
        for n, (name, w) in enumerate(_names(t)):
            toks = tokens(normalise(name)[0])
            words = tuple(x[0] for x in toks)
            k = "".join(words)
            if not k:
                continue
            max_tokens = max(max_tokens, len(toks))
            enter(k, t.id, w, _starts(words))
            if len(set(words)) >= 2:
                parts.append((words, t.id, w))
            if _LATIN_KEY.fullmatch(k) and n > 0:  # the id (first) is no written form
                spelt = re.sub(r"[\W_]", "", name)
                (forms.setdefault(k, []).append(spelt) if spelt != spelt.lower() else lower_forms.add(k))
            if 2 <= len(words) <= 3 and re.search("[а-я]", k):
                for order in set(permutations(words)) - {words}:
                    reordered.append(("".join(order), t.id, w * 0.99, _starts(order)))
    for k, tid, w, starts in reordered:  # a word order another term owns is left to that term
        if all(t == tid for t, _ in exact.get(k, [])):
            enter(k, tid, w, starts)
    context = {k for k in exact if _LATIN_KEY.fullmatch(k) and len(k) <= SHORT_KEY}
    context |= {key(w) for w in scan_table("context_words")}
    return {
        "exact": exact, "max_tokens": max_tokens, "bounds": bounds, "parts": parts,
        "prefixes": frozenset(k[:i] for k in exact for i in range(1, len(k) + 1)),
        "forms": {k: sorted(set(v)) for k, v in forms.items() if k not in lower_forms},
        "context": frozenset(context & set(exact)),
        "cues": frozenset(key(c) for c in scan_table("cues")),
        "zh_words": _zh_dictionary(),
        "topic_keys": {key(n): tid for tid, _, names, _ in cached_blob()["topics"] for n in names},
    }


def _starts(words: tuple[str, ...]) -> tuple[int, ...]:
    """Offsets in the joined key where each word starts (every character of a Han run)."""
    out, pos = [], 0
    for w in words:
        out.append(pos)
        pos += len(w)
    return tuple(out)


def _zh_dictionary() -> dict[str, int]:
    """The glossary's Chinese words with a count each: jieba's dictionary (see the docstring)."""
    runs: dict[str, set[str]] = {}  # Han run -> the terms whose names have it
    for t in terms():
        for name, _ in _names(t):
            for run in _HAN_RUN.findall(normalise(name)[0]):
                runs.setdefault(run, set()).add(t.id)
    owners: dict[str, set[str]] = {}
    for run, tids in runs.items():
        for n in range(2, 5):
            for i in range(len(run) - n + 1):
                owners.setdefault(run[i:i + n], set()).update(tids)
    count: Counter[str] = Counter({w: len(tids) for w, tids in owners.items() if len(tids) >= 2})
    for run, tids in runs.items():
        if len(run) <= 3:
            count[run] = max(count[run], len(tids))
    for a, b in word_table("zh").items():
        count[a] = max(count[a], 1)
        count[b] = max(count[b], 1)
    return dict(count)


