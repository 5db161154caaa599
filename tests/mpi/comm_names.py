"""TracedComm on N ranks: named communicators, one Stats, Free, traced() once, counted once.

Prints ``COMM-NAMES-OK N=<N>`` on rank 0 when every assertion held.
"""

import numpy as np
from mpi4py import MPI

import minipar.collectives as C
from minipar.comm import TracedComm
from minipar.comm.traced import traced

world = TracedComm()
n, r = world.size, world.rank
s = world.stats
assert world.name == "world" and TracedComm(MPI.COMM_WORLD, name="w").name == "w"

# Split / Dup: named children sharing the parent's one Stats; MPI knows the name too
tp = world.Split(color=r // 2, key=r, name="tp")
dp = world.Split(color=r % 2, key=r, name="dp")
anon, dup = world.Split(), world.Dup()
assert (tp.name, dp.name, anon.name, dup.name) == ("tp", "dp", "world/split2", "world/dup3")
assert tp.comm.Get_name() == "tp" and dup.comm.Get_name() == "world/dup3"
assert tp.stats is dp.stats is anon.stats is dup.stats is s
inner, inner2 = dup.Split(name="inner"), dup.Split()
assert inner.stats is s and inner.name == "inner" and inner2.name == "world/dup3/split1"

# counters by communicator: the same operation name on two communicators, kept apart
x = np.arange(4 * n, dtype=np.float64)
s.reset()
for c in (world, tp, dp):
    C.ring_allreduce(c, x)
formula = {c.name: C.ring_allreduce_bytes(x.size, 8, c.size, c.rank) for c in (world, tp, dp)}
want = {name: sent for name, (sent, _) in formula.items()}
got = s.bytes_sent_by_comm()
assert {k: v for k, v in got.items() if v} == {k: v for k, v in want.items() if v}, (got, want)
for name, (sent, recv) in formula.items():
    assert s.bytes_sent("ring_allreduce", comm=name) == sent
    assert s.bytes_recv(comm=name) == recv and s.bytes_recv_by_comm().get(name, 0) == recv
assert s.bytes_sent("ring_allreduce") == sum(want.values())  # the old call: all communicators
assert s.bytes_sent(comm="nowhere") == 0 and s.bytes_sent("nothing", comm="tp") == 0
assert s.as_dict()["bytes_sent_by_comm"] == got
assert s.ops["ring_allreduce"].calls == sum(c.size > 1 for c in (world, tp, dp))  # (1 rank: no-op)
assert n == 1 or s.seconds("ring_allreduce", comm="world") > 0

# a request waited (and tested) twice is counted once; its status stays the message's
s.reset()
right, left = (r + 1) % n, (r - 1) % n
buf = np.empty(3, np.int32)
rq = world.Irecv(buf, left, 11)
sq = world.Isend(np.full(3, r, np.int32), right, 11)
rq.Wait()
rq.Wait()
world.waitall([rq, sq, rq])
assert rq.Test() and sq.Test()
assert s.bytes_recv() == 12 and s.msgs_recv() == 1 and s.peers_recv() == {world.world_ranks[left]: 12}
assert rq.status.Get_count(MPI.BYTE) == 12 and rq.status.Get_source() == left
assert buf.tolist() == [left] * 3

# traced(plain): one wrapper per communicator, so counters accumulate across calls
plain = MPI.COMM_WORLD.Dup()
t = traced(plain)
assert traced(plain) is t and traced(MPI.Comm(plain)) is t and traced(t) is t
s2 = t.stats
C.ring_allreduce(plain, x)
C.ring_allreduce(plain, x)
assert s2.bytes_sent("ring_allreduce") == 2 * C.ring_allreduce_bytes(x.size, 8, n, r)[0]
assert traced(MPI.COMM_WORLD) is traced(None) is traced(MPI.COMM_WORLD)
assert traced(plain, timeout=5) is not t  # options: a new wrapper, on purpose
t.Free()  # frees the communicator (and the cached wrapper with it)
assert plain == MPI.COMM_NULL
again = MPI.COMM_WORLD.Dup()
assert traced(again) is not t and traced(again).stats.bytes_sent() == 0
again.Free()

# Free: children are freed; the world wrapper leaves COMM_WORLD alone
for c in (tp, dp, anon, dup, inner, inner2):
    c.Free()
    assert c.comm == MPI.COMM_NULL
    c.Free()  # a second Free does nothing
world.Free()
assert world.comm == MPI.COMM_WORLD
world.Barrier()
if r == 0:
    print(f"COMM-NAMES-OK N={n}")
