"""Text data: the byte tokenizer, a text as a data set, the embedded corpus.

The oracle for batches is the contract every data set keeps
(:mod:`minipar.data.batches`): the global batch is a pure function of
(seed, step), rows [lo, hi) of it are the rows of the whole batch, and each row is
a window of its split with targets = tokens shifted by one byte.
"""

from __future__ import annotations

import ast
import hashlib
import math
import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from minipar.data import corpus, text, tokenizer
from minipar.glossary import data as glossary_data
from minipar.parallel.common import local_rows

RU = "Параллелизм данных: каждый ранг считает градиенты своей части батча."
ZH = "数据并行：每个进程计算自己那部分批次的梯度，然后全归约。"


# -- the tokenizer -------------------------------------------------------------------

@pytest.mark.parametrize("s, bytes_per_char", [("data parallel", 1), (RU.split()[0], 2),
                                              (ZH[:4], 3)])
def test_round_trip_and_bytes_per_character(s: str, bytes_per_char: int) -> None:
    ids = tokenizer.encode(s)
    assert ids.dtype == np.int64 and len(ids) == bytes_per_char * len(s)
    assert ids.min() >= 0 and ids.max() < tokenizer.VOCAB_SIZE == 256
    assert tokenizer.decode(ids) == s and tokenizer.decode(list(ids)) == s


def test_mixed_text_round_trips_and_is_its_utf8_bytes() -> None:
    s = f"{RU}\n{ZH}\nemoji 🙂, tab\t, NUL-free"
    np.testing.assert_array_equal(tokenizer.encode(s), list(s.encode("utf-8")))
    assert tokenizer.decode(tokenizer.encode(s)) == s
    assert tokenizer.decode([]) == "" and len(tokenizer.encode("")) == 0


def test_invalid_utf8_decodes_with_replacement_characters_never_raises() -> None:
    zh = list("环".encode())
    assert tokenizer.decode([0xFF, 0x61]) == "\ufffda"           # a byte no character starts with
    assert tokenizer.decode(zh[:2]) == "\ufffd"                  # a character cut short
    assert tokenizer.decode([0x80, *zh]) == "\ufffd环"           # a stray continuation byte
    assert tokenizer.decode(np.array([0xC3], dtype=np.uint8)) == "\ufffd"


def test_stream_decoder_holds_back_a_partial_character() -> None:
    s = "да, 环"
    dec = tokenizer.stream_decoder()
    pieces = [dec.decode(bytes([b])) for b in tokenizer.encode(s)]
    assert pieces[:2] == ["", "д"] and "".join(pieces) + dec.decode(b"", final=True) == s
    cut = tokenizer.stream_decoder()  # a text that ends inside a character
    assert cut.decode("环".encode()[:2]) == "" and cut.decode(b"", final=True) == "\ufffd"


@pytest.mark.parametrize("ids, words", [([256], "[0, 256)"), ([-1], "[0, 256)"),
                                        ([[1, 2]], "1-D"), ([1.5], "integers")])
def test_ids_that_are_not_bytes_are_refused(ids, words: str) -> None:
    with pytest.raises(ValueError, match=words.replace("[", r"\[").replace(")", r"\)")):
        tokenizer.decode(ids)


def test_a_lone_surrogate_cannot_be_encoded() -> None:
    with pytest.raises(ValueError, match="cannot encode as UTF-8.*character 2"):
        tokenizer.encode("ab\ud800")


# -- a text as a data set ------------------------------------------------------------

def _data(tmp_path: Path, content: str | bytes, seed: int = 0, name: str = "t.txt"):
    p = tmp_path / name
    p.write_bytes(content.encode() if isinstance(content, str) else content)
    return text.load(p, seed=seed)


def _windows(split: np.ndarray, t: int) -> set[bytes]:
    return {split[i:i + t].tobytes() for i in range(len(split) - t + 1)}


def test_batches_are_windows_of_the_split_with_targets_shifted_by_one(tmp_path: Path) -> None:
    d = _data(tmp_path, (RU + ZH + " the quick brown fox ") * 20)
    x, y = d.batch(4, 6, 16)
    assert x.shape == y.shape == (6, 16) and x.dtype == y.dtype == np.int64
    np.testing.assert_array_equal(x[:, 1:], y[:, :-1])
    train = _windows(d.train, 17)
    for a, b in zip(x, y):
        assert np.concatenate([a, b[-1:]]).astype(np.uint8).tobytes() in train


def test_same_seed_and_step_same_bits_other_step_or_seed_other_batch(tmp_path: Path) -> None:
    body = "".join(f"line {i}: {RU[i % 20:]}\n" for i in range(60))
    d, same, other_seed = (_data(tmp_path, body, seed=s) for s in (3, 3, 4))
    for split in text.SPLITS:
        a, b = d.batch(7, 5, 12, split=split), same.batch(7, 5, 12, split=split)
        for u, v in zip(a, b):
            np.testing.assert_array_equal(u, v)
        assert not np.array_equal(a[0], d.batch(8, 5, 12, split=split)[0])
        assert not np.array_equal(a[0], other_seed.batch(7, 5, 12, split=split)[0])


def test_slices_of_the_global_batch_are_its_rows_on_any_number_of_ranks(tmp_path: Path) -> None:
    d = _data(tmp_path, ZH * 40)
    whole = d.batch(2, 7, 9)
    for world in (1, 2, 3, 7):
        parts = [d.batch(2, 7, 9, *local_rows(7, r, world)) for r in range(world)]
        for i in range(2):
            np.testing.assert_array_equal(np.concatenate([p[i] for p in parts]), whole[i])
    assert d.batch(2, 7, 9, lo=3, hi=3)[0].shape == (0, 9)
    with pytest.raises(ValueError, match="inside the global batch"):
        d.batch(2, 7, 9, lo=5, hi=8)


def test_train_and_validation_are_disjoint_and_validation_is_the_tail(tmp_path: Path) -> None:
    d = _data(tmp_path, "a" * 900 + "b" * 100)
    assert (d.split_at, len(d.train), len(d.validation)) == (900, 900, 100)
    assert set(np.unique(d.batch(0, 32, 20)[0])) == {ord("a")}
    assert set(np.unique(d.batch(0, 32, 20, split="validation")[0])) == {ord("b")}
    # the cut moves forward to a character's first byte: 101 bytes, 101·9 // 10 = 90 is
    # the second byte of a "я" (the letters start at odd offsets)
    d = _data(tmp_path, "x" + "я" * 50)
    assert d.split_at == 91 and tokenizer.decode(d.validation) == "я" * 5
    np.testing.assert_array_equal(np.concatenate([d.train, d.validation]), d.data)


def test_unigram_entropy_fingerprint_and_record(tmp_path: Path) -> None:
    d = _data(tmp_path, "ab" * 540 + "c" * 120)
    assert d.unigram_entropy() == pytest.approx(math.log(2))        # train: "abab…" only
    assert d.unigram_entropy("validation") == pytest.approx(0.0)   # validation: "ccc…"
    raw = (tmp_path / "t.txt").read_bytes()
    assert d.sha256 == hashlib.sha256(raw).hexdigest()
    assert _data(tmp_path, raw[:-1] + b"d").sha256 != d.sha256
    assert d.as_dict() == {"name": str(tmp_path / "t.txt"), "bytes": 1200, "train_bytes": 1080,
                           "validation_bytes": 120, "seed": 0, "sha256": d.sha256,
                           "tokenizer": "utf-8 bytes", "vocab_size": 256}
    assert d.vocab_size == 256


def _refusal(make) -> str:
    with pytest.raises(ValueError) as info:
        make()
    msg = str(info.value)
    assert "\n" not in msg
    return msg


def test_each_bad_file_is_refused_in_one_line_naming_it(tmp_path: Path) -> None:
    f = tmp_path / "t.txt"
    cases = {
        "no such file": lambda: text.load(tmp_path / "missing.txt"),
        "not a regular file": lambda: text.load(tmp_path),
        "empty": lambda: _data(tmp_path, b""),
        "binary file, not text (a NUL byte at offset 3)": lambda: _data(tmp_path, b"abc\0def"),
        "not UTF-8 text (byte 0xe9 at offset 3": lambda: _data(tmp_path, "café".encode("latin-1")),
        "not UTF-8 text (byte 0xff at offset 0": lambda: _data(tmp_path, "привет".encode("utf-16")),
    }
    for words, make in cases.items():
        msg = _refusal(make)
        assert words in msg, msg
        assert msg.startswith(str(tmp_path)), msg
    d = _data(tmp_path, "z" * 100)  # 90 train bytes, 10 validation bytes
    msg = _refusal(lambda: d.batch(0, 2, 10, split="train"))  # either split too short: refused
    assert msg.startswith(f"{f}: too short: its validation split (the last 10% of the bytes) has "
                          "10 bytes, fewer than seq_len + 1 = 11"), msg
    d.check_length(9)  # both splits hold a window of 10 bytes
    short = _data(tmp_path, "z" * 5)
    assert "its train split (the first 90% of the bytes) has 4 bytes" in _refusal(
        lambda: short.check_length(4))
    assert "split must be one of train, validation" in _refusal(
        lambda: d.batch(0, 2, 4, split="test"))
    assert "data seed must be an integer >= 0" in _refusal(lambda: text.load(f, seed=-1))


# -- the embedded corpus -------------------------------------------------------------

def test_the_embedded_corpus_has_three_languages_and_enough_bytes() -> None:
    s = corpus.stats()
    assert s["bytes"] > 300_000 and s["glossary_bytes"] > 50_000 and s["docstring_bytes"] > 200_000
    assert s["cyrillic"] > 10_000 and s["cjk"] > 3_000 and s["ascii"] > 200_000
    assert s["bytes"] == len(corpus.data()) and s["characters"] == len(corpus.text())
    d = text.load()
    assert d.name == corpus.NAME and d.sha256 == hashlib.sha256(corpus.data()).hexdigest()
    v = corpus.script_counts(tokenizer.decode(d.validation))
    assert v["cyrillic"] > 0 and v["cjk"] > 0  # every docstring's title line is trilingual
    assert d.unigram_entropy() < math.log(256)
    x, _ = d.batch(0, 4, 64)
    assert x.shape == (4, 64)


def test_the_corpus_is_every_card_then_every_module_docstring() -> None:
    s = corpus.text()
    terms = glossary_data.terms()
    first = terms[0]
    assert s.startswith(f"{first.names['en']}\n{first.definition['en']}\n{first.names['ru']}\n")
    for t in terms:
        for lang in glossary_data.LANGS:
            assert f"{t.names[lang]}\n{t.definition[lang]}" in s, (t.id, lang)
    assert s.index(terms[-1].definition["zh"]) < s.index("\n\nminipar.data.corpus\n")
    own = ast.get_docstring(ast.parse(Path(corpus.__file__).read_text(encoding="utf-8")))
    assert f"\n\nminipar.data.corpus\n{own}\n\n" in s


@pytest.mark.parametrize("source", [
    '"""One line."""\nx = 1\n', '# a comment\n\n"""Doc\n    indented."""\n', "x = 1\n",
    "'''a'''.strip()\n", '"""a"""\n', '"""no newline at the end"""', "",
    '"a" "b"\nimport os\n', 'if True:\n    """not a docstring"""\n'])
def test_docstring_reads_only_the_first_statement_as_ast_does(source: str) -> None:
    assert corpus.docstring(source) == ast.get_docstring(ast.parse(source))


def test_the_corpus_loads_from_an_installed_package_without_the_checkout(tmp_path: Path) -> None:
    """The wheel's layout (``minipar/`` with the glossary as ``minipar/_glossary``, no
    ``glossary/`` beside it, no docs): a fresh interpreter reads the same corpus."""
    pkg = Path(corpus.__file__).resolve().parent.parent
    shutil.copytree(pkg, tmp_path / "minipar", ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copytree(glossary_data.data_dir(), tmp_path / "minipar" / "_glossary")
    probe = ("import minipar, sys; from minipar.data import corpus, text; "
             "from minipar.glossary import data as g; "
             "print(minipar.__file__, g.data_dir(), text.load().sha256, sep='\\n')")
    env = {**os.environ, "MINIPAR_NO_CACHE": "1"}
    env.pop("PYTHONPATH", None)
    out = subprocess.run([sys.executable, "-c", probe], cwd=tmp_path, env=env, text=True,
                         capture_output=True, timeout=60, check=True).stdout.split()
    home = tmp_path / "minipar"
    assert out == [str(home / "__init__.py"), str(home / "_glossary"), text.load().sha256]
