"""``minipar demo -n N``: the first thing to run — a ring all-reduce, measured.

Every rank holds a "gradient" of S bytes (rank-valued integers stored as
float64, so the sum is exact).  Two from-scratch all-reduces run on it:

* the **ring** (reduce-scatter then all-gather, Patarasuk & Yuan 2009), where
  each rank sends 2(N-1)/N x S bytes, only to its right-hand neighbour;
* the **naive** one (gather to rank 0, sum, broadcast back: the parameter
  server's pattern), where rank 0's link carries about N x S bytes each way.

Both results are checked against MPI's own ``Allreduce``; the bytes are read
from the traced communicator's counters and printed next to the formulas.
"""

from __future__ import annotations

import argparse
import sys

WORKER_FLAG = "--worker"


def _worker(elems: int, as_json: bool = False) -> int:
    import json

    import numpy as np
    from mpi4py import MPI

    from minipar import collectives
    from minipar.comm import traced

    comm = traced(MPI.COMM_WORLD)
    rank, n = comm.rank, comm.size
    grad = np.arange(elems, dtype=np.float64) + rank  # rank-valued: the sum is exact
    expected = np.empty_like(grad)
    MPI.COMM_WORLD.Allreduce(grad, expected)

    ring = collectives.ring_allreduce(comm, grad)
    naive = collectives.naive_allreduce(comm, grad)
    ok = bool(np.array_equal(ring, expected) and np.array_equal(naive, expected))
    s = grad.nbytes
    row = (
        rank,
        comm.stats.bytes_sent("ring_allreduce"),
        sorted(comm.stats.peers_sent("ring_allreduce")),
        comm.stats.bytes_sent("naive_allreduce"),
        comm.stats.bytes_recv("naive_allreduce"),
        ok,
    )
    rows = MPI.COMM_WORLD.gather(row, root=0)
    if rank == 0 and as_json:
        keys = ("rank", "ring_sent", "ring_peers", "naive_sent", "naive_recv", "equal_to_mpi")
        print(json.dumps({"ranks": n, "elems": elems, "bytes": s,
                          "rows": [dict(zip(keys, r)) for r in rows]}))
        return 0 if all(r[-1] for r in rows) else 1
    if rank == 0:
        mib = s / 2**20
        print(f"minipar demo: all-reduce of a {elems:,}-element float64 gradient "
              f"(S = {s:,} bytes = {mib:.2f} MiB) on {n} MPI ranks\n")
        print(f"{'rank':>4}  {'ring: sent':>12}  {'to ranks':>8}  {'naive: sent':>12}  "
              f"{'naive: received':>15}  {'= MPI Allreduce':>15}")
        for r, ring_b, peers, nv_s, nv_r, good in rows:
            print(f"{r:>4}  {ring_b:>12,}  {peers!s:>8}  {nv_s:>12,}  {nv_r:>15,}  "
                  f"{'yes' if good else 'NO':>15}")
        formula = 2 * (n - 1) / n * s
        print(f"\nring formula 2(N-1)/N x S = {formula:,.0f} bytes per rank, "
              "each rank talking only to its right-hand neighbour")
        root_in, root_out = rows[0][4], rows[0][3]
        print(f"naive (parameter-server pattern): rank 0 received {root_in:,} and sent "
              f"{root_out:,} bytes: (N-1) x S each way, through one link")
        if n > 1:
            print(f"the busiest link carries {max(root_in, root_out) / max(formula, 1):.1f}x "
                  "more in the naive scheme than in the ring")
        all_ok = all(r[-1] for r in rows)
        print("\nresult: both equal MPI's own Allreduce on every rank" if all_ok
              else "\nresult: MISMATCH against MPI's Allreduce")
        return 0 if all_ok else 1
    return 0


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="minipar demo", description=__doc__.split("\n\n")[0])
    parser.add_argument("-n", "--ranks", type=int, default=4, help="number of MPI ranks (default 4)")
    parser.add_argument("--elems", type=int, default=1 << 18,
                        help="gradient length in float64 elements (default 262144 = 2 MiB)")
    parser.add_argument("--json", action="store_true", help="print the measurements as JSON")
    parser.add_argument("--timeout", type=float, default=120.0, help="seconds before all ranks are killed")
    args = parser.parse_args(argv)
    if args.ranks < 1 or args.elems < 0:
        parser.error("--ranks must be >= 1 and --elems >= 0")
    from minipar import launch

    extra = ["--json"] if args.json else []
    proc = launch.run(args.ranks, "minipar.demo", WORKER_FLAG, str(args.elems), *extra,
                      timeout=args.timeout, capture=False)
    return proc.returncode


if __name__ == "__main__":
    if len(sys.argv) >= 3 and sys.argv[1] == WORKER_FLAG:
        sys.exit(_worker(int(sys.argv[2]), as_json="--json" in sys.argv[3:]))
    sys.exit(main(sys.argv[1:]))
