"""Shared plumbing of the from-scratch collectives: ops, dtypes, tags, checks.

EN collective plumbing · RU служебные функции коллективов · ZH 集合通信的公共部件

Nothing here is an algorithm; it is what every algorithm needs:

* :func:`prepare` turns the ``comm`` argument (a plain mpi4py communicator or a
  :class:`~minipar.comm.traced.TracedComm`) into a TracedComm, so waits poll
  politely and bytes are counted, and turns the input into a contiguous array.
* **Message tags carry a signature.**  Every message a collective sends has the
  tag ``(collective * 8 + op) * 64 + dtype_code`` (plus ``8192 x`` the row
  size for all-gather and all-to-all, whose chunk lengths vary).  Receives take any tag from
  the expected peer (MPI delivers messages between a pair of ranks on one
  communicator in order: they are *non-overtaking*), then compare the tag with
  the signature the receiver expects.  A rank that called a different
  collective, another ``op`` or holds another dtype is named in a
  :class:`CollectiveMismatchError` instead of producing garbage.  A different
  length shows up as a wrong byte count (``status.Get_count``) or as MPI's
  truncation error, turned into the same error.
  Consequence: do not leave your own unreceived point-to-point messages from
  a peer pending on a communicator while calling a collective on it.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
from mpi4py import MPI

from minipar.comm.traced import ANY_TAG, TracedComm, traced

try:  # bfloat16 is optional: ml_dtypes is a dependency, but keep import-safe
    from ml_dtypes import bfloat16 as _bf16

    _EXTRA = [np.dtype(_bf16)]
except ImportError:  # pragma: no cover
    _EXTRA = []


class CollectiveMismatchError(ValueError):
    """Ranks called a collective with different lengths, dtypes, ops or collectives."""


#: reduction ops: name -> NumPy ufunc (applied as ``ufunc(a, b, out=a)``) and MPI's own
OPS: dict[str, tuple[np.ufunc, MPI.Op]] = {
    "sum": (np.add, MPI.SUM),
    "max": (np.maximum, MPI.MAX),
    "min": (np.minimum, MPI.MIN),
    "prod": (np.multiply, MPI.PROD),
}
_OP_NAMES = list(OPS)

#: collectives, in tag order (index = the "collective" part of a tag)
COLLECTIVES = [
    "ring_allreduce", "reduce_scatter", "all_gather", "broadcast", "reduce",
    "all_to_all", "naive_allreduce", "recursive_doubling_allreduce", "tree_allreduce",
]

#: dtypes a collective accepts; code = index + 1 (0 is never used)
DTYPES: list[np.dtype] = [np.dtype(t) for t in (
    "bool", "int8", "uint8", "int16", "uint16", "int32", "uint32", "int64", "uint64",
    "float16", "float32", "float64", "complex64", "complex128",
)] + _EXTRA


def dtype_code(dtype: np.dtype) -> int:
    for i, d in enumerate(DTYPES):
        if d == dtype:
            return i + 1
    names = ", ".join(str(d) for d in DTYPES)
    raise ValueError(f"dtype {dtype} is not supported by minipar collectives; one of {names}")


_ROW_BASE = 8192  # tags below this encode (collective, op, dtype)
_row_mod: list[int] = []


def _row_modulus() -> int:
    """How many row sizes fit above the signature in this MPI's tag range (TAG_UB)."""
    if not _row_mod:
        ub = MPI.COMM_WORLD.Get_attr(MPI.TAG_UB) or 32767
        _row_mod.append(max(1, (int(ub) + 1) // _ROW_BASE))
    return _row_mod[0]


def tag_for(collective: str, dtype: np.dtype, op: str = "sum", row: int = 0) -> int:
    """The tag of every message of ``collective`` over ``dtype`` with ``op``.

    ``row`` (elements per row, for the collectives whose chunks have rows of
    a trailing shape) is encoded above the signature, modulo what MPI's tag
    range allows (65536 row sizes with MPICH's TAG_UB = 2^29 - 1).
    """
    sig = (COLLECTIVES.index(collective) * 8 + _OP_NAMES.index(op)) * 64 + dtype_code(dtype)
    return sig + _ROW_BASE * (row % _row_modulus())


def describe_tag(tag: int) -> str:
    """'ring_allreduce of float32 (op sum)' from a tag, for error messages."""
    row, sig = divmod(tag, _ROW_BASE)
    coll, rest = divmod(sig, 8 * 64)
    op, code = divmod(rest, 64)
    if not (0 <= coll < len(COLLECTIVES) and 1 <= code <= len(DTYPES)):
        return f"a message with tag {tag} (not from a minipar collective)"
    rows = f", rows of {row} elements" if row else ""
    return f"{COLLECTIVES[coll]} of {DTYPES[code - 1]} (op {_OP_NAMES[op]}{rows})"


def dtype_of_tag(tag: int) -> np.dtype | None:
    """The dtype a collective's tag encodes (None if it is not such a tag)."""
    code = tag % 64
    return DTYPES[code - 1] if 1 <= code <= len(DTYPES) else None


def check_op(op: str) -> np.ufunc:
    if op not in OPS:
        raise ValueError(f"unknown op {op!r}; one of {', '.join(OPS)}")
    return OPS[op][0]


def check_algorithm(algorithm: str, allowed: tuple[str, ...], what: str) -> None:
    if algorithm not in allowed:
        raise ValueError(f"unknown {what} algorithm {algorithm!r}; one of {', '.join(allowed)}")


def check_root(root: int, size: int) -> None:
    if not isinstance(root, (int, np.integer)) or not (0 <= root < size):
        raise ValueError(f"root {root!r} is outside the communicator's ranks 0..{size - 1}")


def prepare(comm: Any, x: Any) -> tuple[TracedComm, np.ndarray]:
    """(TracedComm, contiguous array).  Non-contiguous input is copied, never modified."""
    c = traced(comm)
    a = np.asarray(x)
    if not a.flags.c_contiguous:  # (np.ascontiguousarray would turn 0-d into 1-d)
        a = np.ascontiguousarray(a)
    dtype_code(a.dtype)
    return c, a


def chunk_counts(n: int, world: int) -> list[int]:
    """Sizes of ``numpy.array_split(range(n), world)``: the first n % world get one more."""
    q, r = divmod(n, world)
    return [q + 1 if i < r else q for i in range(world)]


def offsets_of(counts: list[int]) -> list[int]:
    out, acc = [], 0
    for k in counts:
        out.append(acc)
        acc += k
    return out


def _expect(status: MPI.Status, tag: int, nbytes: int, c: TracedComm, source: int) -> None:
    got = status.Get_tag()
    if got != tag:
        raise CollectiveMismatchError(
            f"rank {c.rank}: expected {describe_tag(tag)} from rank {source} but received "
            f"{describe_tag(got)}. Every rank must call the same collective with the same "
            "op and the same dtype."
        )
    n = status.Get_count(MPI.BYTE)
    if n != nbytes:
        raise CollectiveMismatchError(
            f"rank {c.rank}: {describe_tag(tag)}: expected {nbytes} bytes from rank {source}, "
            f"received {n}. Every rank must pass an array of the same length (and shape)."
        )


def _truncated(e: MPI.Exception, c: TracedComm, tag: int, source: int) -> Exception:
    if e.Get_error_class() == MPI.ERR_TRUNCATE:
        return CollectiveMismatchError(
            f"rank {c.rank}: {describe_tag(tag)}: rank {source} sent more bytes than expected. "
            "Every rank must pass an array of the same length (and shape)."
        )
    return e


def sendrecv(c: TracedComm, send: np.ndarray, dest: int, recv: np.ndarray, source: int,
             tag: int) -> None:
    """Send ``send`` to ``dest`` while receiving exactly ``recv.nbytes`` from ``source``."""
    try:
        st = c.Sendrecv(send, dest, tag, recv, source, ANY_TAG)
    except MPI.Exception as e:
        raise _truncated(e, c, tag, source) from None
    _expect(st, tag, recv.nbytes, c, source)


def recv(c: TracedComm, buf: np.ndarray, source: int, tag: int) -> None:
    """Receive exactly ``buf.nbytes`` from ``source`` with the signature ``tag``."""
    try:
        st = c.Recv(buf, source, ANY_TAG)
    except MPI.Exception as e:
        raise _truncated(e, c, tag, source) from None
    _expect(st, tag, buf.nbytes, c, source)


def recv_any_size(c: TracedComm, source: int, tag: int, dtype: np.dtype,
                  unit: int = 1) -> np.ndarray:
    """Receive a message of unknown length (learned by probing) as a 1-D array.

    ``unit`` is the number of elements the length must be a multiple of (a row).
    """
    st = c.Probe(source, ANY_TAG)
    n = st.Get_count(MPI.BYTE)
    row = dtype.itemsize * unit
    if st.Get_tag() != tag:
        _expect(st, tag, n, c, source)  # raises: names both signatures
    if row and n % row:
        raise CollectiveMismatchError(
            f"rank {c.rank}: {describe_tag(tag)}: rank {source} sent {n} bytes, not a whole "
            f"number of rows of {row} bytes: the trailing shapes differ between ranks."
        )
    buf = np.empty(n // dtype.itemsize, dtype)
    recv(c, buf, source, tag)
    return buf


# -- MPI's own collectives, the oracle -------------------------------------------------
_BYTE_TYPES: dict[int, MPI.Datatype] = {}
_USER_OPS: dict[tuple[str, str], MPI.Op] = {}


def mpi_spec(a: np.ndarray, op: str = "sum") -> tuple[np.ndarray, MPI.Datatype, MPI.Op]:
    """How to hand ``a`` to MPI's own collectives: (buffer spec, datatype, MPI op).

    Dtypes MPI knows (float16 included, in MPICH) go as they are; others
    (bfloat16) go as opaque items of ``itemsize`` bytes with a user-defined op
    that applies the NumPy ufunc.
    """
    ufunc, mpi_op = OPS[op]
    known = getattr(MPI, "_typedict", {})  # mpi4py's own NumPy-char -> MPI type map
    if a.dtype.char in known and a.dtype.kind != "V":
        return a, known[a.dtype.char], mpi_op
    size = a.dtype.itemsize
    if size not in _BYTE_TYPES:
        _BYTE_TYPES[size] = MPI.BYTE.Create_contiguous(size).Commit()
    key = (op, a.dtype.str)
    if key not in _USER_OPS:
        _USER_OPS[key] = MPI.Op.Create(_user_op(ufunc, a.dtype), commute=True)
    return a, _BYTE_TYPES[size], _USER_OPS[key]


def _user_op(ufunc: np.ufunc, dtype: np.dtype) -> Callable[[Any, Any, Any], None]:
    def apply(inbuf: Any, inoutbuf: Any, datatype: Any) -> None:
        src = np.frombuffer(inbuf, dtype)
        dst = np.frombuffer(inoutbuf, dtype)
        ufunc(dst, src, out=dst)

    return apply


def mpi_buf(a: np.ndarray, dt: MPI.Datatype) -> list[Any]:
    """mpi4py's buffer spec ``[array, count, datatype]``."""
    return [a, a.size, dt]
