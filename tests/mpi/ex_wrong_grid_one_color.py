"""Wrong on purpose: the cp communicator made with the tp group's colour (copy and paste)."""

AXES = ("dp", "pp", "cp", "tp")


def grid_groups(comm, dp, pp, tp, cp=1):
    sizes = {"dp": dp, "pp": pp, "cp": cp, "tp": tp}
    rank = comm.Get_rank()
    stride = {"tp": 1, "cp": tp, "pp": cp * tp, "dp": pp * cp * tp}
    coords = {a: (rank // stride[a]) % sizes[a] for a in AXES}
    color = {a: rank - coords[a] * stride[a] for a in AXES}
    comms = {}
    comms["dp"] = comm.Split(color["dp"], coords["dp"])
    comms["pp"] = comm.Split(color["pp"], coords["pp"])
    comms["cp"] = comm.Split(color["tp"], coords["cp"])
    comms["tp"] = comm.Split(color["tp"], coords["tp"])
    return coords, comms


def run_grid(comm, x, **case):
    from minipar.exercises.grid_groups.grader import run_grid as grade

    return grade(grid_groups, comm, x, **case)
