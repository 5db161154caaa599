"""``minipar bench wait``: the CPU a waiting rank steals, MPI's blocking wait vs polling.

EN busy-waiting vs polling · RU активное ожидание против опроса · ZH 忙等待与轮询

MPICH's blocking ``Recv`` busy-polls: a rank that waits for a message keeps
its core at 100 %.  With more ranks than cores (4 ranks on a 2-core laptop)
the waiting ranks take CPU time from the ranks that compute.
:class:`minipar.comm.TracedComm` waits by ``Test()``, yielding the core, and
after ``SPIN_S`` sleeps with a doubling back-off up to ``MINIPAR_POLL_MAX_S``.

The experiment: rank 0 does a fixed amount of NumPy work (``--work``
matrix products of 256 x 256 float64), then sends one message to every other
rank; ranks 1..N-1 wait for it.  In mode ``mpi`` they wait in MPI's blocking
``Recv``; in mode ``traced`` in TracedComm's ``Recv``.  Reported per mode:
rank 0's compute wall time (s) and the waiting ranks' CPU time
(``time.process_time``, s, summed over ranks 1..N-1).  For reference, the
same work on a single rank (nobody waiting).  The modes
alternate ``--repeat`` times; each figure is the median.  A progress bar on
stderr counts the rounds of both launches (:mod:`minipar.progress`).
"""

from __future__ import annotations

import json
import statistics
import sys
import time

from minipar.cli.options import ArgumentParser, integer, seconds

PROG = "minipar bench wait"
MODES = ("mpi", "traced")


def _parser() -> ArgumentParser:
    p = ArgumentParser(prog=PROG, description=__doc__.split("\n")[0])
    p.add_argument("-n", "--ranks", type=integer(2), default=4,
                   help="number of ranks, >= 2 (default 4)")
    p.add_argument("--work", type=integer(1), default=150,
                   help="256x256 float64 matrix products rank 0 computes (default 150)")
    p.add_argument("--repeat", type=integer(1), default=3, help="rounds of each mode (default 3)")
    p.add_argument("--json", action="store_true", help="print JSON instead of a table")
    p.add_argument("--timeout", type=seconds, default=600.0,
                   help="seconds before every rank of a launch is killed (default 600)")
    p.add_argument("--debug", action="store_true", help="on failure, show every rank's output")
    return p


def compute(work: int) -> float:
    """The fixed NumPy work; returns its wall time in seconds."""
    import numpy as np

    rng = np.random.default_rng(0)
    a = rng.standard_normal((256, 256)) / 16.0
    b = rng.standard_normal((256, 256)) / 16.0
    t0 = time.perf_counter()
    for _ in range(work):
        a = np.tanh(a @ b)
    return time.perf_counter() - t0


def worker(o: dict) -> dict | None:
    """Rank side: ``o["repeat"]`` rounds of each mode; the medians on rank 0."""
    import numpy as np
    from mpi4py import MPI

    from minipar.comm import TracedComm

    world = MPI.COMM_WORLD
    comm = TracedComm(world)
    rank, n = world.Get_rank(), world.Get_size()
    from minipar.progress import tick

    results: dict[str, list[tuple[float, float]]] = {m: [] for m in MODES}
    msg = np.zeros(1)
    for _ in range(o["repeat"]):
        for mode in MODES:
            world.Barrier()
            if rank == 0:
                wall = compute(o["work"])
                for r in range(1, n):
                    world.Send(msg, dest=r, tag=1)
                cpu = 0.0
            else:
                c0 = time.process_time()
                if mode == "mpi":
                    world.Recv(msg, source=0, tag=1)  # MPICH: busy-polls the core
                else:
                    comm.Recv(msg, source=0, tag=1)  # Test(), yield, sleep with back-off
                cpu, wall = time.process_time() - c0, 0.0
            wall = world.reduce(wall, op=MPI.MAX, root=0)
            cpu = world.reduce(cpu, op=MPI.SUM, root=0)
            if rank == 0:
                results[mode].append((wall, cpu))
        if rank == 0:
            tick(o.get("progress"))
    if rank != 0:
        return None
    out = {m: {"compute_wall_s": statistics.median(w for w, _ in v),
               "waiters_cpu_s": statistics.median(c for _, c in v)} for m, v in results.items()}
    return {"ranks": n, "work": o["work"], **out}


def format_table(res: dict) -> str:
    n, alone = res["ranks"], res["alone_wall_s"]
    title = (f"# minipar bench wait: {n} ranks; rank 0 computes {res['work']} matmuls "
             f"256x256, ranks 1..{n - 1} wait for it (medians of {res['repeat']} rounds)")
    head = (f"{'waiting with':<28} {'rank 0 compute (s)':>19} {'waiters CPU (s)':>16} "
            f"{'CPU / compute':>14}")
    lines = [title, head]
    label = {"mpi": "MPI blocking Recv (before)", "traced": "TracedComm polling (after)"}
    for m in MODES:
        w, c = res[m]["compute_wall_s"], res[m]["waiters_cpu_s"]
        lines.append(f"{label[m]:<28} {w:>19.3f} {c:>16.3f} {c / w:>14.2f}")
    lines.append(f"{'reference: 1 rank, no waiter':<28} {alone:>19.3f} {'-':>16} {'-':>14}")
    return "\n".join(lines)


def main(argv: list[str]) -> int:
    from minipar import launch

    args = _parser().parse_args(argv)
    from minipar.progress import watched

    runs = {}
    try:  # one bar over both launches: a step per round of each
        with watched(2 * args.repeat, "round") as progress:
            o = {"work": args.work, "repeat": args.repeat, "progress": progress}
            for n in (1, args.ranks):  # 1 rank: the reference, same environment, nobody waits
                runs[n], _ = launch.run_json(n, "minipar.bench.wait", o, timeout=args.timeout,
                                             check=True)
    except launch.LaunchError as e:  # any failure of the launch
        return launch.report(PROG, e, args.debug)
    res = runs[args.ranks]
    res.update(alone_wall_s=runs[1]["mpi"]["compute_wall_s"], repeat=args.repeat)
    print(json.dumps(res) if args.json else format_table(res))
    return 0


if __name__ == "__main__":
    from minipar import launch

    if launch.is_worker(sys.argv[1:]):
        sys.exit(launch.serve(worker, sys.argv[1:]))
    sys.exit(main(sys.argv[1:]))
