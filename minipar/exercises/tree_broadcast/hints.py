"""Hints for tree_broadcast, one level at a time (``minipar exercise hint tree_broadcast``)."""

HINTS = (
    """Count ranks from the root: vr = (r - root) % N, so the root is 0, and go back to
real ranks with (v + root) % N.  Every rank receives ONCE (except the root),
then forwards to the ranks below it in the tree.  Receive into
y = np.empty_like(x): never into x.""",
    """In a binomial tree the number of ranks holding the data doubles each round:
a rank sends to the rank 2^k further on.  Your parent is vr with its lowest
set bit cleared; your children are vr + 2^j for the powers of two below your
lowest set bit (the root: below the highest power of two < N), those < N.""",
    """The loops.
    mask = 1
    while mask < N:                       # 1. receive once
        if vr & mask:
            comm.Recv(y, source=(vr - mask + root) % N); break
        mask <<= 1
    mask >>= 1                            # 2. forward, biggest jump first
    while mask > 0:
        if vr + mask < N: comm.Send(y, dest=(vr + mask + root) % N)
        mask >>= 1
N = 8: round 1: 0 -> 4; round 2: 0 -> 2, 4 -> 6; round 3: 0 -> 1, 2 -> 3, 4 -> 5, 6 -> 7.""",
)
