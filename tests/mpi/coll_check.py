"""All checks of minipar.collectives for one world size, in one launch.

Run by tests/test_collectives.py as ``launch.run(N, this file)``.  Every rank
runs every check; rank 0 prints ``COLL-SUMMARY N=<N> checks=<k> failures=<f>``
and the first failures, and the job exits 1 if any check failed.

Data are small rank-valued integers, so every sum is exact in every dtype
(float16 and bfloat16 included) and results compare with ``np.array_equal``
against (a) a reference every rank computes locally from every rank's data and
(b) MPI's own collective (``algorithm="mpi"``).

Under ``MINIPAR_BACKEND=strict`` (the device stand-in) the inputs are device arrays:
every collective must run on them without NumPy, and every byte it sent or received
must have been staged through host memory (counted each way).
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
from ml_dtypes import bfloat16
from mpi4py import MPI

sys.path.insert(0, str(Path(__file__).parent))
from mpi_checks import Checks

import minipar.collectives as C
from minipar import backend
from minipar.backend import to_device as D
from minipar.backend import to_host as H
from minipar.comm import TracedComm

comm = TracedComm(MPI.COMM_WORLD)
N, R = comm.size, comm.rank
c = Checks("COLL")
RIGHT, LEFT = (R + 1) % N, (R - 1) % N
LENGTHS = sorted({0, 1, max(N - 1, 0), N, N + 1, 1000, 1001})
ALL_DTYPES = [np.int32, np.int64, np.uint8, np.float16, np.float32, np.float64, bfloat16]


def host_data(rank: int, shape: tuple[int, ...] | int, dtype: type, salt: int = 0) -> np.ndarray:
    n = int(np.prod(shape))
    return ((np.arange(n) * (rank + 1) + rank + salt) % 7).astype(dtype).reshape(shape)


def data(rank: int, shape: tuple[int, ...] | int, dtype: type) -> np.ndarray:
    """Rank ``rank``'s input, on the backend's side (a device array under the stand-in)."""
    return D(host_data(rank, shape, dtype))


def reference(shape: tuple[int, ...] | int, dtype: type, op: str) -> np.ndarray:
    parts = [host_data(q, shape, dtype).astype(np.float64) for q in range(N)]
    red = np.sum(parts, axis=0) if op == "sum" else np.max(parts, axis=0)
    return red.astype(dtype)


def same(a: np.ndarray | None, b: np.ndarray | None) -> bool:
    if a is None or b is None:
        return False
    a, b = H(a), H(b)
    return a.dtype == b.dtype and a.shape == b.shape \
        and np.array_equal(a.astype(np.float64), b.astype(np.float64))


def bytes_ok(name: str, sent: int, recv: int, what: str) -> None:
    s = comm.stats
    c.check(s.bytes_sent(name) == sent and s.bytes_recv(name) == recv,
            f"{what}: counted sent/recv {s.bytes_sent(name)}/{s.bytes_recv(name)}, "
            f"formula {sent}/{recv}")
    staged = (s.bytes_staged("d2h", name), s.bytes_staged("h2d", name))
    c.check(staged == ((sent, recv) if backend.device else (0, 0)),
            f"{what}: staged device->host/host->device {staged}, sent/received {sent}/{recv}")


# -- all-reduce: every algorithm, lengths x dtypes x ops -----------------------------
ALLREDUCE = {
    "ring": ("ring_allreduce", lambda n, i: C.ring_allreduce_bytes(n, i, N, R)),
    "naive": ("naive_allreduce", lambda n, i: C.naive_allreduce_bytes(n * i, N, R)),
    "recursive_doubling": ("recursive_doubling_allreduce",
                           lambda n, i: C.recursive_doubling_bytes(n * i, N, R)),
    "tree": ("tree_allreduce", lambda n, i: C.tree_allreduce_bytes(n * i, N, R)),
}
for n in LENGTHS:
    dtypes = ALL_DTYPES if n in (N + 1, 1001) else [np.int64, np.float32]
    for dt in dtypes:
        for op in ("sum", "max"):
            x = data(R, n, dt)
            keep = x.copy()
            want = reference(n, dt, op)
            mpi = C.allreduce(comm, x, op, algorithm="mpi")
            c.check(same(mpi, want), f"mpi allreduce n={n} {np.dtype(dt)} {op}")
            for algo, (name, formula) in ALLREDUCE.items():
                comm.stats.reset()
                got = C.allreduce(comm, x, op, algorithm=algo)
                what = f"{algo} allreduce n={n} {np.dtype(dt)} {op}"
                c.check(same(got, mpi), what + ": result differs from MPI's Allreduce")
                c.check(same(x, keep), what + ": input modified")
                bytes_ok(name, *formula(n, np.dtype(dt).itemsize), what)
                if algo == "ring" and N > 1:
                    c.check(set(comm.stats.peers_sent(name)) <= {RIGHT}
                            and set(comm.stats.peers_recv(name)) <= {LEFT},
                            what + f": peers {comm.stats.peers_sent(name)} "
                            f"{comm.stats.peers_recv(name)} are not the ring neighbours")
                    c.check(comm.stats.msgs_sent(name) == 2 * (N - 1), what + ": 2(N-1) messages")
                    if n % N == 0:
                        s = n * np.dtype(dt).itemsize
                        c.check(comm.stats.bytes_sent(name) * N == 2 * (N - 1) * s,
                                what + ": 2(N-1)/N x S exactly")

# shapes: all-reduce keeps the shape; a non-contiguous input gives the right answer
x2 = data(R, (6, 5), np.float64)
c.check(same(C.ring_allreduce(comm, x2), reference((6, 5), np.float64, "sum")), "2-D ring")
xs = data(R, 40, np.int64)
got = C.ring_allreduce(MPI.COMM_WORLD, xs[::2])  # plain communicator, strided input
c.check(same(got, np.ascontiguousarray(reference(40, np.int64, "sum")[::2])), "strided input")
c.check(same(C.ring_allreduce(comm, np.int64(R)), np.array(N * (N - 1) // 2, np.int64)),
        "0-d ring all-reduce")

# -- reduce-scatter and all-gather ----------------------------------------------------
for n in LENGTHS:
    for dt in ([np.int32, np.float16, bfloat16] if n == 1001 else [np.float64]):
        for op in ("sum", "max"):
            x = data(R, n, dt)
            keep = x.copy()
            want = np.array_split(reference(n, dt, op), N)[R]
            mpi = C.reduce_scatter(comm, x, op, algorithm="mpi")
            comm.stats.reset()
            got = C.reduce_scatter(comm, x, op)
            what = f"reduce_scatter n={n} {np.dtype(dt)} {op}"
            c.check(same(got, want) and same(mpi, want), what)
            c.check(same(x, keep), what + ": input modified")
            bytes_ok("reduce_scatter", *C.reduce_scatter_bytes(n, np.dtype(dt).itemsize, N, R),
                     what)
        full = data(0, n, dt)
        chunk = D(np.array_split(host_data(0, n, dt), N)[R])
        comm.stats.reset()
        got = C.all_gather(comm, chunk)
        what = f"all_gather n={n} {np.dtype(dt)}"
        c.check(same(got, full) and same(C.all_gather(comm, chunk, algorithm="mpi"), full), what)
        counts = C.chunk_counts(n, N)
        bytes_ok("all_gather", *C.all_gather_bytes(counts, np.dtype(dt).itemsize, R), what)
        if N > 1:
            c.check(set(comm.stats.peers_sent("all_gather")) <= {RIGHT}, what + ": peers")

rows = 2 * N + 1  # 2-D: split along axis 0
x3 = data(R, (rows, 3), np.int64)
want = np.array_split(reference((rows, 3), np.int64, "sum"), N)[R]
comm.stats.reset()
got = C.reduce_scatter(comm, x3)
c.check(same(got, want), "2-D reduce_scatter rows")
bytes_ok("reduce_scatter", *C.reduce_scatter_bytes(rows, 3 * 8, N, R), "2-D reduce_scatter")
c.check(same(C.all_gather(comm, got), reference((rows, 3), np.int64, "sum")), "2-D all_gather")
# explicit counts (ZeRO cuts buffers at shard boundaries): rank q gets counts[q] rows
counts = [(q * 5 + 3) % 4 for q in range(N)]  # uneven, some zero
full = reference((sum(counts), 3), np.int64, "sum")
xc = data(R, (sum(counts), 3), np.int64)
comm.stats.reset()
got = C.reduce_scatter(comm, xc, counts=counts)
lo = sum(counts[:R])
c.check(same(got, full[lo: lo + counts[R]]), "reduce_scatter with counts")
c.check(same(C.reduce_scatter(comm, xc, counts=counts, algorithm="mpi"), got), "counts vs MPI")
c.check(comm.stats.bytes_sent("reduce_scatter") == (sum(counts) - counts[R]) * 3 * 8 * (N > 1),
        "reduce_scatter with counts: bytes")
mine = D(np.full((R % 3, 2), R, np.int16))  # uneven, arbitrary lengths
want = np.concatenate([np.full((q % 3, 2), q, np.int16) for q in range(N)])
c.check(same(C.all_gather(comm, mine), want), "all_gather of uneven chunks")

# -- broadcast and reduce, every root ---------------------------------------------------
for root in range(N):
    for n in (0, 1, N + 1, 1001):
        for dt in (np.float64, bfloat16):
            x = data(R, n, dt)
            keep = x.copy()
            what = f"broadcast root={root} n={n} {np.dtype(dt)}"
            comm.stats.reset()
            got = C.broadcast(comm, x, root=root)
            c.check(same(got, data(root, n, dt)), what)
            c.check(same(x, keep), what + ": input modified")
            bytes_ok("broadcast", *C.broadcast_bytes(x.nbytes, N, R, root), what)
            c.check(same(C.broadcast(comm, x, root, algorithm="mpi"), data(root, n, dt)),
                    what + " (mpi)")
            for algo in ("binomial", "mpi"):  # non-roots that do not know length or dtype
                comm.stats.reset()
                got = C.broadcast(comm, x if R == root else None, root, algorithm=algo)
                c.check(same(got, data(root, n, dt)), what + f" to None-callers ({algo})")
                if algo == "binomial":
                    bytes_ok("broadcast", *C.broadcast_bytes(x.nbytes, N, R, root), what)
            for op in ("sum", "max"):
                what = f"reduce root={root} n={n} {np.dtype(dt)} {op}"
                comm.stats.reset()
                got = C.reduce(comm, x, root=root, op=op)
                mpi = C.reduce(comm, x, root, op, algorithm="mpi")
                if R == root:
                    c.check(same(got, reference(n, dt, op)) and same(mpi, got), what)
                else:
                    c.check(got is None and mpi is None, what + ": non-root gets None")
                c.check(same(x, keep), what + ": input modified")
                bytes_ok("reduce", *C.reduce_bytes(x.nbytes, N, R, root), what)

# -- all-to-all -------------------------------------------------------------------------
for trailing in ((), (2,)):
    chunks = [D(np.full(((R + i) % 3, *trailing), 10 * R + i, np.int32)) for i in range(N)]
    keep = [c.copy() for c in chunks]
    comm.stats.reset()
    got = C.all_to_all(comm, chunks)
    mpi = C.all_to_all(comm, chunks, algorithm="mpi")
    what = f"all_to_all trailing={trailing}"
    for j in range(N):
        want = np.full(((j + R) % 3, *trailing), 10 * j + R, np.int32)
        c.check(same(got[j], want) and same(mpi[j], want), what + f" chunk from {j}")
    c.check(all(same(a, b) for a, b in zip(chunks, keep)), what + ": input modified")
    sent = sum(c.nbytes for i, c in enumerate(chunks) if i != R)
    recv = sum(g.nbytes for j, g in enumerate(got) if j != R)
    bytes_ok("all_to_all", sent, recv, what)

# -- local errors: raised on every rank before any message ------------------------------
before = comm.stats.msgs_sent()
for call, what in [
    (lambda: C.ring_allreduce(comm, xs, op="mean"), "unknown op"),
    (lambda: C.allreduce(comm, xs, algorithm="butterfly"), "unknown algorithm"),
    (lambda: C.broadcast(comm, xs, root=N), "root out of range"),
    (lambda: C.reduce(comm, xs, root=-1), "negative root"),
    (lambda: C.broadcast(comm, None, root=R), "broadcast of None from the root"),
    (lambda: C.ring_allreduce(comm, np.array(["a", "b"], dtype=object)), "object dtype"),
    (lambda: C.all_to_all(comm, [xs] * (N + 1)), "wrong number of chunks"),
    (lambda: C.reduce_scatter(comm, np.float64(1.0)), "0-d reduce_scatter"),
    (lambda: C.reduce_scatter(comm, np.zeros(3), counts=[3] + [0] * N), "counts of wrong length"),
    (lambda: C.reduce_scatter(comm, np.zeros(3), counts=[4] + [0] * (N - 1)), "counts not summing"),
]:
    try:
        call()
        c.check(False, f"{what}: no error")
    except ValueError as e:
        c.check(len(str(e)) > 20, f"{what}: message too short: {e}")
c.check(comm.stats.msgs_sent() == before, "errors sent messages before raising")

c.summary()
