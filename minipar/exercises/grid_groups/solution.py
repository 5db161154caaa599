"""Reference solution: the process grid's coordinates and one sub-communicator per axis.

EN process grid from Split · RU сетка процессов через Split · ZH 用 Split 构建进程网格

Megatron-LM's rank order (Narayanan et al. 2021, arXiv 2104.04473, §3;
picotron's ``arange(N).view(dp, pp, cp, tp)``), outermost axis first::

    rank = ((d·pp + p)·cp + c)·tp + t

so the coordinates are the rank's digits in the mixed radix (dp, pp, cp, tp),
tp the fastest.  An axis's group is the ranks that differ from me only on
that axis: they share every other coordinate, so the rank with my
coordinates and 0 on the axis, ``rank - coord·stride``, names the group (the
Split colour); my coordinate orders it (the key), so my rank in the new
communicator is my coordinate.  Every rank splits for the axes in the same
order: ``comm.Split`` is collective, the k-th call of every rank is one call.
Self-contained on purpose (no :mod:`minipar.comm.topology`): this is what the
learner writes; the grader checks it against that module's ``Layout``.
"""

from __future__ import annotations

AXES = ("dp", "pp", "cp", "tp")  # outermost first


def grid_groups(comm, dp: int, pp: int, tp: int, cp: int = 1):
    """(coords, comms): this rank's coordinates and its group's communicator on each axis."""
    sizes = {"dp": dp, "pp": pp, "cp": cp, "tp": tp}
    rank = comm.Get_rank()
    coords, rest = {}, rank
    for a in reversed(AXES):  # peel the digits off, tp (the fastest) first
        rest, coords[a] = divmod(rest, sizes[a])
    coords = {a: coords[a] for a in AXES}
    comms = {}
    stride = 1
    strides = {}
    for a in reversed(AXES):  # tp's stride is 1, cp's is tp, pp's cp·tp, dp's pp·cp·tp
        strides[a], stride = stride, stride * sizes[a]
    for a in AXES:  # the same order on every rank
        color = rank - coords[a] * strides[a]  # my group's first rank
        comms[a] = comm.Split(color, coords[a])
    return coords, comms


# -- the grader calls this on every rank (as in the skeleton) -----------------------------------
def run_grid(comm, x, **case):
    """Grade ``grid_groups`` on this rank: coordinates and groups against minipar's Layout."""
    from minipar.exercises.grid_groups.grader import run_grid as grade

    return grade(grid_groups, comm, x, **case)
