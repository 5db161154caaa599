"""Shared plumbing of the from-scratch collectives: ops, dtypes, tags, checks.

EN collective plumbing · RU служебные функции коллективов · ZH 集合通信的公共部件

Nothing here is an algorithm; it is what every algorithm needs:

* :func:`prepare` turns the ``comm`` argument (a plain mpi4py communicator or a
  :class:`~minipar.comm.traced.TracedComm`) into a TracedComm, so waits poll
  politely and bytes are counted, and turns the input into a contiguous array.
  A plain communicator is wrapped once (:func:`~minipar.comm.traced.traced`),
  so its counters accumulate across calls.
* **Message tags carry a signature.**  Every message a collective sends has the
  tag :func:`tag_for` gives, from the collective range of the one tag table
  (:mod:`minipar.comm.tags`): it encodes (collective, op, dtype), plus the row
  size for all-gather and all-to-all, whose chunk lengths vary.  Receives
  wait for exactly that tag, so a pending pipeline send, a non-blocking
  all-reduce or any other operation's message on the same communicator is
  never taken by mistake.  A rank that called a different collective,
  another ``op`` or holds another dtype sends another signature; the
  waiting loop's mismatch guard (:mod:`minipar.comm.waiting`, the argument is
  written there) sees it pending in place of the expected one and raises a
  :class:`CollectiveMismatchError` naming both, within milliseconds.  A
  different length shows up as a wrong byte count (``status.Get_count``) or
  as MPI's truncation error, turned into the same error.
* Chunks follow :mod:`minipar.spans` (the ``numpy.array_split`` rule).
* **Either side of the device boundary.**  A collective's buffers are made
  beside its input (``backend.array_module``): NumPy for a host array, ``xp``
  for a device array, whose messages the traced communicator stages through
  host memory.  The reductions are the input's module's own ufuncs.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
from mpi4py import MPI
from mpi4py.util import dtlib

from minipar import backend, checks, spans
from minipar.comm import tags as T
from minipar.comm.errors import CollectiveMismatchError
from minipar.comm.traced import TracedComm, traced

__all__ = [
    "COLLECTIVES", "DTYPES", "OPS", "CollectiveMismatchError", "TracedComm", "check_algorithm",
    "check_op", "check_root", "chunk_counts", "describe_tag", "dtype_code", "dtype_named",
    "dtype_of_tag",
    "mpi_buf", "mpi_spec", "offsets_of", "prepare", "recv", "recv_any_size", "sendrecv",
    "tag_for", "traced",
]

#: reduction ops: name -> NumPy ufunc (applied as ``ufunc(a, b, out=a)``; on a device array
#: the array module's ufunc of the same name, :func:`check_op`) and MPI's own
OPS: dict[str, tuple[np.ufunc, MPI.Op]] = {
    "sum": (np.add, MPI.SUM),
    "max": (np.maximum, MPI.MAX),
    "min": (np.minimum, MPI.MIN),
    "prod": (np.multiply, MPI.PROD),
}
assert list(OPS) == T.OP_NAMES  # the signature order of the tag table

#: collectives, in tag order; dtypes a collective accepts (code = index + 1)
COLLECTIVES = T.COLLECTIVES
DTYPES = T.DTYPES
dtype_code = T.dtype_code
#: the tag of every message of a collective (the tag table's signature)
tag_for = T.collective_tag
describe_tag = T.describe_tag
dtype_of_tag = T.dtype_of_tag
dtype_named = T.dtype_named
#: the numpy.array_split rule (minipar.spans), under the names the collectives use
chunk_counts = spans.counts
offsets_of = spans.offsets


def check_op(op: str, a: Any = None) -> np.ufunc:
    """The ufunc of reduction ``op``, from the array module of ``a`` (NumPy without one)."""
    ufunc = OPS[checks.one_of("op", op, OPS)][0]
    return ufunc if a is None or not backend.on_device(a) else getattr(backend.xp, ufunc.__name__)


def check_algorithm(algorithm: str, allowed: tuple[str, ...], what: str) -> None:
    checks.one_of(f"the {what} algorithm", algorithm, allowed)


def check_root(root: int, size: int) -> None:
    checks.integer("root", root, 0, size - 1, why="the communicator's ranks")


def prepare(comm: Any, x: Any) -> tuple[TracedComm, np.ndarray]:
    """(TracedComm, contiguous array, on ``x``'s side of the device boundary).
    Non-contiguous input is copied, never modified."""
    c = traced(comm)
    am = backend.array_module(x)
    a = am.asarray(x)
    if not a.flags.c_contiguous:  # (ascontiguousarray would turn 0-d into 1-d)
        a = am.ascontiguousarray(a)
    dtype_code(a.dtype)
    return c, a


def _expect(status: MPI.Status, tag: int, nbytes: int, c: TracedComm, source: int) -> None:
    """The message that arrived (with the expected ``tag``) has exactly ``nbytes``."""
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
        st = c.Sendrecv(send, dest, tag, recv, source, tag)
    except MPI.Exception as e:
        raise _truncated(e, c, tag, source) from None
    _expect(st, tag, recv.nbytes, c, source)


def recv(c: TracedComm, buf: np.ndarray, source: int, tag: int) -> None:
    """Receive exactly ``buf.nbytes`` from ``source`` with the signature ``tag``."""
    try:
        st = c.Recv(buf, source, tag)
    except MPI.Exception as e:
        raise _truncated(e, c, tag, source) from None
    _expect(st, tag, buf.nbytes, c, source)


def recv_any_size(c: TracedComm, source: int, tag: int, dtype: np.dtype,
                  unit: int = 1, am: Any = np) -> np.ndarray:
    """Receive a message of unknown length (learned by probing) as a 1-D array of the
    array module ``am``.

    ``unit`` is the number of elements the length must be a multiple of (a row).
    """
    n = c.Probe(source, tag).Get_count(MPI.BYTE)
    row = dtype.itemsize * unit
    if row and n % row:
        raise CollectiveMismatchError(
            f"rank {c.rank}: {describe_tag(tag)}: rank {source} sent {n} bytes, not a whole "
            f"number of rows of {row} bytes: the trailing shapes differ between ranks."
        )
    buf = am.empty(n // dtype.itemsize, dtype)
    recv(c, buf, source, tag)
    return buf


# -- MPI's own collectives, the oracle -------------------------------------------------
_BYTE_TYPES: dict[int, MPI.Datatype] = {}
_NAMED: dict[str, MPI.Datatype | None] = {}
_USER_OPS: dict[tuple[str, str], MPI.Op] = {}


def _named_type(dtype: np.dtype) -> MPI.Datatype | None:
    """MPI's predefined datatype for ``dtype`` (None if MPI has none, as for bfloat16).

    ``mpi4py.util.dtlib.from_numpy_dtype`` returns a *duplicate* of the
    predefined type, on which MPICH refuses MPI_SUM ("operation not defined
    for this datatype"); the duplicate's ``decode()`` names the original.
    """
    if dtype.str not in _NAMED:
        base = None
        if dtype.kind != "V":  # (ml_dtypes' bfloat16 has kind "V")
            try:
                dup = dtlib.from_numpy_dtype(dtype)
            except ValueError:  # "cannot map code ... to MPI datatype"
                dup = None
            if dup is not None:
                base, _, _ = dup.decode()
                dup.Free()
                if not base.is_predefined:
                    base = None
        _NAMED[dtype.str] = base
    return _NAMED[dtype.str]


def mpi_spec(a: np.ndarray, op: str = "sum") -> tuple[np.ndarray, MPI.Datatype, MPI.Op]:
    """How to hand ``a`` to MPI's own collectives: (buffer spec, datatype, MPI op).

    Dtypes MPI knows (float16 included, in MPICH) go as they are; others
    (bfloat16) go as opaque items of ``itemsize`` bytes with a user-defined op
    that applies the NumPy ufunc.
    """
    ufunc, mpi_op = OPS[op]
    named = _named_type(a.dtype)
    if named is not None:
        return a, named, mpi_op
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


def mpi_comm(c: TracedComm, a: Any) -> Any:
    """Whom to ask for MPI's own collective on ``a``: the plain communicator for a host
    array, the traced one (which stages a device array through host memory) otherwise."""
    return c if backend.on_device(a) else c.comm


def mpi_buf(a: np.ndarray, dt: MPI.Datatype) -> list[Any]:
    """mpi4py's buffer spec ``[array, count, datatype]``."""
    return [a, a.size, dt]
