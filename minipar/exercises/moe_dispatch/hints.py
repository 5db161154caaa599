"""Hints for moe_dispatch, one level at a time (``minipar exercise hint moe_dispatch``)."""

HINTS = (
    """Three steps.  Dispatch: rank s needs the rows of YOUR buffer that belong to
ITS experts, x[s*k:(s+1)*k] with k = E // N: an all-to-all, one block to each
rank.  Experts: run each of your k experts on the rows all N ranks sent you.
Combine: the reverse all-to-all, each rank's outputs back to the rank whose
tokens they are.  Your own block never travels: copy it.""",
    """Build the all-to-all from N-1 pairwise steps: at step t = 1 .. N-1 send to
dest = (r + t) % N and receive from src = (r - t) % N in ONE comm.Sendrecv:
every rank sends and receives at every step, so nobody waits for ever (a loop
of blocking comm.Send to every rank first deadlocks once the blocks are large:
MPI holds a large message until its receive is posted).  Keep what arrives
by source: got[src], an array (k, C, d).  Slices x[a:b] along the first axis
are contiguous, so you can send and receive them directly.""",
    """The indices.  k = E // N, got = [np.empty((k, C, d)) for s in range(N)].
Dispatch: got[r][:] = x[r*k:(r+1)*k]; step t: Sendrecv(x[dest*k:(dest+1)*k],
dest=dest, recvbuf=got[src], source=src).
Experts: for i in range(k): y = expert(r*k + i, np.concatenate([got[s][i] for
s in range(N)])); row block s*C:(s+1)*C of y is rank s's: done[s][i] = it.
Combine: out = np.empty_like(x); out[r*k:(r+1)*k] = done[r]; step t:
Sendrecv(done[dest], dest=dest, recvbuf=out[src*k:(src+1)*k], source=src).
Return out.""",
)
