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
from typing import TYPE_CHECKING

from minipar.parallel.context_parallel.layout import Sharding

if TYPE_CHECKING:  # usp imports the ring, which starts MPI: not in the launching process
    from minipar.parallel.context_parallel.usp import USPSharding

__all__ = ["KINDS", "check", "sharding", "usp_sizes"]

#: the routes for attention's keys and values
KINDS = ("ulysses", "ring", "allgather", "usp")


def usp_sizes(cp: int, ulysses: int | None, ring: int | None) -> tuple[int, int]:
    """USP's (U, R) from ``--ulysses`` and ``--ring`` (either may be left out: cp / the
    other); ValueError unless U·R = cp."""
    u = ulysses or (cp // ring if ring and cp % ring == 0 else None)
    r = ring or (cp // u if u and cp % u == 0 else None)
    if u is None or r is None or u * r != cp:
        raise ValueError(f"USP: --ulysses {ulysses} x --ring {ring} must equal cp = {cp} "
                         f"(a 2-D grid of U·R ranks); e.g. --ulysses {min(2, cp)} --ring "
                         f"{cp // min(2, cp)}")
    return u, r


def check(seq: int, heads: int, cp: int, kind: str, zigzag: bool, experts: int = 0,
          kv_heads: int = 0, ulysses: int | None = None, ring: int | None = None) -> None:
    """ValueError naming the numbers unless a CP run of this kind can be cut as asked
    (``kv_heads``: grouped-query attention's key/value heads, 0 = ``heads``; ``ulysses``,
    ``ring``: USP's degrees, U·R = cp)."""
    checks.one_of("--kind", kind, KINDS)
    kv = kv_heads or heads
    if kind != "usp" and (ulysses or ring):
        raise ValueError(f"--ulysses and --ring are USP's degrees: use --kind usp (got --kind "
                         f"{kind})")
    if kind == "usp":
        u, r = usp_sizes(cp, ulysses, ring)
        if heads % u:
            raise ValueError(f"USP: --heads {heads} is not divisible by --ulysses {u}: each "
                             f"rank of a Ulysses group takes whole heads; take --ulysses a "
                             f"divisor of {heads} and a larger --ring")
        if kv % u and u % kv:
            raise ValueError(f"USP: --kv-heads {kv} and --ulysses {u}: one must divide the "
                             f"other")
        parts = (2 * r if zigzag else r) * u
        if seq % parts:
            raise ValueError(f"USP: --seq {seq} is not divisible by {'2·' if zigzag else ''}"
                             f"ring·ulysses = {parts}: every rank needs equal chunks")
        kind, zigzag = "ring", False  # the remaining checks: experts
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


def sharding(seq: int, cp: int, kind: str, zigzag: bool, ulysses: int | None = None,
             ring: int | None = None) -> Sharding | USPSharding:
    """Which positions each rank holds (Ulysses: contiguous chunks; USP: the ring's cut over
    R groups, each group's over its U ranks)."""
    if kind == "usp":
        from minipar.parallel.context_parallel.usp import USPSharding

        u, r = usp_sizes(cp, ulysses, ring)
        return USPSharding(Sharding(seq, r, zigzag), u)
    return Sharding(seq, cp, zigzag and kind != "ulysses")
