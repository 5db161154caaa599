"""All parameter-server checks for one world size, in one launch (tests/test_parameter_server.py).

Every rank runs every case; rank 0 prints ``PS-RESULT {json}`` with what all
ranks measured: bad input (ValueError on every rank, no message sent), the
synchronous run with one server and with two (sharded) servers, asynchronous
with staleness 0, a run of two servers resumed on the serial engine and then
on one server (``state_dict`` -> ``load_state_dict``: any layout resumes any
other), and, with the argument ``converge``, asynchronous with
staleness 2 and a straggler over 60 steps next to the synchronous run.
"""

from __future__ import annotations

import json
import sys

import numpy as np
from mpi4py import MPI

from minipar.comm import TracedComm
from minipar.comm.topology import Grid
from minipar.optim import FlatParams
from minipar.parallel import loop, strategies
from minipar.parallel.common import RunSpec, serial_reference
from minipar.parallel.data_parallel.ps_engine import ParameterServer
from minipar.parallel.engine import State

grid = Grid(TracedComm(MPI.COMM_WORLD), dp=MPI.COMM_WORLD.Get_size())
comm = grid.comm("dp")
N, R = comm.size, comm.rank


def copy_state(st: State) -> State:
    return State({k: (sh, np.array(a, copy=True)) for k, (sh, a) in st.arrays.items()},
                 dict(st.scalars))


SPEC = RunSpec(batch=10, steps=4, seq=8, vocab=10, d_model=16, layers=2, heads=2, lr=1e-2)
out: dict = {"N": N, "rank": R, "errors": {}, "cases": []}

bad = {
    "servers0": lambda: ParameterServer(grid, SPEC, servers=0),
    "no-worker": lambda: ParameterServer(grid, SPEC, servers=N),
    "mode": lambda: ParameterServer(grid, SPEC, mode="bogus"),
    "staleness": lambda: ParameterServer(grid, SPEC, mode="async", staleness=-1),
    "too-many-ranks": lambda: ParameterServer(grid, SPEC.with_(batch=N - 2 if N > 2 else 0)),
    "fp16": lambda: ParameterServer(grid, SPEC.with_(precision="mixed-fp16")),
}
for name, make in bad.items():
    before = comm.stats.msgs_sent()
    try:
        make()
        out["errors"][name] = None
    except ValueError as e:
        out["errors"][name] = [str(e), comm.stats.msgs_sent() - before]


def case(label: str, spec: RunSpec, **kw: object) -> None:
    ps = ParameterServer(grid, spec, **kw)
    comm.stats.reset()
    history = loop.train(ps, spec.batch_at, spec.steps)
    st = comm.stats
    losses = ps.pushed_losses()  # per step, on the servers (async: the loop's are NaN)
    if ps.mode == "sync":  # the loop's losses: the global loss on every rank, server 0's sums
        assert history.losses == MPI.COMM_WORLD.bcast(losses, root=0), history.losses
    out["cases"].append({
        "label": label, "server": ps.is_server, "losses": losses,
        "shard": ps.states.params.tolist() if ps.is_server else None,
        "span": list(ps.spans[R]) if ps.is_server else None,
        "worker_params": None if ps.is_server else ps.params.tolist(),
        "push_sent": st.bytes_sent("ps_push"), "push_recv": st.bytes_recv("ps_push"),
        "pull_sent": st.bytes_sent("ps_pull"), "pull_recv": st.bytes_recv("ps_pull"),
        "peers_sent": sorted(st.peers_sent()), "S": ps.layout.size * 8,
        "workers": ps.workers, "servers": ps.servers, "max_delay": ps.max_delay,
        "memory": ps.model_state_bytes(),
    })


case("sync-1", SPEC)
if N >= 3:
    case("sync-2servers", SPEC, servers=2)
case("async-s0", SPEC, mode="async", staleness=0)
if N >= 3:
    case("async-s0-2servers", SPEC, servers=2, mode="async", staleness=0)
if N >= 3:  # resume on another layout: 2 servers -> the serial engine -> 1 server
    two = ParameterServer(grid, SPEC, servers=2)
    loop.train(two, SPEC.batch_at, 2)
    states = MPI.COMM_WORLD.allgather(two.state_dict())  # pickled copies of every rank's
    serial = strategies.build("serial", SPEC)
    serial.load_state_dict([st for st in states if all(sh.replica == 0 for sh, _ in
                                                       st.arrays.values())])
    one = ParameterServer(grid, SPEC, servers=1)
    one.load_state_dict(copy_state(serial.state_dict()))
    runs = {"two": two, "serial": serial, "one": one}
    resumed = {k: loop.train(e, SPEC.batch_at, SPEC.steps, start=2).losses for k, e in runs.items()}
    out["resume"] = {"losses": resumed, "steps": {k: e.state_dict().scalars["step"]
                                                  for k, e in runs.items()},
                     "params": {k: FlatParams.like(p := e.full_params()).flatten(p).tolist()
                                for k, e in runs.items()}}
if "converge" in sys.argv[1:]:
    slow = SPEC.with_(steps=80, batch=16, vocab=5, d_model=32, lr=3e-3, weight_decay=0.0)
    case("converge-sync", slow, straggler_s=0.002)
    case("converge-async-s2", slow, mode="async", staleness=2, straggler_s=0.002)
    if R == 0:
        ref = serial_reference(slow)
        out["converge_serial_losses"], out["converge_serial_params"] = ref["losses"], ref["params"].tolist()
if R == 0:
    s = serial_reference(SPEC)
    out["serial_losses"], out["serial_params"] = s["losses"], s["params"].tolist()

gathered = MPI.COMM_WORLD.gather(out, root=0)
if R == 0:
    print("PS-RESULT " + json.dumps(gathered), flush=True)
