"""Bytes each rank sends and receives in each collective: the formulas the tests check.

EN communication volume · RU объём передаваемых данных · ZH 通信量

Every function returns ``(bytes_sent, bytes_received)`` by rank ``rank`` of
``world`` ranks, for the algorithms of :mod:`minipar.collectives`, exactly
(not asymptotically), under the ``numpy.array_split`` chunking rule:
``chunk_counts(n, N)[i] = n // N + (1 if i < n % N else 0)``.

``n`` counts *units*: elements for a 1-D array, rows (axis 0) for reduce-scatter
and all-gather of n-D arrays; ``unit_bytes`` is the bytes of one unit
(itemsize x elements per row).

Headline (Patarasuk & Yuan 2009): a ring all-reduce of S bytes sends and
receives 2(N-1)/N x S per rank, exactly when N divides n.  The parameter
server's root receives and sends (N-1) x S.

**One meaning per name.**  Here ``*_bytes`` is the *exact* count one given
rank moves for a given element count (what the counters of a TracedComm must
read); the papers' asymptotic per-rank formulas of a buffer of S bytes,
2(N-1)/N x S and friends, are :mod:`minipar.plan.collectives`'s
``*_volume(S, N)``.  :func:`allreduce_bytes` covers every all-reduce
algorithm, ``"auto"`` included (the one :mod:`minipar.collectives.auto` picks).
"""

from __future__ import annotations

from minipar.collectives._base import chunk_counts


def ring_allreduce_bytes(n: int, unit_bytes: int, world: int, rank: int) -> tuple[int, int]:
    """Ring all-reduce: sent = 2S - c[r] - c[r+1], received = 2S - c[r-1] - c[r] (bytes)."""
    if world == 1:
        return 0, 0
    c = chunk_counts(n, world)
    r = rank
    sent = 2 * n - c[r] - c[(r + 1) % world]
    recv = 2 * n - c[(r - 1) % world] - c[r]
    return sent * unit_bytes, recv * unit_bytes


def ring_allreduce_bytes_sent(n: int, unit_bytes: int, world: int, rank: int) -> int:
    """Bytes rank ``rank`` sends in a ring all-reduce of n units (2(N-1)/N x S if N | n)."""
    return ring_allreduce_bytes(n, unit_bytes, world, rank)[0]


def reduce_scatter_bytes(n: int, unit_bytes: int, world: int, rank: int) -> tuple[int, int]:
    """Ring reduce-scatter: sent = S - c[r], received = S - c[r-1]; (N-1)/N x S if N | n."""
    if world == 1:
        return 0, 0
    c = chunk_counts(n, world)
    return (n - c[rank]) * unit_bytes, (n - c[(rank - 1) % world]) * unit_bytes


def all_gather_bytes(counts: list[int], unit_bytes: int, rank: int) -> tuple[int, int]:
    """Ring all-gather of chunks of ``counts[i]`` units: sent = total - c[r+1],
    received = total - c[r]."""
    world, total = len(counts), sum(counts)
    if world == 1:
        return 0, 0
    return (total - counts[(rank + 1) % world]) * unit_bytes, (total - counts[rank]) * unit_bytes


def _children(v: int, world: int) -> int:
    """Children of virtual rank v in the binomial tree: v + m for powers of two m
    below lowbit(v) (any m for the root), v + m < N."""
    limit = (v & -v) if v else 1 << max(world - 1, 0).bit_length()
    count, m = 0, 1
    while m < limit:
        count += v + m < world
        m <<= 1
    return count


def broadcast_bytes(nbytes: int, world: int, rank: int, root: int = 0) -> tuple[int, int]:
    """Binomial broadcast: S per child sent, S received (except the root)."""
    v = (rank - root) % world
    return _children(v, world) * nbytes, (nbytes if v else 0)


def reduce_bytes(nbytes: int, world: int, rank: int, root: int = 0) -> tuple[int, int]:
    """Binomial reduce: the broadcast tree reversed."""
    sent, recv = broadcast_bytes(nbytes, world, rank, root)
    return recv, sent


def tree_allreduce_bytes(nbytes: int, world: int, rank: int) -> tuple[int, int]:
    """Reduce to rank 0 then broadcast from it: each rank sends and receives the same."""
    a, b = reduce_bytes(nbytes, world, rank, 0), broadcast_bytes(nbytes, world, rank, 0)
    return a[0] + b[0], a[1] + b[1]


def recursive_doubling_bytes(nbytes: int, world: int, rank: int) -> tuple[int, int]:
    """log2(p) x S each way (p = largest power of two <= N), + S each way for fold pairs."""
    p = 1 << (world.bit_length() - 1)
    rem = world - p
    rounds = p.bit_length() - 1
    if rank < 2 * rem and rank % 2 == 0:
        return nbytes, nbytes
    extra = nbytes if rank < 2 * rem else 0
    return rounds * nbytes + extra, rounds * nbytes + extra


def naive_allreduce_bytes(nbytes: int, world: int, rank: int, root: int = 0) -> tuple[int, int]:
    """Parameter-server pattern: root sends and receives (N-1) x S, others S each way."""
    if rank == root:
        return (world - 1) * nbytes, (world - 1) * nbytes
    return nbytes, nbytes


def allreduce_bytes(n: int, itemsize: int, world: int, rank: int,
                    algorithm: str = "auto") -> tuple[int, int]:
    """(sent, received) bytes of rank ``rank`` in an all-reduce of n elements of ``itemsize``.

    ``algorithm``: ``"auto"`` (what :func:`~minipar.collectives.auto.choose_allreduce`
    picks for n x itemsize bytes on ``world`` ranks), ``"ring"``,
    ``"recursive_doubling"``, ``"tree"`` or ``"naive"``.  MPI's own
    (``"mpi"``) does not tell its bytes: ``ValueError``.
    """
    if algorithm == "auto":
        from minipar.collectives.auto import choose_allreduce

        algorithm = choose_allreduce(n * itemsize, world)
    if algorithm == "ring":
        return ring_allreduce_bytes(n, itemsize, world, rank)
    formulas = {"recursive_doubling": recursive_doubling_bytes, "tree": tree_allreduce_bytes,
                "naive": naive_allreduce_bytes}
    if algorithm not in formulas:
        raise ValueError(f"no byte formula for all-reduce algorithm {algorithm!r}; one of "
                         f"auto, ring, {', '.join(formulas)} (MPI's own does not tell its bytes)")
    return formulas[algorithm](n * itemsize, world, rank)


def allreduce_bytes_sent(n: int, itemsize: int, world: int, rank: int,
                         algorithm: str = "auto") -> int:
    """Bytes rank ``rank`` sends in an all-reduce of n elements (see :func:`allreduce_bytes`)."""
    return allreduce_bytes(n, itemsize, world, rank, algorithm)[0]
