"""Wrong on purpose: hands the work to minipar's own ring all-reduce (the answer key)."""


def ring_allreduce(comm, x):
    from minipar.collectives import ring_allreduce as theirs

    return theirs(comm, x)
