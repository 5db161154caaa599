"""The safetensors file format, written and read by hand: named tensors other tools load.

EN safetensors format · RU формат safetensors · ZH safetensors 格式

safetensors (Hugging Face, 2022; the specification is the README of
github.com/huggingface/safetensors) is the format PyTorch, JAX, transformers,
vLLM and llama.cpp's converters read model weights from.  It holds no code,
only arrays, so loading one cannot run anything (unlike a pickle), and it is
simple enough to write in a page::

    [ 8 bytes ][ N bytes: the header, JSON ][ the data: raw tensor bytes ]
      N, little-endian unsigned 64-bit

    header = {"__metadata__": {"step": "4", ...},                (optional; str -> str)
              "tok_emb": {"dtype": "F64", "shape": [10, 16], "data_offsets": [0, 1280]},
              "pos_emb": {"dtype": "F64", "shape": [8, 16],  "data_offsets": [1280, 2304]},
              ...}

* ``data_offsets`` = [begin, end) in bytes, counted from the start of the
  data (not of the file); end − begin = prod(shape) · itemsize;
* the tensors cover the data exactly: no holes, no overlaps (readers check it);
* each tensor's bytes are little-endian, in C (row-major) order;
* the header is padded with spaces to a multiple of 8 bytes, so the data
  starts 8-byte aligned; ordering the tensors by element size, largest first
  (as the reference writer does), keeps every tensor aligned to its own
  element size, so a reader can map the file and view it without copying.

Element types (:data:`DTYPES`): ``F64``, ``F32``, ``F16``, ``BF16``
(``ml_dtypes.bfloat16``: NumPy has no bfloat16 of its own) and ``I64``.

:func:`encode` / :func:`decode` are pure (bytes in, bytes out);
:func:`minipar.parallel.checkpoint.export` writes a checkpoint's full tensors
with :func:`encode`, atomically.  The tests read the file with the real
``safetensors`` library (``safetensors.numpy.load_file``) and compare it with
the model's parameters bit for bit.
"""

from __future__ import annotations

import json
import math
import struct
from collections.abc import Mapping
from typing import Any

import ml_dtypes
import numpy as np

#: safetensors' name of an element type -> the little-endian NumPy dtype stored
DTYPES: dict[str, np.dtype] = {
    "F64": np.dtype("<f8"),
    "F32": np.dtype("<f4"),
    "F16": np.dtype("<f2"),
    "BF16": np.dtype(ml_dtypes.bfloat16),
    "I64": np.dtype("<i8"),
}
#: the key of the header's str -> str metadata
METADATA = "__metadata__"
#: the longest header a reader accepts (the reference reader's limit): 100 MB
MAX_HEADER = 100_000_000
_BF16 = np.dtype(ml_dtypes.bfloat16)


def dtype_code(dtype: Any) -> str:
    """``F64`` for float64, ... ; ValueError naming the dtype if safetensors' list here lacks it."""
    dt = np.dtype(dtype)
    for code, want in DTYPES.items():
        if dt == want or (dt.kind == want.kind and dt.itemsize == want.itemsize
                          and dt != _BF16 and want != _BF16):
            return code
    raise ValueError(f"safetensors: dtype {dt} is not one of {', '.join(DTYPES)} "
                     "(float64, float32, float16, bfloat16, int64)")


def _le_bytes(a: np.ndarray) -> bytes:
    """The raw bytes of ``a``: little-endian, C order (bfloat16 through its uint16 bits)."""
    a = np.ascontiguousarray(a)
    bits = a.view(np.uint16) if a.dtype == _BF16 else a
    return bits.astype(bits.dtype.newbyteorder("<"), copy=False).tobytes(order="C")


def encode(tensors: Mapping[str, np.ndarray], metadata: Mapping[str, str] | None = None) -> bytes:
    """The safetensors file of ``tensors`` {name: array} and ``metadata`` (str -> str).

    Tensors are laid out by element size, largest first, in the given order within a
    size (every tensor aligned to its element size).  ValueError (one line) on an
    unsupported dtype, a name that is not a non-empty string or is ``__metadata__``, or
    metadata that is not str -> str."""
    header: dict[str, Any] = {}
    if metadata:
        bad = [k for k, v in metadata.items() if not (isinstance(k, str) and isinstance(v, str))]
        if bad:
            raise ValueError(f"safetensors: metadata must map str to str; {bad[0]!r} does not")
        header[METADATA] = dict(metadata)
    arrays = []
    for name, value in tensors.items():
        if not isinstance(name, str) or not name or name == METADATA:
            raise ValueError(f"safetensors: a tensor name must be a non-empty string other "
                             f"than {METADATA!r}, got {name!r}")
        a = np.asarray(value)
        arrays.append((name, dtype_code(a.dtype), a))
    arrays.sort(key=lambda t: -DTYPES[t[1]].itemsize)  # stable: given order within a size
    chunks, offset = [], 0
    for name, code, a in arrays:
        raw = _le_bytes(a)
        header[name] = {"dtype": code, "shape": list(a.shape),
                        "data_offsets": [offset, offset + len(raw)]}
        chunks.append(raw)
        offset += len(raw)
    text = json.dumps(header, separators=(",", ":")).encode("utf-8")
    text += b" " * (-(8 + len(text)) % 8)  # the data starts 8-byte aligned
    return struct.pack("<Q", len(text)) + text + b"".join(chunks)


def read_header(raw: bytes) -> tuple[dict[str, Any], int]:
    """(the header as a dict, the offset of the data in ``raw``), checked as a reader must:
    the length fits the file, the header is a JSON object.  ValueError (one line) otherwise."""
    if len(raw) < 8:
        raise ValueError(f"safetensors: {len(raw)} bytes, shorter than the 8-byte header length")
    (n,) = struct.unpack("<Q", raw[:8])
    if n > min(MAX_HEADER, len(raw) - 8):
        raise ValueError(f"safetensors: the header length {n} exceeds the file "
                         f"({len(raw) - 8} bytes after the length) or {MAX_HEADER:,} bytes")
    try:
        header = json.loads(raw[8:8 + n].decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise ValueError(f"safetensors: the header is not JSON ({e})") from None
    if isinstance(header, dict):
        return header, 8 + n
    raise ValueError(f"safetensors: the header is a JSON {type(header).__name__}, not an object")


def decode(raw: bytes) -> tuple[dict[str, np.ndarray], dict[str, str]]:
    """({name: array}, metadata) of a safetensors file's bytes, in the order of their data.

    Checks what the reference reader checks: known dtypes, offsets that match the
    shapes and cover the data with no hole or overlap.  Arrays are new, writable, in
    the machine's byte order."""
    header, start = read_header(raw)
    metadata = header.pop(METADATA, None) or {}
    entries = []
    for name, e in header.items():
        try:
            code, shape, (begin, end) = e["dtype"], [int(s) for s in e["shape"]], e["data_offsets"]
        except (KeyError, TypeError, ValueError):
            raise ValueError(f"safetensors: the entry of {name!r} is not "
                             "{dtype, shape, data_offsets}") from None
        if code not in DTYPES:
            raise ValueError(f"safetensors: {name!r} has dtype {code!r}, not one of "
                             f"{', '.join(DTYPES)}")
        if end - begin != math.prod(shape) * DTYPES[code].itemsize:
            raise ValueError(f"safetensors: {name!r}: data_offsets {[begin, end]} do not hold "
                             f"shape {shape} of {code}")
        entries.append((begin, end, name, code, shape))
    entries.sort()
    at = 0
    for begin, end, name, _, _ in entries:
        if begin != at:
            raise ValueError(f"safetensors: {name!r} starts at byte {begin} of the data, "
                             f"expected {at} (a hole or an overlap)")
        at = end
    if at != len(raw) - start:
        raise ValueError(f"safetensors: the tensors cover {at} bytes, the data holds "
                         f"{len(raw) - start}")
    out = {}
    for begin, end, name, code, shape in entries:
        buf = raw[start + begin:start + end]
        if code == "BF16":
            bits = np.frombuffer(buf, dtype="<u2").astype(np.uint16)
            out[name] = bits.view(_BF16).reshape(shape)
        else:
            out[name] = np.frombuffer(buf, dtype=DTYPES[code]).astype(
                DTYPES[code].newbyteorder("="), copy=True).reshape(shape)
    return out, dict(metadata)
