"""TracedComm's counters on N ranks: per operation, per peer, Split, reset, Probe.

Prints ``COMM-COUNTERS-OK N=<N>`` on rank 0 when every assertion held.
"""

import numpy as np
from mpi4py import MPI

from minipar.comm import TracedComm

comm = TracedComm(MPI.COMM_WORLD)
n, r = comm.size, comm.rank
right, left = (r + 1) % n, (r - 1) % n
s = comm.stats

# per operation and per peer: 3 messages of 80 bytes to the right, "shift" scope
x, y = np.arange(10, dtype=np.float64), np.empty(10)
with comm.operation("shift"):
    for _ in range(3):
        with comm.operation("inner"):  # the outermost scope wins
            comm.Sendrecv(x, right, 5, y, left, 5)
assert s.bytes_sent("shift") == s.bytes_recv("shift") == 3 * 80, s.as_dict()
assert s.msgs_sent("shift") == s.msgs_recv("shift") == 3
assert s.bytes_sent("inner") == 0 and s.ops["shift"].calls == 1
assert s.peers_sent("shift") == {right: 240} and s.peers_recv("shift") == {left: 240}
assert s.seconds("shift") > 0.0

# outside any scope: "p2p"; a receive counts the bytes that arrived, not the buffer size
if r == 0 and n > 1:
    comm.Send(np.ones(3, np.float32), 1, tag=9)
elif r == 1:
    st = comm.Probe(0, 9)
    assert st.Get_count(MPI.BYTE) == 12
    comm.Recv(np.empty(8, np.float32), 0, 9)
    assert s.bytes_recv("p2p") == 12 and s.peers_recv("p2p") == {0: 12}

# a sub-communicator from Split shares the parent's Stats; peers are world ranks
half = comm.Split(color=r % 2, key=r)
assert half.stats is s
before = s.bytes_sent()
if half.size > 1:
    with half.operation("sub"):
        half.Sendrecv(x, (half.rank + 1) % half.size, 0, y, (half.rank - 1) % half.size, 0)
    world_right = half.world_ranks[(half.rank + 1) % half.size]
    assert world_right % 2 == r % 2
    assert s.peers_sent("sub") == {world_right: 80}
    assert s.bytes_sent() == before + 80
comm.Barrier()

# reset clears everything
s.reset()
assert s.bytes_sent() == s.bytes_recv() == s.msgs_sent() == 0 and s.peers_sent() == {}
if r == 0:
    print(f"COMM-COUNTERS-OK N={n}")
