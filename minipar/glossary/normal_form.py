"""The normal form every name, query and scanned text is matched in.

EN text normalisation · RU нормализация текста · ZH 文本规范化

Steps, in order:

1. each character through NFKC and case folding, ``ё`` -> ``е``
   (full-width ``ＤＰ`` -> ``dp``, ``ﬁ`` -> ``fi``);
2. spun Chinese replaced by the standard term (the seed article's
   synonym-spinner vocabulary: 办事器 -> 服务器, 夹杂 -> 混合; the table is
   ``glossary/_normalise.toml``);
3. split into tokens: a run of letters/digits, or one Han character; a
   word directly followed by ``++`` keeps it ("ZeRO++" is the token
   ``zero++``, a different technique from ZeRO, so it must not match
   ``zero``), every other ``+`` is a separator ("DP+TP");
4. each token stemmed (:func:`stem`): a Russian word by the Snowball
   Russian stemmer (Porter's Snowball, ``snowballstemmer``: case, number and
   gender endings), then the derivational ``-н-`` of an adjective dropped so
   that the adjective meets its noun (тензорного -> тензорн -> ``тензор``,
   like тензоров -> ``тензор``); an English plural loses its ``s``; every
   other token is left alone;
5. each stemmed word through the word tables of ``glossary/_normalise.toml``
   (``[en_words]``, ``[ru_words]``: short forms, loanwords and colloquial
   words for the standard one: grad -> gradient, parallel -> parallelism,
   шардинг -> шардирование, пайплайн -> конвейер); separators dropped.

"All-Reduce", "allreduce" and "all reduce" all have the key ``allreduce``;
"параллелизма данных" has ``параллелизмдан``.  Word order is *not* part
of the normal form: :mod:`minipar.glossary.index` enters a Russian name in
each order of its words («накопление градиентов» and «градиентное
накопление» are one name), and the lookup compares the query's words with
a name's words as a bag (:func:`words`).  :func:`normalise` also
returns, for every character of the normal form, the span of the original
text it came from, so a match found in the normal form is reported at its
exact place in the original (``text[start:end]``).
"""

from __future__ import annotations

import re
import unicodedata
from collections.abc import Sequence
from functools import cache, lru_cache
from typing import TYPE_CHECKING

from minipar.glossary.data import cached_blob, spun_table, word_table

if TYPE_CHECKING:
    from typing import ClassVar

HAN = "\u3400-\u4dbf\u4e00-\u9fff\uf900-\ufaff"  # CJK ideographs: each one is a token
_TOKEN = re.compile(rf"[{HAN}]|[^\W_{HAN}]+(?:\+\+(?![^\W_]))?")
_CYR = re.compile(r"[а-я]")
_RU_VOWELS = set("аеиоуыэюяь")


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


@cache
def _russian_stemmer():
    """The Snowball Russian stemmer, imported on the first Cyrillic word (about 30 ms)."""
    import snowballstemmer

    return snowballstemmer.stemmer("russian")


@lru_cache(maxsize=65536)
def stem(word: str) -> str:
    """Stem of one lower-case token: Russian by Snowball, English plurals; other tokens unchanged.

    A Russian adjective keeps its derivational ``-н-`` under Snowball
    (тензорный -> ``тензорн``); a final ``н`` after a consonant is dropped
    from stems of 5 letters or more so that it meets its noun (``тензор``).
    After a vowel it stays (накопление -> ``накоплен``), and so do short
    stems (данные -> ``дан``).
    """
    if _CYR.search(word):
        s = _russian_stemmer().stemWord(word)
        if len(s) >= 5 and s.endswith("н") and s[-2] not in _RU_VOWELS:
            s = s[:-1]
        return s
    if len(word) > 4 and word.isalpha():
        if word.endswith(("ches", "shes", "xes")):
            return word[:-2]
        if word.endswith("s") and not word.endswith(("ss", "us", "is")):
            return word[:-1]
    return word


def normalise(text: str) -> tuple[str, Sequence[int], Sequence[int]]:
    """Normal form of ``text`` (steps 1-2) and, per normal-form char, its [start, end) in ``text``."""
    norm = text.translate(_CHARS)
    if len(norm) == len(text) and not (_CHARS.odd and _CHARS.odd.intersection(text)):
        starts: Sequence[int] = range(len(text))  # one char for one char: offsets unchanged
        ends: Sequence[int] = range(1, len(text) + 1)
    else:
        chars: list[str] = []
        starts, ends = [], []
        for i, c in enumerate(text):
            for ch in _CHARS[ord(c)]:
                chars.append(ch)
                starts.append(i)  # type: ignore[union-attr]
                ends.append(i + 1)  # type: ignore[union-attr]
        norm = "".join(chars)
    rx = spun_regex()
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
        s2 += [starts[a]] * len(rep)  # the replacement spans the whole spun phrase
        e2 += [ends[b - 1]] * len(rep)
        pos = b
    out.append(norm[pos:])
    s2 += starts[pos:]
    e2 += ends[pos:]
    return "".join(out), s2, e2


@cache
def spun_regex() -> re.Pattern[str] | None:
    """One alternation of every spun phrase, longest first (None: an empty table)."""
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


@cache
def _words() -> dict[str, str]:
    """Step 5: stemmed word -> stemmed standard word (``[en_words]``, ``[ru_words]``).

    Kept in the cached blob with the index, so that a lookup from the cache
    stems no Russian word it was not given (and never imports the stemmer).
    """
    blob = cached_blob()
    if "word_stems" not in blob:
        blob["word_stems"] = {stem(k): stem(v) for lang in ("en", "ru")
                              for k, v in word_table(lang).items()}
    return blob["word_stems"]


def tokens(norm: str) -> list[tuple[str, int, int]]:
    """(stemmed token, start, end) for each token (steps 3-5) of a normal-form string."""
    table = _words()
    out = []
    for m in _TOKEN.finditer(norm):
        s = stem(m.group())
        out.append((table.get(s, s), m.start(), m.end()))
    return out


def words(text: str) -> tuple[str, ...]:
    """The stemmed words of a name or query, in order (a Chinese run is one word per character)."""
    return tuple(t[0] for t in tokens(normalise(text)[0]))


def key(text: str) -> str:
    """The matching key of a name or query: normal form, stemmed tokens, no separators."""
    return "".join(t[0] for t in tokens(normalise(text)[0]))
