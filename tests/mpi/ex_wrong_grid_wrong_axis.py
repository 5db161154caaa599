"""Wrong on purpose: the pp and tp communicators handed back under each other's names."""

AXES = ("dp", "pp", "cp", "tp")


def grid_groups(comm, dp, pp, tp, cp=1):
    sizes = {"dp": dp, "pp": pp, "cp": cp, "tp": tp}
    rank = comm.Get_rank()
    stride = {"tp": 1, "cp": tp, "pp": cp * tp, "dp": pp * cp * tp}
    coords = {a: (rank // stride[a]) % sizes[a] for a in AXES}
    comms = {a: comm.Split(rank - coords[a] * stride[a], coords[a]) for a in AXES}
    comms["pp"], comms["tp"] = comms["tp"], comms["pp"]
    return coords, comms


def run_grid(comm, x, **case):
    from minipar.exercises.grid_groups.grader import run_grid as grade

    return grade(grid_groups, comm, x, **case)
