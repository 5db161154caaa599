"""What a context-parallel run can be told, checked — параметры контекстного
параллелизма — 上下文并行的选项.

EN context-parallel options and their checks · RU параметры контекстного параллелизма
и их проверки · ZH 上下文并行的选项及其检查

The shell's launch-side half: which route attention takes (:data:`KINDS`), the
ring's chunk order, and :func:`check`, which refuses a run that cannot be cut as
asked, in one line naming the numbers and the option to change.  It imports no
MPI, so ``minipar run cp`` and the hybrid's checks call it in the launching
process before MPI starts; the engine calls it again on every rank before any
message.  :func:`sharding` turns the options into the positions each rank holds
(:class:`~minipar.parallel.context_parallel.layout.Sharding`).
"""

from __future__ import annotations

from minipar import checks
from minipar.parallel.context_parallel.layout import Sharding

__all__ = ["KINDS", "check", "sharding"]

#: the routes for attention's keys and values
KINDS = ("ulysses", "ring", "allgather")


def check(seq: int, heads: int, cp: int, kind: str, zigzag: bool, experts: int = 0,
          kv_heads: int = 0) -> None:
    """ValueError naming the numbers unless a CP run of this kind can be cut as asked
    (``kv_heads``: grouped-query attention's key/value heads, 0 = ``heads``)."""
    checks.one_of("--kind", kind, KINDS)
    kv = kv_heads or heads
    if experts:
        raise ValueError(f"context parallelism runs a dense GPT here; got --experts {experts} "
                         "(an MoE would route each rank's tokens as a group of its own)")
    if kind == "ulysses":
        if zigzag:
            raise ValueError("--zigzag balances ring attention's causal work; Ulysses "
                             "attends over the whole sequence on every rank: use --no-zigzag")
        if heads % cp:
            raise ValueError(f"DeepSpeed-Ulysses: --heads {heads} is not divisible by "
                             f"cp = {cp}: each rank takes a whole number of heads")
        if kv % cp and cp % kv:
            raise ValueError(f"DeepSpeed-Ulysses: --kv-heads {kv} and cp = {cp}: one must "
                             f"divide the other (K/cp key/value heads per rank, or each "
                             f"copied to cp/K ranks)")
    if cp >= 1 and seq % (2 * cp if zigzag else cp):  # Sharding's check, naming the options
        how = (f"2·cp = {2 * cp} (zigzag: rank r holds chunks r and 2·cp−1−r; --no-zigzag "
               f"needs only cp = {cp})" if zigzag else f"cp = {cp}")
        raise ValueError(f"--seq {seq} is not divisible by {how}: every context-parallel rank "
                         "needs equal chunks")
    Sharding(seq, cp, zigzag)


def sharding(seq: int, cp: int, kind: str, zigzag: bool) -> Sharding:
    """Which positions each rank holds (Ulysses: contiguous chunks)."""
    return Sharding(seq, cp, zigzag and kind != "ulysses")
