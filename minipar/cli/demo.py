"""``minipar demo -n N``: the first thing to run — a ring all-reduce, measured.

EN all-reduce demo · RU демонстрация all-reduce · ZH 全归约演示

Every rank holds a "gradient" of S bytes (rank-valued integers stored as
float64, so the sum is exact).  Two from-scratch all-reduces run on it:

* the **ring** (reduce-scatter then all-gather, Patarasuk & Yuan 2009), where
  each rank sends 2(N-1)/N x S bytes, only to its right-hand neighbour;
* the **naive** one (gather to rank 0, sum, broadcast back: the parameter
  server's pattern), where rank 0's link carries about N x S bytes each way.

Both results are checked against MPI's own ``Allreduce``; the bytes are read
from the traced communicator's counters and printed next to the formulas.
The ranks measure (:func:`measure`, through :func:`minipar.launch.run_json`),
this process checks the options before MPI starts and prints the table
(:func:`format_table`), or the measurements as JSON with ``--json``.
"""

from __future__ import annotations

import json
import sys
from typing import Any

from minipar.cli.options import ArgumentParser, integer, seconds

PROG = "minipar demo"
#: the demo's last line: the next step of the README's learning path
NEXT = ("next: notebook 01_collectives (jupyter lab notebooks/01_collectives.ipynb), then "
        "minipar exercise start ring_allreduce; the whole path: README.md, \"Learning path\"")
KEYS = ("rank", "ring_sent", "ring_peers", "naive_sent", "naive_recv", "equal_to_mpi")


def measure(payload: dict[str, Any]) -> dict[str, Any] | None:
    """Rank side: both all-reduces of ``payload["elems"]`` float64 elements; rank 0
    returns ``{"ranks", "elems", "bytes", "rows": [one dict per rank]}``."""
    import numpy as np
    from mpi4py import MPI

    from minipar import collectives
    from minipar.comm.traced import traced

    elems = payload["elems"]
    comm = traced(MPI.COMM_WORLD)
    grad = np.arange(elems, dtype=np.float64) + comm.rank  # rank-valued: the sum is exact
    expected = np.empty_like(grad)
    MPI.COMM_WORLD.Allreduce(grad, expected)
    ring = collectives.ring_allreduce(comm, grad)
    naive = collectives.naive_allreduce(comm, grad)
    row = (comm.rank, comm.stats.bytes_sent("ring_allreduce"),
           sorted(comm.stats.peers_sent("ring_allreduce")),
           comm.stats.bytes_sent("naive_allreduce"), comm.stats.bytes_recv("naive_allreduce"),
           bool(np.array_equal(ring, expected) and np.array_equal(naive, expected)))
    rows = MPI.COMM_WORLD.gather(row, root=0)
    if comm.rank != 0:
        return None
    return {"ranks": comm.size, "elems": elems, "bytes": grad.nbytes,
            "rows": [dict(zip(KEYS, r)) for r in rows]}


def format_table(data: dict[str, Any]) -> str:
    """The measurements as the table a learner reads, with the formulas under it."""
    n, s, rows = data["ranks"], data["bytes"], data["rows"]
    lines = [(f"minipar demo: all-reduce of a {data['elems']:,}-element float64 gradient "
              f"(S = {s:,} bytes = {s / 2**20:.2f} MiB) on {n} MPI ranks"), "",
             (f"{'rank':>4}  {'ring: sent':>12}  {'to ranks':>8}  {'naive: sent':>12}  "
              f"{'naive: received':>15}  {'= MPI Allreduce':>15}")]
    for r in rows:
        lines.append(f"{r['rank']:>4}  {r['ring_sent']:>12,}  {r['ring_peers']!s:>8}  "
                     f"{r['naive_sent']:>12,}  {r['naive_recv']:>15,}  "
                     f"{'yes' if r['equal_to_mpi'] else 'NO':>15}")
    formula = 2 * (n - 1) / n * s
    lines += ["", (f"ring formula 2(N-1)/N x S = {formula:,.0f} bytes per rank, "
                   "each rank talking only to its right-hand neighbour"),
              (f"naive (parameter-server pattern): rank 0 received {rows[0]['naive_recv']:,} "
               f"and sent {rows[0]['naive_sent']:,} bytes: (N-1) x S each way, through one link")]
    if n > 1:
        busiest = max(rows[0]["naive_recv"], rows[0]["naive_sent"])
        lines.append(f"the busiest link carries {busiest / max(formula, 1):.1f}x "
                     "more in the naive scheme than in the ring")
    ok = all(r["equal_to_mpi"] for r in rows)
    lines += ["", "result: both equal MPI's own Allreduce on every rank" if ok
              else "result: MISMATCH against MPI's Allreduce"]
    if ok:
        lines.append(NEXT)
    return "\n".join(lines)


def parser() -> ArgumentParser:
    from minipar.run.options import existing_file

    p = ArgumentParser(prog=PROG, description=__doc__.split("\n\n")[0])
    p.add_argument("-n", "--ranks", type=integer(1), default=4,
                   help="number of MPI ranks (default 4)")
    p.add_argument("--elems", type=integer(0), default=1 << 18,
                   help="gradient length in float64 elements (default 262144 = 2 MiB)")
    p.add_argument("--json", action="store_true", help="print the measurements as JSON")
    p.add_argument("--timeout", type=seconds, default=120.0,
                   help="seconds before all ranks are killed (default 120)")
    p.add_argument("--hostfile", type=existing_file, default=None,
                   help="hosts to run the ranks on, passed to mpiexec (see MINIPAR_MPIEXEC)")
    p.add_argument("--debug", action="store_true", help="on failure, show every rank's output")
    return p


def main(argv: list[str]) -> int:
    args = parser().parse_args(argv)
    from minipar import launch

    try:
        data, _ = launch.run_json(args.ranks, "minipar.cli.demo", {"elems": args.elems}, check=True,
                                  timeout=args.timeout, hostfile=args.hostfile)
    except launch.LaunchError as e:  # any failure of the launch
        return launch.report(PROG, e, args.debug)
    print(json.dumps(data) if args.json else format_table(data))
    return 0 if all(r["equal_to_mpi"] for r in data["rows"]) else 1


if __name__ == "__main__":
    from minipar import launch

    if launch.is_worker(sys.argv[1:]):
        sys.exit(launch.serve(measure, sys.argv[1:]))
    sys.exit(main(sys.argv[1:]))
