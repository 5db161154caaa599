"""Message isolation on one communicator: foreign traffic pending while collectives run.

Run by tests/test_isolation.py as ``launch.run(N, this file)``.  Every rank
runs every check; rank 0 prints ``ISOLATION-SUMMARY N=<N> checks=<k>
failures=<f>`` and the first failures; the job exits 1 if any check failed.

Before each blocking collective every rank posts pipeline-like ``Isend``s
(tags from the pipeline range of minipar.comm.tags) to every other rank, some
exactly as long as the collective's own messages (so a receive that took any
tag from the right peer would take them) and some large (rendezvous
protocol).  They are received only after the collective, in reverse order,
and must arrive intact; every collective's result must equal MPI's own.
Then two non-blocking all-reduces run interleaved with blocking ones.
Data are small integers: every sum is exact and compares with array_equal.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
from mpi4py import MPI

sys.path.insert(0, str(Path(__file__).parent))
from mpi_checks import Checks

import minipar.collectives as C
from minipar.collectives.nonblocking import iallreduce, nonblocking_tag
from minipar.comm import TracedComm
from minipar.comm.tags import pipeline_tag

comm = TracedComm(MPI.COMM_WORLD)
N, R = comm.size, comm.rank
c = Checks("ISOLATION")


def data(rank: int, n: int, salt: int = 0) -> np.ndarray:
    return ((np.arange(n) * (rank + 1) + rank + salt) % 7).astype(np.float64)


def mpi_allreduce(x: np.ndarray) -> np.ndarray:
    out = np.empty_like(x)
    comm.comm.Allreduce(x, out, op=MPI.SUM)
    return out


def payload(src: int, dst: int, mb: int, n: int) -> np.ndarray:
    return np.full(n, 1000.0 * src + 10.0 * dst + mb)


def with_foreign(what: str, n_elems: int, fn: Callable[..., Any], *args: Any) -> Any:
    """Post pipeline sends to every other rank, run ``fn(comm, *args)``, then receive them."""
    sizes = [n_elems, n_elems, 1, 1 << 17]  # as long as the collective's chunks; tiny; 1 MiB
    reqs = []
    with comm.operation("pipeline_p2p"):
        for dst in range(N):
            if dst != R:
                for mb, k in enumerate(sizes):
                    reqs.append(comm.Isend(payload(R, dst, mb, k), dst, pipeline_tag("act", mb)))
    result = fn(comm, *args)
    with comm.operation("pipeline_p2p"):
        for src in range(N):
            if src == R:
                continue
            for mb in reversed(range(len(sizes))):  # out of order: matched by tag, not arrival
                got = np.full(sizes[mb], -1.0)
                comm.Recv(got, src, pipeline_tag("act", mb))
                c.check(np.array_equal(got, payload(src, R, mb, sizes[mb])),
                        f"{what}: pipeline message {mb} from rank {src} damaged")
    comm.waitall(reqs)
    return result


def collectives_with_foreign() -> None:
    for n in (1, N, 12 * N + 1, 3000):
        x = data(R, n)
        want = mpi_allreduce(x)
        chunk = n // N + 1  # the ring's largest chunk: foreign sends of that length too
        for name, fn in [("ring_allreduce", C.ring_allreduce),
                         ("tree_allreduce", C.tree_allreduce),
                         ("recursive_doubling_allreduce", C.recursive_doubling_allreduce),
                         ("naive_allreduce", C.naive_allreduce)]:
            comm.stats.reset()
            out = with_foreign(f"{name} n={n}", chunk, fn, x)
            c.check(np.array_equal(out, want), f"{name} n={n}: differs from MPI's Allreduce")
            if name == "ring_allreduce":
                c.check(comm.stats.bytes_sent(name) == C.ring_allreduce_bytes(n, 8, N, R)[0],
                        f"ring_allreduce n={n}: bytes differ from the formula")
        rows = np.stack([data(R, 3, salt=i) for i in range(n)]) if n else np.zeros((0, 3))
        mine = with_foreign(f"reduce_scatter n={n}", chunk * 3, C.reduce_scatter, rows)
        full = mpi_allreduce(rows)
        c.check(np.array_equal(mine, np.array_split(full, N)[R]), f"reduce_scatter n={n}")
        gathered = with_foreign(f"all_gather n={n}", chunk * 3, C.all_gather, mine)
        c.check(np.array_equal(gathered, full), f"all_gather n={n}: differs from MPI's Allreduce")
        for root in {0, N - 1}:
            ref = x.copy()
            comm.comm.Bcast(ref, root=root)
            known = with_foreign(f"broadcast root={root}", n, C.broadcast,
                                 x if R == root else np.zeros_like(x), root)
            learned = with_foreign(f"broadcast(None) root={root}", n, C.broadcast,
                                   x if R == root else None, root)
            c.check(np.array_equal(known, ref) and np.array_equal(learned, ref),
                    f"broadcast root={root} n={n}")
        chunks = [np.full((R + j) % 3, 10.0 * R + j) for j in range(N)]
        got = with_foreign(f"all_to_all n={n}", 2, C.all_to_all, chunks)
        c.check(all(np.array_equal(got[j], np.full((j + R) % 3, 10.0 * j + R)) for j in range(N)),
                "all_to_all with pending foreign messages")


def nonblocking_interleaved() -> None:
    """Two non-blocking all-reduces in flight around blocking ones; rank 0 progresses early."""
    for n in (N + 1, 5000):
        a, b = data(R, n, 1), data(R, 2 * n + 3, 2)
        want_a, want_b = mpi_allreduce(a), mpi_allreduce(b)
        x = data(R, n, 3)
        want_x = mpi_allreduce(x)
        ra = iallreduce(comm, a, nonblocking_tag(0))
        rb = iallreduce(comm, b, nonblocking_tag(1))
        got1 = C.ring_allreduce(comm, x)
        if R == 0:
            ra.progress()
        got2 = C.tree_allreduce(comm, x)
        rb.wait()
        got3 = C.ring_allreduce(comm, x)
        ra.wait()
        ra.wait()  # a request finished twice is still counted once (below)
        c.check(np.array_equal(a, want_a) and np.array_equal(b, want_b),
                f"non-blocking n={n}: differ from MPI's Allreduce")
        c.check(all(np.array_equal(g, want_x) for g in (got1, got2, got3)),
                f"blocking between non-blocking n={n}: differ from MPI's Allreduce")
    comm.stats.reset()
    y = data(R, 4 * N)
    req = iallreduce(comm, y, nonblocking_tag(7), name="nb")
    C.ring_allreduce(comm, data(R, 4 * N))
    req.wait()
    req.wait()
    c.check(comm.stats.bytes_recv("nb") == C.ring_allreduce_bytes(4 * N, 8, N, R)[1],
            f"non-blocking bytes received {comm.stats.bytes_recv('nb')} != formula")


collectives_with_foreign()
nonblocking_interleaved()
comm.Barrier()

c.summary()
