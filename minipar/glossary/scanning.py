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

Ordinary prose is full of short letter pairs and common words that are also
names here: "pp. 12-19" in a citation, "3d edition", ``cp`` the shell
command, "M. P." initials, "ep. 4", a TV broadcast, a soap bubble.  So a
*context* name -- a Latin key of at most 3 characters (DP, PP, TP, 3D, GA,
MoE) or a word listed under ``[scan] context_words`` of
``glossary/_normalise.toml`` (gate, rank, broadcast, bubble, zero...) -- is
reported only when

1. it is one word as written: no space inside ("M P" is two initials);
2. its letters are written as the name writes them when the name has
   capitals ("DP", "ZeRO", "MoE"; not "dp", "zero", "moe") -- unless a cue
   word is attached by a hyphen or underscore ("pp-stage", "dp_rank",
   "tp-degree") or an ``=`` and a number follows ("pp=4");
3. it is not a citation's abbreviation: no "." and a number after it
   ("pp. 12", "ep. 3");
4. and it stands in context: another term that needs none (an *anchor*:
   "tensor parallelism", 数据并行), or a *cue* word (``[scan] cues``:
   parallel, GPU, rank, stage, degree, градиент, 并行...) lies within
   :data:`WINDOW` characters, or ``=`` and a number follow it ("PP=4").

``scan(text, prose=False)`` drops these rules: a query typed to the
glossary means its letters ("dp overlap").
"""

from __future__ import annotations

import re
from bisect import bisect_left
from collections import namedtuple
from operator import itemgetter

from minipar.glossary.index import SHORT_KEY, index
from minipar.glossary.normal_form import HAN, normalise, tokens

_GAP_OK = re.compile(r"[\s\-‐‑‒–—_/·+]*")
_ATTACHED = re.compile(r"[\-‐‑_]")  # "pp-stage", "dp_rank": a cue glued to the name
_EQUALS_NUMBER = re.compile(r"\s*[=:]\s*\d")  # "PP=4", "TP: 8"
_CITATION = re.compile(r"\.\s*\d")  # "pp. 12", "ep. 3"
_HAN_RUN = re.compile(f"[{HAN}]+")
WINDOW = 120  # characters either side of a context name in which an anchor or a cue counts
_start = itemgetter(1)


class Match(namedtuple("Match", "id start end text")):
    """A term found in a text: ``text[start:end]`` (character offsets) names term ``id``."""

    __slots__ = ()

    def as_dict(self) -> dict[str, object]:
        return {"id": self.id, "start": self.start, "end": self.end, "text": self.text}


def scan(text: str, prose: bool = True, cues: frozenset[str] = frozenset()) -> list[Match]:
    """Every glossary term named in ``text`` (any language), left to right, longest match first.

    Tokens must be adjacent, separated only by spaces, hyphens, slashes or
    ``+``; offsets refer to the original ``text``.  With ``prose`` (the
    default) short names and ordinary words count only in context (see the
    module docstring); ``cues`` are more stemmed words that give context.
    """
    if not isinstance(text, str):
        raise TypeError(f"scan() needs a str, got {type(text).__name__}")
    idx = index()
    norm, starts, ends = normalise(text)
    toks = tokens(norm)
    found: list[tuple[Match, int, int, bool]] = []  # match, token span, needs context
    i = 0
    while i < len(toks):
        concat = ""
        best: tuple[int, str, str] | None = None
        for j in range(i, min(len(toks), i + idx.max_tokens)):
            if j > i and not _GAP_OK.fullmatch(norm, toks[j - 1][2], toks[j][1]):
                break
            concat += toks[j][0]
            if concat not in idx.prefixes:
                break
            hit = idx.exact.get(concat)
            if hit:
                best = (j, hit[0][0], concat)
        if best is None:
            i += 1
            continue
        j, tid, k = best
        a = min(starts[x] for x in range(toks[i][1], toks[j][2]))
        b = max(ends[x] for x in range(toks[i][1], toks[j][2]))
        found.append((Match(tid, a, b, text[a:b]), i, j, prose and k in idx.context))
        i = j + 1
    if not prose:
        return [m for m, *_ in found]
    anchors = [m.start for m, _, _, ctx in found if not ctx]
    return [m for m, i, j, ctx in found
            if not ctx or _in_context(text, norm, toks, m, i, j, anchors, cues)]


def _in_context(text: str, norm: str, toks: list[tuple[str, int, int]], m: Match, i: int, j: int,
                anchors: list[int], cues: frozenset[str]) -> bool:
    """Rules 1-4 of the module docstring for a context name ``m`` (tokens ``i..j`` of the text)."""
    idx = index()
    key = "".join(t[0] for t in toks[i:j + 1])
    if len(key) <= SHORT_KEY and any(c.isspace() for c in m.text):  # rule 1: "M P" is initials
        return False
    after = text[m.end:m.end + 8]
    if _CITATION.match(after):  # rule 3: "pp. 12"
        return False
    if _EQUALS_NUMBER.match(after):  # rule 4's nearest case: "PP=4" (any case: "pp=4")
        return True
    nxt = toks[j + 1] if j + 1 < len(toks) else None
    if nxt and _ATTACHED.fullmatch(norm, toks[j][2], nxt[1]) and nxt[0] in idx.cues:
        return True  # rule 2's exception: "pp-stage", "dp_rank"
    forms = idx.forms.get(key)
    if forms and re.sub(r"[\W_]", "", m.text) not in forms:  # rule 2: "dp" is not "DP"
        return False
    k = bisect_left(anchors, m.start - WINDOW)  # rule 4: an anchor nearby (anchors are sorted)
    if k < len(anchors) and anchors[k] <= m.end + WINDOW:
        return True
    lo, hi = max(0, toks[i][1] - WINDOW), toks[j][2] + WINDOW
    near = toks[bisect_left(toks, lo, key=_start):bisect_left(toks, hi, key=_start)]
    if any(t[0] in idx.cues or t[0] in cues for t in near):
        return True
    window = "".join(_HAN_RUN.findall(norm, lo, hi))
    return any(c in window for c in idx.cues if _HAN_RUN.fullmatch(c))
