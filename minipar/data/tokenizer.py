"""Byte-level tokenizer — побайтовый токенизатор — 字节级分词器.

A token is one byte of the text's UTF-8 encoding, so the vocabulary is the 256
byte values, and nothing has to be learned or stored to tokenize:

    encode("ab")   = [97, 98]                      1 byte per Latin letter
    encode("да")   = [208, 180, 208, 176]          2 bytes per Cyrillic letter
    encode("环")   = [231, 142, 175]                3 bytes per Chinese character

Why bytes, for a course on training rather than on tokenizers:

* **No unknown token.** Every string has a UTF-8 encoding, so English, Russian,
  Chinese, code and emoji all go in as they are; a word-level or a trained BPE
  vocabulary meets characters it never saw, bytes cannot.
* **Nothing to fit, nothing to ship.** The tokenizer of a checkpoint is its
  name and vocabulary size (:data:`NAME`, :data:`VOCAB_SIZE`), the same on
  every machine.
* **The price is length.** A Russian text is about twice as many tokens as
  characters, a Chinese one three times (GPT-2's BPE, Radford et al. 2019,
  starts from these same bytes and merges frequent pairs to shorten them): the
  model must learn to spell each character from 2 or 3 bytes, and a context of
  64 tokens holds 64 Latin letters but only ~21 Chinese characters.

Decoding is the other direction, and a model can emit any byte sequence,
including ones that are not UTF-8 (a lead byte with no continuation, a stray
continuation byte).  :func:`decode` never raises on those: each invalid byte
becomes U+FFFD, the replacement character ``�`` (``errors="replace"``), so a
sample always prints and shows where the model went wrong.  A sampler that
prints as it goes feeds its bytes to :func:`stream_decoder`, which holds back
the first bytes of a character until the rest arrive.
"""

from __future__ import annotations

import codecs
from typing import Any

import numpy as np  # host-side: token ids are built here, then moved with to_device

from minipar.backend import to_host

#: the tokenizer's name, as a checkpoint records it
NAME = "utf-8 bytes"
#: one token per byte value
VOCAB_SIZE = 256


def encode(text: str) -> np.ndarray:
    """The UTF-8 bytes of ``text`` as token ids: int64, shape (len(text.encode()),).

    ValueError (one line) only for a string that has no UTF-8 encoding, i.e. one
    holding a lone surrogate such as ``"\\ud800"``.
    """
    try:
        raw = text.encode("utf-8")
    except UnicodeEncodeError as e:
        raise ValueError(f"cannot encode as UTF-8: {e.reason} at character {e.start}") from None
    return np.frombuffer(raw, dtype=np.uint8).astype(np.int64)


def decode(ids: Any) -> str:
    """The text of token ids (a sequence or a 1-D array of ints in [0, 256)).

    Never raises on invalid UTF-8: each byte that does not begin a valid
    character is shown as U+FFFD.  ValueError for ids that are not bytes.
    """
    a = np.asarray(to_host(ids))
    if a.ndim > 1 or (a.size and not np.issubdtype(a.dtype, np.integer)):
        raise ValueError(f"token ids must be a 1-D sequence of integers, got dtype {a.dtype} "
                         f"and shape {a.shape}")
    if a.size and (int(a.min()) < 0 or int(a.max()) >= VOCAB_SIZE):
        raise ValueError(f"token ids must be bytes in [0, {VOCAB_SIZE}), got "
                         f"{int(a.min())}..{int(a.max())}")
    return a.astype(np.uint8).tobytes().decode("utf-8", errors="replace")


def stream_decoder() -> codecs.IncrementalDecoder:
    """An incremental UTF-8 decoder (``errors="replace"``): ``.decode(bytes(ids))`` per step
    returns the characters completed so far; ``.decode(b"", final=True)`` ends the text."""
    return codecs.getincrementaldecoder("utf-8")(errors="replace")
