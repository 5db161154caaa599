"""A text as a data set — текст как набор данных — 文本数据集.

One UTF-8 text, tokenized by bytes (:mod:`minipar.data.tokenizer`, vocabulary
256), cut into a training and a validation split, and sampled the way every
data set of minipar is (:mod:`minipar.data.batches`): the global batch of step
``s`` is a pure function of ``(seed, s)``, so rows ``[lo, hi)`` of it are the
same bytes on whichever rank asks, and a parallel run on text sees exactly the
serial run's batches.

**The split** (nanoGPT's): the first 90% of the bytes train, the last 10%
validate.  The cut is at byte ``n·9 // 10``, moved forward to the start of a
character (past UTF-8 continuation bytes ``10xxxxxx``), so neither split begins
inside a character.  The validation text is never trained on, so its loss
measures what the model learned about the text rather than what it memorised.

**A batch** of ``B`` rows and ``T`` tokens: ``B`` window starts, uniform in
``[0, n − T − 1]`` over the split's ``n`` bytes, drawn from
``SeedSequence([seed, s, task id])`` (task ``text.train`` or
``text.validation``; all ``B`` are drawn, then rows ``[lo, hi)`` kept); row
``i`` is the ``T + 1`` bytes from its start, ``tokens`` the first ``T`` and
``targets`` the last ``T``::

    text     …  t  h  e     c  a  t  …
    tokens      t  h  e     c            targets[:, t] = tokens[:, t + 1],
    targets        h  e     c  a            continued one byte past the end

exactly the contract of :func:`minipar.data.synthetic.modular_sum`.

**The loss to beat** is the text's unigram entropy H = −Σ p(b) ln p(b) over
the byte frequencies p of the training split (:meth:`TextData.unigram_entropy`,
nats per byte): the cross-entropy of a model that ignores the context and
predicts every byte from its frequency alone.  Validation loss well below H
means the model uses the context.  (A uniform guess costs ln 256 ≈ 5.55.)

**What a checkpoint records** (:meth:`TextData.as_dict`): the name, sizes,
seed and the SHA-256 of the whole text's bytes (:attr:`TextData.sha256`), so a
resumed run can refuse another text.

**Refused, in one line naming the file** (``ValueError``, before any work):
a file that is missing, not a regular file or unreadable; an empty one; a
binary one — decided here as one holding a NUL byte (text never does; images,
archives and executables nearly always do) or bytes that are not valid UTF-8
(say, Latin-1 or UTF-16; re-encode it first) — with the byte offset; and, at
:meth:`TextData.check_length`, a split shorter than ``seq_len + 1`` bytes.
"""

from __future__ import annotations

import hashlib
import os
from dataclasses import dataclass
from typing import Any

import numpy as np  # host-side: batches are cut here, then moved with to_device

from minipar import checks
from minipar.backend import to_device
from minipar.data import corpus, tokenizer
from minipar.data.batches import batch_rng, batch_rows

#: the splits, in order
SPLITS = ("train", "validation")
#: the share of the bytes, in percent, held out for validation (the tail of the text)
VALIDATION_PERCENT = 10


@dataclass(frozen=True, eq=False)
class TextData:
    """One text's bytes, split into train and validation; batches by ``(seed, step)``.

    ``name`` (the file, or :data:`minipar.data.corpus.NAME`) starts every error
    message; ``data`` is the whole text as uint8; ``split_at`` the first
    validation byte; ``seed`` the data seed; ``sha256`` the text's fingerprint.
    Build it with :func:`load` or :func:`from_bytes`.
    """

    name: str
    data: np.ndarray
    split_at: int
    seed: int
    sha256: str

    #: the model's vocabulary: one token per byte value (a class constant, not a field)
    vocab_size = tokenizer.VOCAB_SIZE

    @property
    def train(self) -> np.ndarray:
        """The training bytes (uint8): the first 90% of the text."""
        return self.data[:self.split_at]

    @property
    def validation(self) -> np.ndarray:
        """The validation bytes (uint8): the last 10% of the text."""
        return self.data[self.split_at:]

    def split(self, name: str) -> np.ndarray:
        """The bytes of split ``name`` (``"train"`` or ``"validation"``)."""
        checks.one_of("split", name, SPLITS)
        return self.train if name == "train" else self.validation

    def check_length(self, seq_len: int) -> None:
        """ValueError (one line, naming the text) unless both splits hold a window of
        ``seq_len + 1`` bytes (``seq_len`` tokens and the target after the last)."""
        checks.integer("seq_len", seq_len, least=1)
        for name in SPLITS:
            n = len(self.split(name))
            if n < seq_len + 1:
                raise ValueError(
                    f"{self.name}: too short: its {name} split ({_split_rule(name)}) has {n} "
                    f"bytes, fewer than seq_len + 1 = {seq_len + 1}; use a longer text or a "
                    f"shorter sequence")

    def batch(self, step: int, batch_size: int, seq_len: int, lo: int = 0,
              hi: int | None = None, split: str = "train") -> tuple[Any, Any]:
        """Rows [lo, hi) of the global batch of ``step`` from ``split``: ``(tokens,
        targets)``, int64 (rows, seq_len), ``targets[:, t] = tokens[:, t + 1]`` continued
        one byte past the end."""
        source = self.split(split)
        lo, hi = batch_rows(batch_size, lo, hi)
        self.check_length(seq_len)
        starts = batch_rng(f"text.{split}", self.seed, step).integers(
            0, len(source) - seq_len, batch_size)  # the whole batch's, then our rows
        windows = source[starts[lo:hi, None] + np.arange(seq_len + 1)].astype(np.int64)
        return to_device(windows[:, :-1].copy()), to_device(windows[:, 1:].copy())

    def unigram_entropy(self, split: str = "train") -> float:
        """H = −Σ p(b) ln p(b) over the byte frequencies of ``split``, in nats per byte:
        the loss of the best model that ignores the context."""
        counts = np.bincount(self.split(split), minlength=tokenizer.VOCAB_SIZE)
        p = counts[counts > 0] / counts.sum()
        return float(-(p * np.log(p)).sum())

    def as_dict(self) -> dict[str, Any]:
        """What a checkpoint or a ``--json`` report records about the text."""
        return {"name": self.name, "bytes": len(self.data), "train_bytes": len(self.train),
                "validation_bytes": len(self.validation), "seed": self.seed,
                "sha256": self.sha256, "tokenizer": tokenizer.NAME,
                "vocab_size": tokenizer.VOCAB_SIZE}


def _split_rule(name: str) -> str:
    if name == "validation":
        return f"the last {VALIDATION_PERCENT}% of the bytes"
    return f"the first {100 - VALIDATION_PERCENT}% of the bytes"


def split_point(raw: bytes) -> int:
    """The first validation byte: ``n·(100 − VALIDATION_PERCENT) // 100``, moved forward
    past UTF-8 continuation bytes so the validation split starts at a character."""
    cut = len(raw) * (100 - VALIDATION_PERCENT) // 100
    while cut < len(raw) and raw[cut] & 0xC0 == 0x80:
        cut += 1
    return cut


def from_bytes(raw: bytes, name: str, seed: int = 0) -> TextData:
    """The data set of ``raw`` (UTF-8 text); ValueError naming ``name`` if it is empty or
    binary (a NUL byte, or bytes that are not UTF-8)."""
    seed = checks.integer("data seed", seed, least=0)
    if not raw:
        raise ValueError(f"{name}: empty (0 bytes): a text data set needs some UTF-8 text")
    nul = raw.find(b"\0")
    if nul >= 0:
        raise ValueError(f"{name}: a binary file, not text (a NUL byte at offset {nul})")
    try:
        raw.decode("utf-8")
    except UnicodeDecodeError as e:
        raise ValueError(f"{name}: not UTF-8 text (byte 0x{raw[e.start]:02x} at offset "
                         f"{e.start}: {e.reason}); convert it to UTF-8 first") from None
    return TextData(name=name, data=np.frombuffer(raw, dtype=np.uint8), split_at=split_point(raw),
                    seed=seed, sha256=hashlib.sha256(raw).hexdigest())


def load(path: str | os.PathLike[str] | None = None, seed: int = 0) -> TextData:
    """The data set of the UTF-8 file ``path``, or of the embedded corpus when None
    (:mod:`minipar.data.corpus`).  ValueError (one line naming the file) if it is missing,
    not a file, unreadable, empty or binary."""
    if path is None:
        return from_bytes(corpus.data(), corpus.NAME, seed)
    name = os.fspath(path)
    if not os.path.exists(name):
        raise ValueError(f"{name}: no such file")
    if not os.path.isfile(name):
        raise ValueError(f"{name}: not a regular file")
    try:
        with open(name, "rb") as f:
            raw = f.read()
    except OSError as e:
        raise ValueError(f"{name}: cannot read it ({e.strerror})") from None
    return from_bytes(raw, name, seed)
