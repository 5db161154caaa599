"""Chinese words: a query cut into the glossary's words, each read as the glossary's word.

EN word segmentation · RU сегментация слов · ZH 中文分词

Chinese is written without spaces, and articles name a term by its parts in
their own words: 全部减少 ("all" + "decrease", a literal translation of
all-reduce) for 全归约, 重新计算激活 for 激活重计算, 环全归约 for 环形全归约.
Characters alone cannot tell these apart, words can:

1. the query (in normal form, :mod:`minipar.glossary.normal_form`) is cut
   into words by jieba (Sun Junyi's segmenter, ``jieba`` on PyPI: the most
   probable path through the graph of dictionary words) with a dictionary of the glossary's own words only
   (:func:`minipar.glossary.index._zh_dictionary`: pieces of its names and the
   words of ``[zh_words]``) -- jieba's full dictionary of 350,000 words costs
   half a second to load, this one a millisecond, and is kept with the index
   in the glossary's cache (``~/.cache/minipar``), never in the temp folder;
   jieba's HMM guesser of unknown words is off (a character outside the
   dictionary stays one character);
2. each word goes through ``[zh_words]`` of ``glossary/_normalise.toml``
   (全部 -> 全, 减少 -> 归约, 环 -> 环形, 重新计算 -> 重计算);
3. the words are joined in every order (up to three words; Chinese puts the
   modifier first as English does, but articles invert it: 重新计算激活).

:func:`readings` returns those joined forms; :mod:`minipar.glossary.search`
looks each up as a name.  Only a query is read this way: in a scanned text
减少 "decrease" must stay an ordinary word, so a scan matches names
character by character.  jieba is imported on the first Chinese query that
no name matches as written (about 0.1 s).
"""

from __future__ import annotations

from functools import cache
from itertools import permutations

from minipar.glossary.data import word_table
from minipar.glossary.index import index
from minipar.glossary.normal_form import normalise

MAX_WORDS = 3  # more words than this are not reordered (3! = 6 orders at most)


@cache
def _tokenizer():
    """A jieba tokenizer whose dictionary is the glossary's words (no file, no temp folder)."""
    import logging

    import jieba

    jieba.setLogLevel(logging.WARNING)
    tok = jieba.Tokenizer()
    freq: dict[str, int] = {}
    for word, n in index().zh_words.items():  # what jieba.Tokenizer.gen_pfdict builds from a file
        freq[word] = n
        for i in range(1, len(word)):
            freq.setdefault(word[:i], 0)
    tok.FREQ, tok.total, tok.initialized = freq, sum(index().zh_words.values()), True
    return tok


def cut(text: str) -> list[str]:
    """``text`` cut into words by jieba with the glossary's dictionary (spaces dropped)."""
    return [w for w in _tokenizer().cut(normalise(text)[0], HMM=False) if w.strip()]


def readings(text: str) -> list[str]:
    """The query's words read as the glossary's words, joined in each order (the original first)."""
    table = word_table("zh")
    words = [table.get(w, w) for w in cut(text)]
    if len(words) > MAX_WORDS:
        return ["".join(words)]
    out = ["".join(words)]
    out += sorted({"".join(p) for p in permutations(words)} - set(out))
    return out
