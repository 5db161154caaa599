"""All-to-all by pairwise exchange: every rank sends a different chunk to every rank.

EN all-to-all (personalised exchange) · RU всё-ко-всем (персонализированный обмен) ·
ZH 全交换 (全对全)

The collective of expert parallelism (GShard, Lepikhin et al. 2020, arXiv
2006.16668: dispatch tokens to the rank holding their expert, then combine)
and of DeepSpeed-Ulysses (arXiv 2309.14509: sequence shards <-> head shards).
Rank r holds ``chunks[0..N-1]``; chunk i goes to rank i.  Pairwise exchange
(Thakur, Rabenseifner & Gropp 2005): in step s = 1..N-1 rank r sends
``chunks[(r+s) % N]`` to rank (r+s) % N and receives from rank (r-s) % N, so
each step is a perfect matching of senders and receivers and no link is
asked to carry two messages at once.

Formula the tests check: rank r sends exactly the bytes of its chunks i != r
(its own chunk is copied locally) and receives, from each rank j != r, that
rank's chunk r.  Chunks may differ in length (the receiver learns each length
by probing the message); on one rank they must share dtype and trailing shape.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from minipar import backend
from minipar.collectives import _base as B

_ALGOS = ("pairwise", "mpi")


def all_to_all(comm: Any, chunks: Sequence[Any], algorithm: str = "pairwise") -> list[np.ndarray]:
    """Send ``chunks[i]`` to rank i; return the list whose item j came from rank j.

    Each received chunk has shape ``(-1, *trailing)`` where ``trailing`` is the
    trailing shape of this rank's chunks (1-D chunks give 1-D results).
    """
    B.check_algorithm(algorithm, _ALGOS, "all_to_all")
    c = B.traced(comm)
    if len(chunks) != c.size:
        raise ValueError(f"all_to_all needs one chunk per rank: {c.size} chunks, "
                         f"got {len(chunks)}")
    am = backend.array_module(chunks[0]) if len(chunks) else np  # the chunks' side
    arrs = [am.ascontiguousarray(x) for x in chunks]
    arrs = [x.reshape(1) if x.ndim == 0 else x for x in arrs]
    dtype, trailing = arrs[0].dtype, arrs[0].shape[1:]
    for i, x in enumerate(arrs):
        if x.dtype != dtype or x.shape[1:] != trailing:
            raise ValueError(f"all_to_all chunk {i} has dtype {x.dtype} and shape {x.shape}; "
                             f"chunk 0 has {dtype} and trailing shape {trailing}: they must agree")
    row = int(np.prod(trailing, dtype=np.int64))
    if row == 0:
        raise ValueError(f"all_to_all chunks of trailing shape {trailing} hold no elements")
    B.dtype_code(dtype)
    n, r = c.size, c.rank
    if algorithm == "mpi":
        send = am.concatenate([x.reshape(-1) for x in arrs])
        scounts = [x.size for x in arrs]
        rcounts = c.comm.alltoall(scounts)  # pickled: the oracle may use extra messages
        recv = am.empty(sum(rcounts), dtype)
        _, dt, _ = B.mpi_spec(send)
        with c.operation("mpi_all_to_all"):
            B.mpi_comm(c, send).Alltoallv([send, scounts, B.offsets_of(scounts), dt],
                             [recv, rcounts, B.offsets_of(rcounts), dt])
        offs = B.offsets_of(rcounts)
        return [recv[o: o + k].reshape(-1, *trailing) for o, k in zip(offs, rcounts)]
    got: list[np.ndarray | None] = [None] * n
    got[r] = arrs[r].copy()
    tag = B.tag_for("all_to_all", dtype, row=row)
    with c.operation("all_to_all"):
        for s in range(1, n):
            dst, src = (r + s) % n, (r - s) % n
            req = c.Isend(arrs[dst].reshape(-1), dst, tag)
            got[src] = B.recv_any_size(c, src, tag, dtype, row, am).reshape(-1, *trailing)
            c.waitall([req])
    return [g for g in got if g is not None]
