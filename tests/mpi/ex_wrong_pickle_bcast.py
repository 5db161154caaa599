"""Wrong on purpose: a 'tree broadcast' that calls mpi4py's pickle-based bcast."""


def tree_broadcast(comm, x, root=0):
    return comm.bcast(x.copy() if comm.Get_rank() == root else None, root=root)
