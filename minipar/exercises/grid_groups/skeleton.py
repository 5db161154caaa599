"""Exercise: the process grid of hybrid parallelism, built by you from comm.Split.

EN process grid · RU сетка процессов · ZH 进程网格

Grade it (8 ranks: 2x2x2, 1x2x4, 4x1x2, ... every grid of 8):

    minipar exercise check grid_groups grid_groups.py -n 8

THE SETTING (Narayanan et al. 2021, Megatron-LM / PTD-P, arXiv 2104.04473, §3)
    Hybrid ("3D") parallelism runs several techniques at once: each rank
    holds one tensor-parallel shard (tp) of one pipeline stage (pp) of one
    context slice (cp) of one data-parallel replica (dp).  The N = dp·pp·cp·tp
    ranks are laid out as a 4-D array, outermost axis first:

        rank = ((d·pp + p)·cp + c)·tp + t        0 <= d < dp, 0 <= p < pp, ...

    tp innermost: tensor-parallel ranks are ADJACENT (in real life one
    server's fast links, since tp talks in every layer); dp outermost (it
    talks once a step).  8 ranks as dp 2 x pp 2 x tp 2 (cp 1):

                      pp stage 0        pp stage 1
                     tp 0    tp 1      tp 0    tp 1
        dp replica 0 [ 0 ]---[ 1 ] ==> [ 2 ]---[ 3 ]
        dp replica 1 [ 4 ]---[ 5 ] ==> [ 6 ]---[ 7 ]

        rank 5: dp 1, pp 0, cp 0, tp 1
                tp group [4, 5], pp group [5, 7], dp group [1, 5], cp group [5]

    An axis's GROUP is the ranks that differ from you only in that axis's
    coordinate (they share all the others).  The tensor-parallel all-reduce
    runs over your tp group, the gradient all-reduce over your dp group, the
    pipeline passes activations along your pp group: each needs its own
    communicator.

THE GOAL
    grid_groups(comm, dp, pp, tp, cp) -> (coords, comms)
      coords: {"dp": d, "pp": p, "cp": c, "tp": t}, this rank's coordinates;
      comms:  {"dp": ..., "pp": ..., "cp": ..., "tp": ...}, one communicator
              per axis, holding exactly your group, made with comm.Split.

    comm.Split(color, key) is COLLECTIVE: every rank calls it, and ranks
    that pass the same colour end up in one new communicator, ordered by
    key.  So for each axis: the colour must be the same for exactly the
    ranks of one group, and the key must make your rank in the new
    communicator equal your coordinate on the axis.

WHAT THE GRADER MEASURES (on every grid dp x pp x cp x tp of the N ranks)
    * Your coordinates, against minipar's Layout (minipar.comm.topology).
    * For each axis: the communicator's size, the world ranks it holds, in
      order (your rank in it = your coordinate), and that an all-reduce
      over it sums exactly your group's ranks.
    * No messages at all: the coordinates are arithmetic on your rank; the
      groups need comm.Split alone (no comm.Send, no allgather).
    * A wrong grid is named: colour and key swapped, tp outermost instead
      of innermost, a group over the wrong axis, one colour for two axes,
      Split called in a different order (or not at all) on some ranks.

WHICH MPI CALLS TO USE
    comm.Get_rank(), comm.Get_size()
    comm.Split(color, key)  -> a new communicator (call it on EVERY rank, for
                               the axes in the same order)
    Stuck?  minipar exercise hint grid_groups   (level 1, 2, 3)
"""

# ruff: noqa: F841  (the names set up below are yours to use)
from __future__ import annotations

AXES = ("dp", "pp", "cp", "tp")  # outermost first


def grid_groups(comm, dp: int, pp: int, tp: int, cp: int = 1):
    """(coords, comms): this rank's coordinates and its group's communicator on each axis."""
    sizes = {"dp": dp, "pp": pp, "cp": cp, "tp": tp}
    rank = comm.Get_rank()
    coords: dict = {}
    comms: dict = {}

    # TODO 1: coords -- your digits in the mixed radix (dp, pp, cp, tp), tp the fastest

    # TODO 2: comms -- for a in AXES (the same order on every rank): one comm.Split whose
    #         colour names your group on axis a and whose key is your coordinate on it

    raise NotImplementedError("TODO: coordinates, then one comm.Split per axis")


# -- the grader calls this on every rank: leave it as it is -----------------------------------
def run_grid(comm, x, **case):
    """Grade ``grid_groups`` on this rank: coordinates and groups against minipar's Layout."""
    from minipar.exercises.grid_groups.grader import run_grid as grade

    return grade(grid_groups, comm, x, **case)
