"""Glossary · Глоссарий · 术语表: trilingual lookup and scan over ``glossary/``.

Every term of the field is one TOML file in ``glossary/`` (schema:
``glossary/README.md``), shipped in the wheel as ``minipar/_glossary``.
This package loads them and answers three questions:

* :func:`lookup` -- "what is X?" for a query in English, Russian or Chinese:
  exact names, aliases and abbreviations first, then inflected Russian forms
  (the Snowball stemmer) in any word order, spun Chinese (the seed article's
  synonym-spinner vocabulary, normalised by the table in
  ``glossary/_normalise.toml``), Chinese read word by word (jieba with the
  glossary's own dictionary), and typos (Levenshtein distance by
  ``rapidfuzz``); a similarity floor turns nonsense into "no match".
* :func:`topic` -- "which terms does this family word cover?" ("sharding",
  «шардирование», 分片 -> the sharding terms, listed rather than guessed).
* :func:`scan` -- "which terms does this text use?": every term found in a
  text, with ``start``/``end`` character offsets into the *original* text, so
  ``text[start:end]`` is exactly what was matched; short names (DP, PP, 3D)
  and ordinary words (rank, bubble) count only in context, so ordinary prose
  ("pp. 12-19", "3d edition", ``cp``) names nothing.

Both work on one normal form: NFKC, case-folded, ``ё`` -> ``е``, spun Chinese
replaced, split into tokens (a run of letters/digits, or one Han character),
each word stemmed, separators dropped.  "All-Reduce", "allreduce" and
"all reduce" all become ``allreduce``; "параллелизма данных" becomes
``параллелизмдан``.

One module per step, each importable alone:

* :mod:`~minipar.glossary.data`         the TOML files -> :class:`Term`; the marshal cache
* :mod:`~minipar.glossary.normal_form`  normal form, tokens, stemmer, keys
* :mod:`~minipar.glossary.index`        key -> term ids over every name
* :mod:`~minipar.glossary.scanning`     :func:`scan`: terms in a text, with offsets
* :mod:`~minipar.glossary.search`       :func:`lookup`, :func:`score_all`, :func:`closest`
* :mod:`~minipar.glossary.zh_words`     Chinese queries cut into the glossary's words (jieba)
* :mod:`~minipar.glossary.links`        :func:`link_status`: does a linked module exist now?

Nothing heavy is imported here: ``minipar glossary`` must start without
NumPy or mpi4py (and imports ``snowballstemmer``, ``rapidfuzz`` and
``jieba`` only on the paths that need them), and nothing here imports a command-line module (both
checked by ``tests/test_glossary_cli.py`` and ``tests/test_glossary_overview.py``).
"""

from __future__ import annotations

from minipar.glossary import data as _data
from minipar.glossary import index as _index
from minipar.glossary import normal_form as _normal_form
from minipar.glossary.data import (
    LANGS,
    PKG_DIR,
    Term,
    Topic,
    by_id,
    data_dir,
    parse_term,
    seed_label,
    seed_lang,
    seed_title,
    spun_table,
    terms,
    topics,
)
from minipar.glossary.links import PLANNED, link_status
from minipar.glossary.normal_form import key, stem
from minipar.glossary.scanning import Match, scan
from minipar.glossary.search import (
    MATCH_FLOOR,
    MAX_FUZZY_KEY,
    SUGGEST_FLOOR,
    Hit,
    closest,
    levenshtein,
    lookup,
    score_all,
    topic,
)

__all__ = [
    "LANGS", "MATCH_FLOOR", "MAX_FUZZY_KEY", "PKG_DIR", "PLANNED", "SUGGEST_FLOOR", "Hit", "Match", "Term", "Topic",
    "by_id", "clear_caches", "closest", "data_dir", "key", "levenshtein", "link_status", "lookup",
    "parse_term", "scan", "score_all", "seed_label", "seed_lang", "seed_title", "spun_table", "stem", "terms", "topic", "topics",
]


def clear_caches() -> None:
    """Forget everything loaded (for tests and benchmarks); the next call reloads."""
    from minipar.glossary import search as _search
    from minipar.glossary import zh_words as _zh_words

    for f in (_data.cached_blob, _data.terms, _normal_form.spun_regex, _normal_form._words,
              _normal_form.stem, _index.index, _zh_words._tokenizer, _search._vocabulary):
        f.cache_clear()
