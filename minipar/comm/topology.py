"""The rank grid: N ranks reshaped into dp x pp x cp x tp, one communicator per axis.

EN process grid (device mesh) · RU сетка процессов (топология рангов) · ZH 进程网格（设备网格）

Hybrid ("3D") parallelism runs several techniques at once: every rank holds
one tensor-parallel shard (tp) of one pipeline stage (pp) of one context /
sequence slice (cp) of one data-parallel replica (dp).  The world of
N = dp·pp·cp·tp ranks is reshaped into a 4-D array, outermost axis first::

    rank = ((d·pp + p)·cp + c)·tp + t        0 <= d < dp, 0 <= p < pp, ...

so tensor-parallel ranks are *adjacent* (in real life: inside one server,
on the fast links, since tp talks in every layer), then context, then the
pipeline stages, and data parallelism is outermost (it talks once a step).
This is Megatron-LM's order (Narayanan et al. 2021, arXiv 2104.04473, §3)
and picotron's ``process_group_manager.py`` (``arange(N).view(dp, pp, cp, tp)``).

8 ranks as dp 2 x pp 2 x tp 2 (cp 1)::

                  pp stage 0        pp stage 1
                 tp 0    tp 1      tp 0    tp 1
    dp replica 0 [ 0 ]---[ 1 ] ==> [ 2 ]---[ 3 ]       --- tp group (a row's pair)
                   |       |         |       |         ==> pp neighbours (stage 0 -> 1)
    dp replica 1 [ 4 ]---[ 5 ] ==> [ 6 ]---[ 7 ]        |  dp group (a column)

    rank 5: dp 1, pp 0, tp 1;  tp group [4, 5], pp group [5, 7], dp group [1, 5]

A *group* of an axis is the ranks that differ from me only in that axis's
coordinate; every group of one axis has ``size(axis)`` ranks and the groups
partition the world.  Each axis gets its own sub-communicator (MPI
``Comm_Split`` with the group as colour and the coordinate as key, so my rank
in it *is* my coordinate), named after the axis and sharing the world's
:class:`~minipar.comm.traced.Stats`: :meth:`Grid.bytes_by_axis` then says
"tp sent X bytes, dp sent Y".  Pipeline point-to-point traffic (activations
forward, gradients backward) gets a communicator of its own, ``pp_p2p``, so a
pending ``Isend`` of an activation never meets a collective of the ``pp`` axis.

**Expert parallelism** reuses the data-parallel ranks (DeepSpeed-MoE,
Rajbhandari et al. 2022, arXiv 2201.05596; Megatron counts dp·cp): the
e = d·cp + c index of the dp·cp ranks that share (pp, tp) is cut into blocks
of ``ep`` consecutive ranks.  ``ep`` group: my block (experts are spread over
it, tokens travel by all-to-all); ``edp`` group (expert data parallel): the
ranks holding the same experts in the other blocks (expert gradients are
averaged there).  ``ep`` must divide dp·cp.

**Hosts.**  Which ranks share a machine (a *node*) is MPI's own knowledge:
``Split_type(COMM_TYPE_SHARED)`` splits the ranks into those that can share
memory (MPI 4.1 §7.4.2), one group per node (:func:`hosts_of`).  ``node=K``
overrides it, to simulate nodes of K consecutive ranks on one machine.  The
grid then says where each rank runs (``grid.hosts``, ``grid.host_names``), whether
a group of an axis stays inside a host (:meth:`Grid.inside_host`: tp does when
its t adjacent ranks fit in a node, Megatron's placement), and the bytes each
axis sent inside a host and across hosts (:meth:`Grid.bytes_by_axis_hosts`).

Errors: sizes that are not positive integers, a product that is not the
world size, ``ep`` not dividing dp·cp raise ``ValueError`` naming the
numbers, on every rank (every rank checks the same sizes against the same
world size), before any message.

    grid = Grid(MPI.COMM_WORLD, dp=2, pp=2, tp=2)
    grid.coord("tp"), grid.size("pp"), grid.ranks("dp")     # 1, 2, [1, 5] on rank 5
    ring_allreduce(grid.comm("tp"), x)                       # sums over my tp pair only
    grid.next_stage                                          # rank in grid.comm("pp"), or None
    grid.bytes_by_axis()                                     # {"dp": 0, "tp": 96, ...}
    grid.hosts, grid.inside_host("tp")                       # [0, 0, 1, 1, ...], True
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from minipar import checks
from minipar.comm.traced import TracedComm

#: the grid's own axes, outermost first (tp innermost: adjacent ranks)
AXES: tuple[str, ...] = ("dp", "pp", "cp", "tp")
#: expert parallelism, carved out of the dp·cp ranks
EXPERT_AXES: tuple[str, ...] = ("ep", "edp")
#: every communicator a Grid makes, by name: the axes, then pipeline point-to-point
COMM_NAMES: tuple[str, ...] = AXES + EXPERT_AXES + ("pp_p2p",)


def _positive(name: str, value: Any) -> int:
    return checks.integer(f"Grid: {name}", value, 1)


@dataclass(frozen=True)
class Layout:
    """The pure arithmetic of a grid (no MPI): coordinates and groups of every rank."""

    dp: int = 1
    pp: int = 1
    cp: int = 1
    tp: int = 1
    ep: int = 1

    @classmethod
    def check(cls, world: int, dp: Any = 1, pp: Any = 1, tp: Any = 1, cp: Any = 1,
              ep: Any = 1) -> Layout:
        """The layout of ``world`` ranks, or ``ValueError`` naming the sizes that do not fit."""
        sizes = {k: _positive(k, v) for k, v in
                 (("dp", dp), ("pp", pp), ("cp", cp), ("tp", tp), ("ep", ep))}
        lay = cls(**sizes)
        if lay.world != world:
            raise ValueError(
                f"Grid: dp·pp·cp·tp = {lay.dp}·{lay.pp}·{lay.cp}·{lay.tp} = {lay.world} must "
                f"equal the number of ranks, {world}; choose sizes whose product is {world}")
        if (lay.dp * lay.cp) % lay.ep:
            raise ValueError(
                f"Grid: ep = {lay.ep} must divide dp·cp = {lay.dp}·{lay.cp} = {lay.dp * lay.cp} "
                "(expert parallelism reuses the data-parallel ranks, as in DeepSpeed-MoE)")
        return lay

    @property
    def world(self) -> int:
        return self.dp * self.pp * self.cp * self.tp

    def size(self, axis: str) -> int:
        """Ranks in one group of ``axis`` (``edp`` = dp·cp / ep)."""
        if axis == "edp":
            return self.dp * self.cp // self.ep
        if axis not in AXES + ("ep",):
            raise ValueError(f"unknown grid axis {axis!r}; one of {', '.join(AXES + EXPERT_AXES)}")
        return int(getattr(self, axis))

    def rank_of(self, dp: int = 0, pp: int = 0, cp: int = 0, tp: int = 0) -> int:
        """The rank at these coordinates: ((d·pp + p)·cp + c)·tp + t."""
        return ((dp * self.pp + pp) * self.cp + cp) * self.tp + tp

    def coords(self, rank: int) -> dict[str, int]:
        """Every coordinate of ``rank``: dp, pp, cp, tp, then ep and edp."""
        if not 0 <= rank < self.world:
            raise ValueError(f"rank {rank} is outside the grid's ranks 0..{self.world - 1}")
        d, rest = divmod(rank, self.pp * self.cp * self.tp)
        p, rest = divmod(rest, self.cp * self.tp)
        c, t = divmod(rest, self.tp)
        e = d * self.cp + c  # index among the dp·cp ranks that share (pp, tp)
        return {"dp": d, "pp": p, "cp": c, "tp": t, "ep": e % self.ep, "edp": e // self.ep}

    def ranks(self, rank: int, axis: str) -> list[int]:
        """The ranks of ``rank``'s group on ``axis``, ordered by their coordinate on it."""
        co = self.coords(rank)
        n = self.size(axis)
        if axis in AXES:
            base = {a: co[a] for a in AXES}
            return [self.rank_of(**{**base, axis: i}) for i in range(n)]
        if axis == "ep":  # my block of ep consecutive dp·cp indices
            es = [co["edp"] * self.ep + i for i in range(n)]
        else:  # edp: the same place in every block
            es = [co["ep"] + j * self.ep for j in range(n)]
        return [self.rank_of(dp=e // self.cp, cp=e % self.cp, pp=co["pp"], tp=co["tp"])
                for e in es]

    def table(self, me: int | None = None) -> str:
        """Every rank's coordinates, one line each (``me`` marked with '*')."""
        head = (f"grid of {self.world} ranks = dp {self.dp} x pp {self.pp} x cp {self.cp} "
                f"x tp {self.tp}; experts: ep {self.ep} x edp {self.size('edp')} over dp·cp")
        lines = [head, " rank | dp pp cp tp | ep edp"]
        for r in range(self.world):
            co = self.coords(r)
            mark = "*" if r == me else " "
            lines.append(f"{mark}{r:>4} | " + " ".join(f"{co[a]:>2}" for a in AXES)
                         + f" | {co['ep']:>2} {co['edp']:>3}")
        return "\n".join(lines)


def hosts_of(comm: Any, node: int | None = None) -> tuple[list[int], list[str]]:
    """The host of every rank of ``comm`` (0, 1, ... in the order of each host's first rank)
    and each host's name (collective; nothing counted).

    The ranks of a host are those MPI's ``Split_type(COMM_TYPE_SHARED)`` puts together
    (they can share memory: one node), the name that of its first rank's processor.
    ``node=K`` simulates nodes of K consecutive ranks instead, named ``node 0``, ...
    (``ValueError`` unless K divides the number of ranks, on every rank alike)."""
    from mpi4py import MPI

    comm = getattr(comm, "comm", comm)  # a TracedComm's own: these messages are not counted
    n = comm.Get_size()
    if node is not None:
        k = checks.integer("node (ranks per node)", node, 1)
        if n % k:
            raise ValueError(f"node = {k} ranks per node must divide the {n} ranks")
        return [r // k for r in range(n)], [f"node {i}" for i in range(n // k)]
    shared = comm.Split_type(MPI.COMM_TYPE_SHARED, key=comm.Get_rank())
    try:
        first = shared.allreduce(comm.Get_rank(), op=MPI.MIN)  # the host's first rank
    finally:
        shared.Free()
    every = comm.allgather((first, MPI.Get_processor_name()))
    order = sorted({f for f, _ in every})
    return [order.index(f) for f, _ in every], [every[f][1] for f in order]


class Grid:
    """``comm``'s ranks as a dp x pp x cp x tp grid, with one communicator per axis.

    ``comm`` is an mpi4py communicator or a :class:`TracedComm` (default
    COMM_WORLD); ranks below are ranks of ``comm``.  Making a grid is
    collective: every rank of ``comm`` calls it with the same sizes.
    """

    def __init__(self, comm: Any = None, dp: int = 1, pp: int = 1, tp: int = 1, cp: int = 1,
                 ep: int = 1, node: int | None = None) -> None:
        if comm is None:
            from mpi4py import MPI

            comm = MPI.COMM_WORLD
        # checked against the world size, known locally: every rank raises alike, no message sent
        self.layout = Layout.check(comm.Get_size(), dp=dp, pp=pp, tp=tp, cp=cp, ep=ep)
        self.world: TracedComm = (comm if isinstance(comm, TracedComm)
                                  else TracedComm(comm, name="world"))
        self.rank: int = self.world.rank
        #: the host of each rank, and each host's name (:func:`hosts_of`)
        self.hosts, self.host_names = hosts_of(self.world, node)
        #: ranks on this rank's host
        self.ranks_per_node: int = self.hosts.count(self.hosts[self.rank])
        self._coords = self.layout.coords(self.rank)
        self._groups = {a: self.layout.ranks(self.rank, a) for a in AXES + EXPERT_AXES}
        self._comms: dict[str, TracedComm] = {}
        #: communicators split off an axis's (ZeRO++'s node and cross-node ones): name -> axis
        self.served: dict[str, str] = {}
        for name in COMM_NAMES:  # the same order on every rank: Split is collective
            axis = "pp" if name == "pp_p2p" else name
            group = self._groups[axis]
            self._comms[name] = self.world.Split(color=group[0], key=self._coords[axis],
                                                 name=name)

    # -- where am I --------------------------------------------------------------------
    def coord(self, axis: str) -> int:
        """My coordinate on ``axis`` (= my rank in ``comm(axis)``)."""
        self.layout.size(axis)  # names the axes on a typo
        return self._coords[axis]

    def size(self, axis: str) -> int:
        """Ranks in my group on ``axis``."""
        return self.layout.size(axis)

    def ranks(self, axis: str) -> list[int]:
        """Ranks (of the grid's communicator) in my group on ``axis``, by coordinate."""
        self.layout.size(axis)
        return list(self._groups[axis])

    def comm(self, axis: str) -> TracedComm:
        """The sub-communicator of my group on ``axis`` (or ``"pp_p2p"``, pipeline messages)."""
        if axis not in self._comms:
            raise ValueError(f"no communicator {axis!r} in this grid (freed?); "
                             f"one of {', '.join(COMM_NAMES)}")
        return self._comms[axis]

    @property
    def p2p(self) -> TracedComm:
        """The pipeline's point-to-point communicator (same ranks as ``comm("pp")``)."""
        return self.comm("pp_p2p")

    @property
    def prev_stage(self) -> int | None:
        """The previous pipeline stage, as a rank of ``comm("pp")``; None on the first."""
        p = self._coords["pp"]
        return p - 1 if p > 0 else None

    @property
    def next_stage(self) -> int | None:
        """The next pipeline stage, as a rank of ``comm("pp")``; None on the last."""
        p = self._coords["pp"]
        return p + 1 if p < self.layout.pp - 1 else None

    # -- what did I send -----------------------------------------------------------------
    def serves(self, name: str, axis: str) -> None:
        """Count the bytes of communicator ``name`` (split off ``axis``'s, e.g. ZeRO++'s
        ``zeropp_node``) under ``axis``: every per-axis figure then covers all traffic."""
        self.served[name] = axis

    def _names(self, axis: str) -> list[str]:
        return [axis] + [n for n, a in self.served.items() if a == axis]

    def bytes_by_axis(self) -> dict[str, int]:
        """Bytes this rank sent on each of the grid's communicators (shared Stats), those
        split off an axis (:meth:`serves`) counted under it."""
        stats = self.world.stats
        return {name: sum(stats.bytes_sent(comm=n) for n in self._names(name))
                for name in COMM_NAMES}

    def inside_host(self, axis: str, rank: int | None = None) -> bool:
        """Whether every group of ``axis`` (or only ``rank``'s) lies inside one host."""
        ranks = range(self.layout.world) if rank is None else [rank]
        return all(len({self.hosts[r] for r in self.layout.ranks(q, axis)}) == 1 for q in ranks)

    def bytes_by_axis_hosts(self) -> dict[str, dict[str, int]]:
        """Bytes this rank sent on each communicator to ranks of its own host (``intra``)
        and of other hosts (``inter``): what crossed the network between machines."""
        host = {w: self.hosts[r] for r, w in enumerate(self.world.world_ranks)}
        mine = self.hosts[self.rank]
        out = {}
        for name in COMM_NAMES:
            sent: dict[int, int] = {}
            for n in self._names(name):
                for p, b in self.world.stats.peers_sent_on(n).items():
                    sent[p] = sent.get(p, 0) + b
            inter = sum(b for p, b in sent.items() if host.get(p, -1) != mine)
            out[name] = {"intra": sum(sent.values()) - inter, "inter": inter}
        return out

    def placement(self) -> str:
        """Where the ranks run, one host a line, and which axes stay inside a host."""
        lines = []
        for h, name in enumerate(self.host_names):
            ranks = [r for r, x in enumerate(self.hosts) if x == h]
            lines.append(f"{name}: ranks {', '.join(map(str, ranks))}")
        axes = [a for a in AXES if self.size(a) > 1]
        inside = [a for a in axes if self.inside_host(a)]
        lines.append(("inside a host: " + ", ".join(inside) if inside else "no axis inside a host")
                     + ("; across hosts: " + ", ".join(a for a in axes if a not in inside)
                        if len(inside) < len(axes) else ""))
        return "\n".join(lines)

    def describe(self) -> str:
        """A table of every rank's coordinates, then my groups, for a learner to read."""
        lines = [self.layout.table(me=self.rank), f"rank {self.rank}'s groups:"]
        for a in AXES + EXPERT_AXES:
            lines.append(f"  {a:<3} coord {self._coords[a]} of {self.size(a)}: ranks "
                         f"{self._groups[a]}")
        lines.append(f"  pipeline: prev stage {self.prev_stage}, next stage {self.next_stage}"
                     " (ranks of the pp communicator)")
        return "\n".join(lines)

    def free(self) -> None:
        """Free every sub-communicator (collective; the grid's own ``comm`` stays)."""
        comms, self._comms = self._comms, {}
        for c in comms.values():
            c.Free()

    def __repr__(self) -> str:
        lay = self.layout
        return (f"Grid(dp={lay.dp}, pp={lay.pp}, cp={lay.cp}, tp={lay.tp}, ep={lay.ep}; "
                f"rank {self.rank} at {self._coords})")


def require_grid(grid: Any, who: str, axes: tuple[str, ...], hint: str = "") -> Grid:
    """``grid``, checked to be a :class:`Grid` whose axes outside ``axes`` all have size 1:
    the one sentence every engine refuses a wrong layout with, e.g. ``data parallelism runs
    on a grid of dp only; the grid has tp = 2`` (``hint``: what to use instead)."""
    if not isinstance(grid, Grid):
        raise ValueError(f"{who} runs on a Grid(comm, {', '.join(f'{a}=...' for a in axes)}), "  # noqa: TRY004
                         f"got {grid!r}")
    others = {a: grid.size(a) for a in AXES + ("ep",) if a not in axes and grid.size(a) != 1}
    if others:
        raise ValueError(f"{who} runs on a grid of {' x '.join(axes)} only; the grid has "
                         + ", ".join(f"{a} = {n}" for a, n in others.items())
                         + (f" ({hint})" if hint else ""))
    return grid

