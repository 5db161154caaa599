"""The tag registry: which MPI message tags each part of minipar uses, in one table.

EN message tag · RU тег сообщения · ZH 消息标签

MPI delivers a message to the receive whose (communicator, source, tag)
matches it, and between one pair of ranks on one communicator messages that
match the same receive arrive in the order they were sent (MPI 4.1 §3.5:
they are *non-overtaking*).  Tags are how traffic of different operations
shares a communicator without one operation taking another's message: a
pipeline stage's pending activation, a bucket's non-blocking all-reduce and
a blocking ring all-reduce can all be in flight between the same two ranks,
and each receive takes only a message with its own tag.  For that, every
part of minipar draws its tags from its own range of this one table:

=================  =================  ===========================================
range              tags               used by
=================  =================  ===========================================
user               0 .. 4095          learners', tests' point-to-point (mpi4py's
                                      default tag is 0)
parameter_server   4096 .. 4103       push header, gradient, parameters
                                      (:mod:`minipar.parallel.data_parallel.parameter_server`)
nonblocking        8192 .. 16383      non-blocking ring all-reduce of bucket i:
                                      ``nonblocking_tag(i)`` = 8192 + i
pipeline           16384 .. 24575     point-to-point between pipeline stages:
                                      ``pipeline_tag(kind, micro_batch, chunk)``
collective         24576 .. TAG_UB    blocking collectives' *signatures*:
                                      ``collective_tag(name, dtype, op, row)``
=================  =================  ===========================================

Everything below 32768 fits the smallest ``TAG_UB`` the MPI standard allows
(32767); MPICH's is 2^29 - 1, and the collective range then also encodes the
row size of all-gather and all-to-all (below).  :func:`check_tag_ub` checks
the table against the running MPI; ``tests/test_isolation.py`` checks that
the ranges do not overlap.

**Signatures.**  Every message of a blocking collective carries the tag

    24576 + (collective·8 + op)·64 + dtype code  +  8192·(row mod R)

where ``row`` is the number of elements per row for all-gather and
all-to-all (whose chunk lengths vary, so a different trailing shape would
otherwise go unseen) and R = (TAG_UB + 1 - 24576) // 8192 (65533 row sizes
with MPICH).  A receive waits for exactly that tag; a rank that called
another collective, another op or holds another dtype sends another tag,
and :mod:`minipar.comm.waiting` names both in a
:class:`~minipar.comm.errors.CollectiveMismatchError`.

**Pipeline tags** (kind ``"act"`` forward, ``"grad"`` backward; ``chunk`` the
model chunk of an interleaved schedule, < 8): ``16384 + kind·2048 +
chunk·256 + micro_batch mod 256``.  Tags repeat every 256 micro-batches; two
messages with one tag are still matched in the order sent (non-overtaking),
so a stage that receives micro-batches in order never takes the wrong one.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
from mpi4py import MPI

#: the smallest TAG_UB the MPI standard allows (MPI 4.1 §9.1.2)
STANDARD_TAG_UB = 32767


@dataclass(frozen=True)
class TagRange:
    """Tags ``first .. first + count - 1``, used by one part of minipar."""

    name: str
    first: int
    count: int
    what: str

    @property
    def last(self) -> int:
        return self.first + self.count - 1

    def __contains__(self, tag: object) -> bool:
        return isinstance(tag, (int, np.integer)) and self.first <= int(tag) <= self.last

    def tag(self, i: int) -> int:
        """The i-th tag of the range (``ValueError`` outside it)."""
        if not isinstance(i, (int, np.integer)) or not 0 <= i < self.count:
            raise ValueError(f"{self.name} tags are numbered 0..{self.count - 1}, got {i!r} "
                             f"(range {self.first}..{self.last} of minipar.comm.tags)")
        return self.first + int(i)


_SIG = 8192  # signatures (collective, op, dtype) per row size

USER = TagRange("user", 0, 4096, "point-to-point of learners and tests")
PARAMETER_SERVER = TagRange("parameter_server", 4096, 8, "parameter server push/pull")
NONBLOCKING = TagRange("nonblocking", 8192, 8192, "non-blocking all-reduce, one tag per bucket")
PIPELINE = TagRange("pipeline", 16384, 8192, "pipeline activations and gradients")
COLLECTIVE_FIRST = 24576  # the collective range runs from here up to TAG_UB

#: the parameter server's three kinds of message
PS_HEADER, PS_GRAD, PS_PARAM = (PARAMETER_SERVER.tag(i) for i in range(3))

#: blocking collectives, in signature order (index = the "collective" part of a tag)
COLLECTIVES = [
    "ring_allreduce", "reduce_scatter", "all_gather", "broadcast", "reduce",
    "all_to_all", "naive_allreduce", "recursive_doubling_allreduce", "tree_allreduce",
    "ring_attention",  # K/V blocks around the cp ring (parallel/context_parallel/ring_attention.py)
]
MAX_COLLECTIVES = 16  # signatures have room for this many
#: reduction ops, in signature order
OP_NAMES = ["sum", "max", "min", "prod"]
#: dtypes a collective accepts, by name (bfloat16: ml_dtypes', named without loading it);
#: code = index + 1 (0 is never used)
DTYPES: list[str] = [
    "bool", "int8", "uint8", "int16", "uint16", "int32", "uint32", "int64", "uint64",
    "float16", "float32", "float64", "complex64", "complex128", "bfloat16",
]

PIPELINE_KINDS = ("act", "grad")  # activations forward, gradients backward
PIPELINE_CHUNKS = 8  # model chunks per stage (interleaved schedules)
PIPELINE_MICRO_BATCHES = 256  # micro-batch indices before tags repeat


_tag_ub: list[int] = []


def tag_ub() -> int:
    """MPI's largest tag (the ``TAG_UB`` attribute of COMM_WORLD, read once)."""
    if not _tag_ub:
        ub = MPI.COMM_WORLD.Get_attr(MPI.TAG_UB)
        _tag_ub.append(STANDARD_TAG_UB if ub is None else int(ub))
    return _tag_ub[0]


def ranges() -> list[TagRange]:
    """Every range of the table, in order, the collective one sized by this MPI's TAG_UB."""
    top = tag_ub()
    coll = TagRange("collective", COLLECTIVE_FIRST, top + 1 - COLLECTIVE_FIRST,
                    "blocking collectives' signatures")
    return [USER, PARAMETER_SERVER, NONBLOCKING, PIPELINE, coll]


def check_tag_ub() -> None:
    """``ValueError`` unless every range fits below this MPI's TAG_UB."""
    need = COLLECTIVE_FIRST + _SIG - 1
    if tag_ub() < need:
        raise ValueError(f"this MPI allows tags up to TAG_UB = {tag_ub()}, minipar's tag table "
                         f"needs {need} (see minipar.comm.tags)")


_row_mod: list[int] = []


def row_modulus() -> int:
    """How many row sizes the collective range tells apart under this MPI's TAG_UB."""
    if not _row_mod:
        check_tag_ub()
        _row_mod.append((tag_ub() + 1 - COLLECTIVE_FIRST) // _SIG)
    return _row_mod[0]


_CODES: dict[np.dtype, int] = {}


def dtype_code(dtype: Any) -> int:
    """The signature code of ``dtype`` (``ValueError`` if collectives do not support it)."""
    try:
        dt = np.dtype(dtype)
    except TypeError:  # "bfloat16" before ml_dtypes is loaded
        dt = None
    code = _CODES.get(dt) if dt is not None else None
    if code is None:
        name = str(dtype) if dt is None else str(dt)
        code = DTYPES.index(name) + 1 if name in DTYPES else None
        if code is not None and dt is not None:
            _CODES[dt] = code  # once per dtype: str(dtype) allocates
    if code is not None:
        return code
    names = ", ".join(DTYPES)
    raise ValueError(f"dtype {dtype} is not supported by minipar collectives; one of {names}")


def collective_tag(collective: str, dtype: Any, op: str = "sum", row: int = 0) -> int:
    """The tag of every message of ``collective`` over ``dtype`` with ``op`` (and ``row``)."""
    sig = (COLLECTIVES.index(collective) * 8 + OP_NAMES.index(op)) * 64 + dtype_code(dtype)
    return COLLECTIVE_FIRST + sig + _SIG * (int(row) % row_modulus())


def _signature(tag: int) -> tuple[int, int, int, int] | None:
    """(collective, op, dtype code, row) of a collective tag, None for any other tag."""
    if not COLLECTIVE_FIRST <= tag <= tag_ub():
        return None
    row, sig = divmod(tag - COLLECTIVE_FIRST, _SIG)
    coll, rest = divmod(sig, 8 * 64)
    op, code = divmod(rest, 64)
    if coll < len(COLLECTIVES) and op < len(OP_NAMES) and 1 <= code <= len(DTYPES):
        return coll, op, code, row
    return None


def is_collective_tag(tag: int) -> bool:
    """True for a blocking collective's signature."""
    return _signature(tag) is not None


def dtype_of_tag(tag: int) -> np.dtype | None:
    """The dtype a collective's tag encodes (None if it is not such a tag)."""
    sig = _signature(tag)
    return None if sig is None else dtype_named(DTYPES[sig[2] - 1])


def dtype_named(name: str) -> np.dtype:
    """The NumPy dtype of one of :data:`DTYPES`' names (bfloat16 loads ml_dtypes)."""
    if name == "bfloat16":
        import ml_dtypes

        return np.dtype(ml_dtypes.bfloat16)
    return np.dtype(name)


def nonblocking_tag(index: int) -> int:
    """The tag of the non-blocking all-reduce of bucket ``index`` (0 .. 8191)."""
    return NONBLOCKING.tag(index)


def pipeline_tag(kind: str, micro_batch: int, chunk: int = 0) -> int:
    """The tag of a pipeline message: ``kind`` "act" or "grad", of ``micro_batch``, ``chunk``."""
    if kind not in PIPELINE_KINDS:
        raise ValueError(f"pipeline message kind {kind!r}; one of {', '.join(PIPELINE_KINDS)}")
    if not isinstance(chunk, (int, np.integer)) or not 0 <= chunk < PIPELINE_CHUNKS:
        raise ValueError(f"pipeline model chunk {chunk!r} is outside 0..{PIPELINE_CHUNKS - 1}")
    if not isinstance(micro_batch, (int, np.integer)) or micro_batch < 0:
        raise ValueError(f"micro-batch index {micro_batch!r} must be a non-negative integer")
    m = PIPELINE_MICRO_BATCHES
    return PIPELINE.tag((PIPELINE_KINDS.index(kind) * PIPELINE_CHUNKS + chunk) * m
                        + int(micro_batch) % m)


def describe_tag(tag: int) -> str:
    """What a tag means, for error messages: 'ring_allreduce of float32 (op sum)'."""
    sig = _signature(tag)
    if sig is not None:
        coll, op, code, row = sig
        rows = f", rows of {row} elements" if row else ""
        return f"{COLLECTIVES[coll]} of {DTYPES[code - 1]} (op {OP_NAMES[op]}{rows})"
    if tag in NONBLOCKING:
        return f"a non-blocking all-reduce (bucket {tag - NONBLOCKING.first}, tag {tag})"
    if tag in PIPELINE:
        kind_chunk, mb = divmod(tag - PIPELINE.first, PIPELINE_MICRO_BATCHES)
        kind, chunk = divmod(kind_chunk, PIPELINE_CHUNKS)
        name = PIPELINE_KINDS[kind] if kind < len(PIPELINE_KINDS) else f"kind {kind}"
        return f"a pipeline {name} message (micro-batch {mb} mod 256, chunk {chunk}, tag {tag})"
    if tag in PARAMETER_SERVER:
        return f"a parameter server message (tag {tag})"
    return f"a message with tag {tag} (not from a minipar collective)"
