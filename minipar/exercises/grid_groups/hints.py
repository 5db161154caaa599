"""Hints for grid_groups, one level at a time (``minipar exercise hint grid_groups``)."""

HINTS = (
    """Two separate things.  Coordinates: your rank written in the mixed radix
(dp, pp, cp, tp), like the digits of a number, tp the last (fastest) digit.
Groups: a group on axis a is the ranks that agree with you on every OTHER
coordinate, so the colour must be something all of them share and no one
else has; the key must order them by their coordinate on a.""",
    """Coordinates: t = rank % tp, then rank //= tp; c = rank % cp, rank //= cp;
p = rank % pp; d = rank // pp.  A colour for axis a: the rank of the group's
first member, i.e. your rank with your a-coordinate set to 0.  Moving one step
along axis a changes the rank by a's stride: 1 for tp, tp for cp, cp·tp for
pp, pp·cp·tp for dp.  Call Split in ONE fixed loop over dp, pp, cp, tp: the
k-th Split of every rank is the same collective call.""",
    """Step by step:
    stride = {"tp": 1, "cp": tp, "pp": cp * tp, "dp": pp * cp * tp}
    coords[a] = (rank // stride[a]) % sizes[a]          for a in AXES
    for a in AXES:
        color = rank - coords[a] * stride[a]            # my group's first rank
        comms[a] = comm.Split(color, coords[a])         # key: my coordinate
    return coords, comms
Not Split(coords[a], color): that groups the ranks with YOUR coordinate on
a (every other axis varies), the colour and key swapped.""",
)
