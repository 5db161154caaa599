"""Wrong on purpose: a rank alone on an axis skips its Split (the others wait for it)."""

from mpi4py import MPI

AXES = ("dp", "pp", "cp", "tp")


def grid_groups(comm, dp, pp, tp, cp=1):
    sizes = {"dp": dp, "pp": pp, "cp": cp, "tp": tp}
    rank = comm.Get_rank()
    stride = {"tp": 1, "cp": tp, "pp": cp * tp, "dp": pp * cp * tp}
    coords = {a: (rank // stride[a]) % sizes[a] for a in AXES}
    comms = {}
    for a in AXES:
        if sizes[a] == 1 and rank == 0:  # "I am alone on this axis, no need to split"
            comms[a] = MPI.COMM_SELF
            continue
        comms[a] = comm.Split(rank - coords[a] * stride[a], coords[a])
    return coords, comms


def run_grid(comm, x, **case):
    from minipar.exercises.grid_groups.grader import run_grid as grade

    return grade(grid_groups, comm, x, **case)
