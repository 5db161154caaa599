"""topology.Grid on N ranks: every factorisation N = dp·pp·cp·tp (and every ep), for real.

For each grid it checks, through the communicators MPI actually built:

* my coordinates follow rank = ((d·pp + p)·cp + c)·tp + t;
* each axis's communicator holds exactly the ranks that differ from me only
  on that axis (ep / edp: the blocks of the dp·cp ranks), my rank in it is my
  coordinate, and ``grid.ranks(axis)`` says the same;
* an all-reduce on each axis touches exactly its group (the sum of 2^rank
  over the group; peers only inside it) and its bytes are counted on that
  axis alone, equal to minipar.collectives.cost's formula for the group;
* pipeline neighbours, and a message on ``pp_p2p`` counted there, not on pp;
* bad sizes raise the same ValueError on every rank, with zero bytes sent.

Rank 0 prints ``TOPO-GRID <json>`` (every rank's coordinates and groups) for
the grids the test compares with hand-written tables, ``TOPO-BAD <json>``
(the error messages) and ``TOPO-SUMMARY N=.. grids=.. checks=.. failures=..``.
"""

import json
import sys
from pathlib import Path

import numpy as np
from mpi4py import MPI

sys.path.insert(0, str(Path(__file__).parent))
from mpi_checks import Checks

from minipar import collectives as C
from minipar.comm import TracedComm
from minipar.comm.topology import AXES, COMM_NAMES, EXPERT_AXES, Grid

raw = MPI.COMM_WORLD  # MPI's own collectives: the test's uncounted channel
world = TracedComm(raw, name="world")
N, R = world.size, world.rank
c = Checks("TOPO")
HAND = {(2, 2, 1, 2, 1), (1, 2, 1, 4, 1), (2, 1, 1, 2, 1), (4, 1, 1, 2, 2)}


def divisors(k: int) -> list[int]:
    return [d for d in range(1, k + 1) if k % d == 0]


def shapes(n: int) -> list[tuple[int, int, int, int]]:
    return [(d, p, c, n // (d * p * c)) for d in divisors(n) for p in divisors(n // d)
            for c in divisors(n // (d * p))]


# which coordinates a group's members share with me (grid axes: all the others)
SAME = {a: [b for b in AXES if b != a] for a in AXES}
SAME["ep"], SAME["edp"] = ["pp", "tp", "edp"], ["pp", "tp", "ep"]

grids = 0
for dp, pp, cp, tp in shapes(N):
    for ep in divisors(dp * cp):
        shape = (dp, pp, cp, tp, ep)
        grid = Grid(world, dp=dp, pp=pp, tp=tp, cp=cp, ep=ep)
        grids += 1
        co = {a: grid.coord(a) for a in AXES + EXPERT_AXES}
        c.check(R == ((co["dp"] * pp + co["pp"]) * cp + co["cp"]) * tp + co["tp"], f"{shape}: {co}")
        e = co["dp"] * cp + co["cp"]
        c.check((co["ep"], co["edp"]) == (e % ep, e // ep), f"{shape}: ep/edp {co}")
        everyone = raw.allgather(co)
        sizes = {"dp": dp, "pp": pp, "cp": cp, "tp": tp, "ep": ep, "edp": dp * cp // ep}
        groups = {}
        for axis in AXES + EXPERT_AXES:
            sub = grid.comm(axis)
            members = list(sub.world_ranks)  # from MPI's own group: what was really built
            groups[axis] = members
            what = f"{shape} {axis}: group {members}"
            c.check(sub.name == axis and grid.size(axis) == sub.size == sizes[axis], what)
            c.check(sub.rank == co[axis] and members == grid.ranks(axis), what)
            c.check([everyone[m][axis] for m in members] == list(range(sizes[axis])), what)
            c.check(all(everyone[m][k] == co[k] for m in members for k in SAME[axis]), what)
        p2p = grid.comm("pp_p2p")
        c.check(list(p2p.world_ranks) == groups["pp"] and p2p.rank == co["pp"], f"{shape}: pp_p2p")
        prev_ = co["pp"] - 1 if co["pp"] > 0 else None
        next_ = co["pp"] + 1 if co["pp"] < pp - 1 else None
        c.check((grid.prev_stage, grid.next_stage) == (prev_, next_), f"{shape}: neighbours")

        # one all-reduce per axis: only the group's ranks contribute, bytes land on that axis
        for axis in AXES + EXPERT_AXES:
            world.stats.reset()
            got = C.allreduce(grid.comm(axis), np.full(3, 1 << R, dtype=np.int64))
            want = sum(1 << m for m in groups[axis])
            c.check(bool((got == want).all()), f"{shape} {axis}: all-reduce {got} != {want}")
            c.check(set(world.stats.peers_sent()) <= set(groups[axis]) - {R},
                  f"{shape} {axis}: sent to {world.stats.peers_sent()} outside {groups[axis]}")
            sent = C.allreduce_bytes_sent(3, 8, sizes[axis], co[axis])
            expect = {name: (sent if name == axis else 0) for name in COMM_NAMES}
            c.check(grid.bytes_by_axis() == expect, f"{shape} {axis}: {grid.bytes_by_axis()} != "
                  f"{expect}")
        # pipeline traffic on its own communicator: send my rank to the next stage
        world.stats.reset()
        token = np.array([R], dtype=np.int64)
        reqs = [grid.p2p.Isend(token, grid.next_stage, tag=7)] if next_ is not None else []
        if prev_ is not None:
            box = np.empty(1, np.int64)
            grid.p2p.Recv(box, grid.prev_stage, tag=7)
            c.check(int(box[0]) == groups["pp"][prev_], f"{shape}: from the previous stage")
        grid.p2p.waitall(reqs)
        by_axis = grid.bytes_by_axis()
        c.check(by_axis["pp_p2p"] == (8 if next_ is not None else 0) and by_axis["pp"] == 0,
              f"{shape}: pipeline bytes {by_axis}")

        table = raw.gather({"rank": R, "coords": co, "groups": groups,
                            "prev": grid.prev_stage, "next": grid.next_stage})
        if R == 0 and shape in HAND:
            print("TOPO-GRID " + json.dumps({"shape": shape, "ranks": table}), flush=True)
        if R == 0 and shape == (2, 2, 1, 2, 1):
            print(grid.describe(), flush=True)
        grid.free()
        try:
            grid.comm("tp")
            c.check(False, f"{shape}: a freed grid still hands out communicators")
        except ValueError:
            pass

# bad sizes: rejected on every rank, identically, before any message
BAD = [{"dp": N + 1}, {"dp": 0}, {"tp": -1}, {"pp": 2.0}, {"dp": N, "ep": N + 1}]
if N == 4:
    BAD.append({"dp": 3})
messages = []
for kwargs in BAD:
    world.stats.reset()
    try:
        Grid(world, **kwargs)
        messages.append(None)
    except ValueError as exc:
        messages.append(str(exc))
    c.check(world.stats.bytes_sent() == 0 and world.stats.msgs_sent() == 0, f"bad {kwargs}: sent")
everyone = raw.gather(messages)
if R == 0:
    c.check(all(m == messages for m in everyone), f"bad sizes: messages differ between ranks "
          f"{everyone}")
    print("TOPO-BAD " + json.dumps({"kwargs": [{k: str(v) for k, v in kw.items()} for kw in BAD],
                                    "messages": messages}), flush=True)

# hosts: this machine is one host (MPI's shared-memory split); node=K simulates hosts of K
# consecutive ranks, and an all-reduce's bytes split into inside a host and across hosts
g = Grid(world, dp=N)
c.check(g.hosts == [0] * N and len(g.host_names) == 1 and g.ranks_per_node == N,
        f"one machine: {g.hosts} {g.host_names}")
g.free()
for k in divisors(N):
    g = Grid(world, dp=N, node=k)
    c.check(g.hosts == [r // k for r in range(N)] and g.ranks_per_node == k
            and g.host_names == [f"node {i}" for i in range(N // k)], f"node={k}: {g.hosts}")
    c.check(g.inside_host("dp") == (k == N), f"node={k}: dp inside a host")
    world.stats.reset()
    C.allreduce(g.comm("dp"), np.ones(5))
    split = g.bytes_by_axis_hosts()["dp"]
    mine = set(range(R // k * k, R // k * k + k))
    inter = sum(b for p, b in world.stats.peers_sent().items() if p not in mine)
    c.check(split == {"intra": g.bytes_by_axis()["dp"] - inter, "inter": inter},
            f"node={k}: {split}, across hosts {inter}")
    c.check(g.placement().splitlines()[0] == "node 0: ranks " + ", ".join(map(str, range(k))),
            f"node={k}: {g.placement()}")
    g.free()
if N > 1:
    try:
        Grid(world, dp=N, node=N + 1)
        c.check(False, "node not dividing the ranks was accepted")
    except ValueError as exc:
        c.check(str(exc) == f"node = {N + 1} ranks per node must divide the {N} ranks", str(exc))

c.summary(grids=grids)
