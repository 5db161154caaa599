"""Bytes a collective moves per rank: ring, parameter server, bus bandwidth.

EN collective communication · RU коллективные операции · ZH 集合通信

For a buffer of S bytes on each of N ranks:

- Ring all-reduce = reduce-scatter (N−1 steps) + all-gather (N−1 steps);
  every rank sends, and receives, 2(N−1)/N × S bytes, only to its two
  neighbours, whatever N is.  Bandwidth-optimal: Patarasuk & Yuan 2009
  (J. Parallel Distrib. Comput. 69(2)); brought to deep learning by Baidu
  (Gibiansky 2017) and Horovod (Sergeev & Del Balso 2018, arXiv 1802.05799).
- Reduce-scatter and all-gather alone: (N−1)/N × S per rank.
- Parameter server: every worker sends its S bytes of gradients to the
  server and receives S bytes of parameters back, so the server receives
  N × S and sends N × S per step; its one link is the bottleneck the ring
  removes.
- nccl-tests bus bandwidth: algbw = S / t and busbw = algbw × factor with
  factor 2(N−1)/N for all-reduce, (N−1)/N for reduce-scatter, all-gather and
  all-to-all, 1 for broadcast, reduce and send/recv (S is the full buffer:
  the output of all-gather, the input of reduce-scatter).

**One meaning per name.**  ``*_volume(S, N)`` is the papers' per-rank
communication volume of an S-byte buffer (the ZeRO paper's word, §7), a
float, exact only when N divides the buffer.  The exact bytes one given rank
sends for a given element count, under minipar's chunking, are
:mod:`minipar.collectives.cost`'s ``*_bytes(n, itemsize, N, rank)``: the
numbers a TracedComm's counters must read.
"""

from __future__ import annotations

from minipar.plan._check import count, non_negative, positive


def ring_allreduce_volume(S: float, N: int) -> float:
    """Bytes one rank sends (and also receives) in a ring all-reduce: 2(N−1)/N × S.

    ``S`` is the buffer size in bytes on every rank, ``N`` the number of ranks
    (N = 1 moves nothing).  Patarasuk & Yuan 2009; Horovod, arXiv 1802.05799.
    """
    S, N = non_negative("S", S), count("N", N)
    return 2.0 * (N - 1) / N * S


def reduce_scatter_volume(S: float, N: int) -> float:
    """Bytes one rank sends in a ring reduce-scatter of an S-byte buffer: (N−1)/N × S."""
    S, N = non_negative("S", S), count("N", N)
    return (N - 1) / N * S


def all_gather_volume(S: float, N: int) -> float:
    """Bytes one rank sends in a ring all-gather with an S-byte *result*: (N−1)/N × S.

    Each rank owns S/N bytes and forwards N−1 chunks of that size.
    """
    S, N = non_negative("S", S), count("N", N)
    return (N - 1) / N * S


def all_to_all_volume(S: float, N: int) -> float:
    """Bytes one rank sends in an all-to-all of its S-byte buffer: (N−1)/N × S.

    The buffer holds N equal chunks, one per destination; the chunk addressed
    to the rank itself stays put.
    """
    S, N = non_negative("S", S), count("N", N)
    return (N - 1) / N * S


def ring_allreduce_steps(N: int) -> int:
    """Communication steps of a ring all-reduce: 2(N−1) (N−1 reduce-scatter + N−1 all-gather)."""
    return 2 * (count("N", N) - 1)


def parameter_server_bytes_at_server(S: float, W: int) -> float:
    """Bytes the server *receives* per step, and equally *sends*: W × S.

    W workers (the ranks that are not servers) each push S bytes of gradients
    and pull S bytes of parameters.
    """
    S, W = non_negative("S", S), count("W", W)
    return W * S


def parameter_server_bytes_per_worker(S: float) -> float:
    """Bytes one worker sends per step (its gradients), and equally receives: S."""
    return non_negative("S", S)


#: nccl-tests operation name -> bus-bandwidth factor as a function of N
_BUSBW = {
    "all_reduce": lambda n: 2.0 * (n - 1) / n,
    "reduce_scatter": lambda n: (n - 1) / n,
    "all_gather": lambda n: (n - 1) / n,
    "all_to_all": lambda n: (n - 1) / n,
    "broadcast": lambda n: 1.0,
    "reduce": lambda n: 1.0,
    "send_recv": lambda n: 1.0,
}
BUSBW_OPS: tuple[str, ...] = tuple(_BUSBW)


def busbw_factor(op: str, N: int) -> float:
    """nccl-tests bus-bandwidth factor: busbw = algbw × factor.

    all_reduce 2(N−1)/N; reduce_scatter, all_gather, all_to_all (N−1)/N;
    broadcast, reduce, send_recv 1.  ``op`` may also be spelled without the
    underscore (``allreduce``).  See nccl-tests doc/PERFORMANCE.md.
    """
    key = str(op).lower().replace("-", "_")
    key = {k.replace("_", ""): k for k in _BUSBW}.get(key.replace("_", ""), key)
    if key not in _BUSBW:
        raise ValueError(f"unknown collective {op!r}; one of {', '.join(BUSBW_OPS)}")
    return _BUSBW[key](count("N", N))


def algbw(S: float, seconds: float) -> float:
    """Algorithm bandwidth in bytes/s: S / t for an S-byte buffer taking t seconds."""
    return non_negative("S", S) / positive("seconds", seconds)


def busbw(S: float, seconds: float, op: str, N: int) -> float:
    """Bus bandwidth in bytes/s: algbw × busbw_factor(op, N), comparable across N."""
    return algbw(S, seconds) * busbw_factor(op, N)


def gradient_sync(psi: float, N: int, bytes_per_grad: float = 2.0) -> dict[str, float]:
    """One gradient synchronisation of ``psi`` parameters on ``N`` data-parallel ranks.

    The seed figure "a trillion parameters, one gradient sync ≈ 2 TB in FP16"
    is the payload S = Ψ × 2 bytes (10¹² × 2 = 2 × 10¹²).  Returns bytes:
    ``payload`` S; ``ring_per_rank`` 2(N−1)/N × S sent by each rank (the same
    received); for a parameter server with the same N ranks as workers (W = N,
    plus the server) ``ps_server_in`` and ``ps_server_out`` N × S through the
    server's link; ``ps_per_worker`` S each way.
    """
    S = positive("psi", psi) * positive("bytes_per_grad", bytes_per_grad)
    N = count("N", N)
    return {
        "payload": S,
        "ring_per_rank": ring_allreduce_volume(S, N),
        "ps_server_in": parameter_server_bytes_at_server(S, N),
        "ps_server_out": parameter_server_bytes_at_server(S, N),
        "ps_per_worker": parameter_server_bytes_per_worker(S),
    }
