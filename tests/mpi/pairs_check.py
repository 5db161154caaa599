"""All checks of minipar.parallel.mappings for one world size, in one launch.

Run by tests/test_pairs.py as ``launch.run(N, this file)``; rank 0 prints
``PAIRS-SUMMARY N=<N> checks=<k> failures=<f>`` and the first failures, and
the job exits 1 if any check failed.  ``launch.run(N, this file, "mismatch")``
passes sequences of different lengths on different ranks (it must fail with a
CollectiveMismatchError).

1. the adjoint (dot-product) test: <forward(x), dy> == <x, backward(dy)>, random
   float64, every pair, lengths divisible by N and not, several axes;
2. exact results: integer-valued arrays against NumPy on the full arrays
   (every rank builds every rank's data locally);
3. bytes each rank sent = pair_bytes_sent (ring figures), and the totals balance;
4. bad input: a ValueError on every rank and not one byte sent.
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
from mpi4py import MPI

sys.path.insert(0, str(Path(__file__).parent))
from mpi_checks import Checks

from minipar import spans
from minipar.comm import TracedComm
from minipar.parallel import mappings as P
from minipar.parallel.mappings_measure import adjoint_sides, pair_bytes_sent

F, G = P.copy_to_tensor_model_parallel_region, P.reduce_from_tensor_model_parallel_region
SP_F, SP_G = P.gather_from_sequence_parallel_region, P.reduce_scatter_to_sequence_parallel_region

comm = TracedComm(MPI.COMM_WORLD)
N, R = comm.size, comm.rank
c = Checks("PAIRS")

if sys.argv[1:] == ["mismatch"]:  # rank 0 holds 4 positions, the others 5: not detectable locally
    SP_G.forward(comm, np.ones((2, 4 + (R > 0), 3)))
    comm.Barrier()  # a rank whose chunks happened to fit waits here for the one that noticed
    raise SystemExit("the mismatch went unnoticed")


def rand(shape: tuple[int, ...], seed: int) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal(shape)


def ints(shape: tuple[int, ...], rank: int, dtype: type = np.float64) -> np.ndarray:
    """Small rank-valued integers: every sum exact."""
    n = int(np.prod(shape))
    return ((np.arange(n) * (rank + 1) + 3 * rank) % 11).astype(dtype).reshape(shape)


def part(a: np.ndarray, axis: int, rank: int) -> np.ndarray:
    lo, hi = spans.span(a.shape[axis], N, rank)
    return np.take(a, range(lo, hi), axis=axis)


def shard_shape(full: tuple[int, ...], axis: int, rank: int) -> tuple[int, ...]:
    s = list(full)
    s[axis] = spans.counts(full[axis], N)[rank]
    return tuple(s)


def adjoint(pair: P.Pair, x: np.ndarray, dy: np.ndarray, what: str, **kw: object) -> None:
    lhs, rhs = adjoint_sides(comm, pair, x, dy, **kw)
    c.check(abs(lhs - rhs) <= 1e-12 * max(abs(lhs), abs(rhs), 1.0),
          f"adjoint {pair.name} {what}: <Ax,dy>={lhs!r} <x,A^T dy>={rhs!r}")


# -- 1. the adjoint test ------------------------------------------------------------
SEQS = sorted({1, N, N + 1, 2 * N + 1, 7})
for S in SEQS:
    for seed, (full, axis) in enumerate([((2, S, 3), 1), ((S, 2, 3), 0), ((2, 3, S), -1)]):
        ax = axis % 3
        same, mine = 100 * S + seed, 1000 + 100 * S + 10 * seed + R  # replicated / per-rank seeds
        adjoint(F, rand(full, same), rand(full, mine), f"{full}")
        adjoint(G, rand(full, mine), rand(full, same), f"{full}")
        local = shard_shape(full, ax, R)
        adjoint(SP_F, rand(local, mine), rand(full, mine + 7),
                f"{full} axis {axis}", axis=axis)
        adjoint(SP_G, rand(full, mine), rand(local, mine + 7),
                f"{full} axis {axis}", axis=axis)
    for H in sorted({N, N + 1, 5}):  # Ulysses: (b, s, heads, d); the sequence may be short
        if S < N:
            continue  # the backward splits the sequence: it needs one position per rank
        full = (2, S, H, 3)
        x, dy = rand(shard_shape(full, 1, R), 7 + R), rand(shard_shape(full, 2, R), 70 + R)
        adjoint(P.all_to_all, x, dy, f"{full}")
adjoint(F, rand((5,), 1), rand((5,), 2 + R), "auto", algorithm="auto")
# expert dispatch: tokens to ranks by a routing table every rank knows
table = np.random.default_rng(5).integers(0, 4, size=(N, N))  # table[j][i]: tokens j -> i
kw = {"split_axis": 0, "concat_axis": 0, "split_sizes": list(table[R]),
      "output_sizes": list(table[:, R])}
adjoint(P.all_to_all, rand((int(table[R].sum()), 4), R), rand((int(table[:, R].sum()), 4), 9 + R),
        "dispatch", **kw)

# -- 2. exact integer-valued results against NumPy ----------------------------------
for S in SEQS:
    full = (2, S, 4)
    xs = [ints(full, j) for j in range(N)]
    total = np.sum(xs, axis=0)
    c.check(np.array_equal(F.forward(comm, xs[0]), xs[0]), f"f fwd S={S}")
    c.check(np.array_equal(F.backward(comm, xs[R]), total), f"f bwd S={S}")
    c.check(np.array_equal(G.forward(comm, xs[R]), total), f"g fwd S={S}")
    c.check(np.array_equal(G.backward(comm, xs[0]), xs[0]), f"g bwd S={S}")
    g = ints(full, 99, np.int64)  # one global activation, sharded along the sequence
    c.check(np.array_equal(SP_F.forward(comm, part(g, 1, R)), g),
          f"SP f fwd S={S}")
    got = SP_F.backward(comm, xs[R].astype(np.int64))
    c.check(got.dtype == np.int64 and np.array_equal(got, part(total, 1, R)), f"SP f bwd S={S}")
    c.check(np.array_equal(SP_G.forward(comm, xs[R]), part(total, 1, R)),
          f"SP g fwd S={S}")
    c.check(np.array_equal(SP_G.backward(comm, part(g, 1, R)), g),
          f"SP g bwd S={S}")
    if S >= N:
        u = ints((2, S, N + 1, 3), 42, np.int64)
        y = P.all_to_all.forward(comm, part(u, 1, R))
        c.check(np.array_equal(y, part(u, 2, R)), f"a2a fwd S={S}")
        c.check(np.array_equal(P.all_to_all.backward(comm, y), part(u, 1, R)), f"a2a bwd S={S}")
tok = [ints((int(table[j].sum()), 3), j) for j in range(N)]
want = np.concatenate([np.split(tok[j], np.cumsum(table[j])[:-1])[R] for j in range(N)])
c.check(np.array_equal(P.all_to_all.forward(comm, tok[R], **kw), want), "dispatch exact")
c.check(np.array_equal(P.all_to_all.backward(comm, want, **kw), tok[R]), "combine exact")

# -- 3. bytes per rank = the formula -------------------------------------------------
def counted(pair: P.Pair, direction: str, arg: np.ndarray, op: str | None = None,
            **kw: object) -> tuple[int, int]:
    comm.stats.reset()
    getattr(pair, direction)(comm, arg, **({**kw, "op": op} if op else kw))
    name = op or pair.name
    sent, recv = comm.stats.bytes_sent(name), comm.stats.bytes_recv(name)
    c.check(comm.stats.bytes_sent() == sent, f"{pair.name} {direction}: bytes outside {name}")
    tot = comm.comm.allreduce(np.array([sent, recv]))  # MPI's own: uncounted, read after
    c.check(tot[0] == tot[1], f"{pair.name} {direction}: sent {tot[0]} != received {tot[1]}")
    return sent, recv


for S in sorted({N, N + 1, 2 * N - 1, 13}):
    full, isz = (3, S, 5), 8
    for pair in (F, G):
        for algo in ("ring", "auto", "recursive_doubling"):
            want_f, want_b = pair_bytes_sent(pair, full, isz, N, R, algorithm=algo)
            got_f = counted(pair, "forward", rand(full, 1), algorithm=algo)[0]
            got_b = counted(pair, "backward", rand(full, 1), algorithm=algo)[0]
            c.check((got_f, got_b) == (want_f, want_b),
                  f"{pair.name} {algo} bytes S={S}: counted {(got_f, got_b)}, "
                  f"formula {(want_f, want_b)}")
    for pair, fwd_in, bwd_in in ((SP_F, "shard", "full"),
                                 (SP_G, "full", "shard")):
        arr = {"shard": rand(shard_shape(full, 1, R), 2), "full": rand(full, 3)}
        got = (counted(pair, "forward", arr[fwd_in])[0], counted(pair, "backward", arr[bwd_in])[0])
        want2 = pair_bytes_sent(pair, full, isz, N, R)
        c.check(got == want2, f"{pair.name} bytes S={S}: counted {got}, formula {want2}")
        if S % N == 0:  # the ring's (N-1)/N x S, each way
            c.check(got[0] * N == got[1] * N == (N - 1) * int(np.prod(full)) * isz,
                  f"{pair.name} (N-1)/N x S, S={S}")
    u = (2, S, 2 * N + 1, 3)
    got = (counted(P.all_to_all, "forward", rand(shard_shape(u, 1, R), 4), op="cp_a2a")[0],
           counted(P.all_to_all, "backward", rand(shard_shape(u, 2, R), 5), op="cp_a2a")[0])
    want3 = pair_bytes_sent(P.all_to_all, u, 8, N, R)
    c.check(got == want3, f"a2a bytes S={S}: counted {got}, formula {want3}")
c.check(comm.stats.ops["cp_a2a"].calls == 1, "one call counted per backward")

# -- 4. bad input: ValueError on every rank, before any message ---------------------
x3 = np.ones((2, 2 * N, 3))
BAD = [
    ("axis 3 of a 3-D array", SP_F.forward, x3, {"axis": 3}),
    ("axis -4", SP_G.backward, x3, {"axis": -4}),
    ("axis 1.0", SP_G.forward, x3, {"axis": 1.0}),
    ("a2a split axis out of range", P.all_to_all.forward, x3, {"split_axis": 5}),
    ("unsupported dtype", F.backward, np.array(["a", "b"]), {}),
    ("split sizes not one per rank", P.all_to_all.forward, x3,
     {"split_axis": 1, "concat_axis": 1, "split_sizes": [2 * N] + [0] * N}),
    ("split sizes wrong sum", P.all_to_all.forward, x3,
     {"split_axis": 1, "concat_axis": 1, "split_sizes": [3] * N}),
    ("empty other axis", P.all_to_all.forward, np.ones((0, 2, N)), {}),
]
if N > 1:  # a head axis shorter than N leaves a rank with no heads
    BAD.append(("fewer heads than ranks", P.all_to_all.forward, np.ones((2, 3, N - 1, 2)), {}))
    BAD.append(("backward: sequence shorter than N", P.all_to_all.backward,
                np.ones((2, N - 1, 2, 2)), {}))
for what, fn, arg, kw2 in BAD:
    comm.stats.reset()
    try:
        fn(comm, arg, **kw2)
        c.check(False, f"bad input accepted: {what}")
    except ValueError as e:
        c.check(comm.stats.bytes_sent() == 0 and comm.stats.msgs_recv() == 0,
              f"{what}: messages before the error")
        c.check(len(str(e).splitlines()) == 1, f"{what}: not one line: {e}")
if N > 1:  # shards out of array_split order: every rank that holds a wrong share says so
    sizes = spans.counts(2 * N + 1, N)[::-1]
    try:
        SP_F.forward(comm, np.ones((2, sizes[R], 3)))
        c.check(sizes[R] == spans.counts(2 * N + 1, N)[R], "wrong shard accepted")
    except ValueError as e:
        c.check("array_split" in str(e) and sizes[R] != spans.counts(2 * N + 1, N)[R], str(e))

c.summary()
