"""Scan: which glossary terms does a text name, and where?

EN term extraction · RU поиск терминов в тексте · ZH 术语抽取

Left to right over the text's tokens (:mod:`minipar.glossary.normal_form`),
the longest run of adjacent tokens whose joined key is a name in the index
(:mod:`minipar.glossary.index`) wins, and scanning resumes after it.  Tokens
count as adjacent when only spaces, hyphens, dashes, slashes, ``·`` or ``+``
separate them ("ring all-reduce", "ZeRO-1/2/3"), never across other
punctuation.  Cost: one pass, at most ``max_tokens`` tokens tried from each
position, each step a set lookup (a megabyte of text takes about a second).
Offsets are character offsets into the *original* text: ``text[start:end]``
is exactly what was matched, whatever normalisation did.
"""

from __future__ import annotations

import re
from collections import namedtuple

from minipar.glossary.index import index
from minipar.glossary.normal_form import normalise, tokens

_GAP_OK = re.compile(r"[\s\-‐‑‒–—_/·+]*")


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
    idx = index()
    norm, starts, ends = normalise(text)
    toks = tokens(norm)
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
