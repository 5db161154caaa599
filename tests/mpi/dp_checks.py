"""All data-parallel checks for one world size, in one launch (tests/test_data_parallel.py).

Every rank runs every case; rank 0 gathers and prints one line
``DP-RESULT {json}`` that the test asserts on:

* bad input raises ValueError on every rank, before any message;
* the non-blocking ring all-reduce (several in flight at once, lengths 0, 1,
  N-1, N+1, 1001) against MPI's Allreduce, bit-identical across ranks, bytes
  equal to the ring formula;
* DDP for several bucket sizes / algorithms / overlap on or off: losses and
  final parameters against the serial run (computed on every rank), bytes
  sent per step against the exact per-bucket ring formula, timelines;
* DDP with the default ``algorithm="auto"``: 4 KiB buckets (all recursive
  doubling here), one bucket, and 4 KiB buckets with auto's switch lowered to
  8,704 bytes (``ring_min_bytes``) so that on 3+ ranks some buckets run the
  overlapped ring and others blocking recursive doubling in the same step;
* DDP on a mixture of experts (4 experts, top-2, tokens dropped at capacity factor 1.0):
  against the serial run that routes the same groups (each rank's rows,
  ``serial_reference(spec, N)``), and, to show why, against the full-batch run.
"""

from __future__ import annotations

import json

import numpy as np
from mpi4py import MPI

from minipar.collectives.cost import allreduce_bytes, ring_allreduce_bytes
from minipar.collectives.nonblocking import TAG_BASE, BlockingAllreduceRequest, iallreduce
from minipar.comm import TracedComm
from minipar.comm.topology import Grid
from minipar.parallel import loop
from minipar.parallel.common import RunSpec, serial_reference
from minipar.parallel.data_parallel.engine import DataParallel
from minipar.parallel.data_parallel.measure import bytes_formula

grid = Grid(TracedComm(MPI.COMM_WORLD), dp=MPI.COMM_WORLD.Get_size())
comm = grid.comm("dp")
N, R = comm.size, comm.rank
SPEC = RunSpec(batch=10, steps=4, seq=8, vocab=10, d_model=16, layers=2, heads=2, lr=1e-2)
out: dict = {"N": N, "errors": {}, "nonblocking": [], "dp": []}

# -- bad input: ValueError on every rank, before any communication ----------------
bad = {
    "bucket0": lambda: DataParallel(grid, SPEC, bucket_bytes=0),
    "bucket-neg": lambda: DataParallel(grid, SPEC, bucket_bytes=-5),
    "algorithm": lambda: DataParallel(grid, SPEC, algorithm="tree"),
    "too-many-ranks": lambda: DataParallel(grid, SPEC.with_(batch=N - 1 if N > 1 else 0)),
    "ring-min-0": lambda: DataParallel(grid, SPEC, ring_min_bytes=0),
    "ring-min-not-auto": lambda: DataParallel(grid, SPEC, algorithm="ring", ring_min_bytes=64),
}
for name, make in bad.items():
    before = comm.stats.msgs_sent()
    try:
        make()
        out["errors"][name] = None
    except ValueError as e:
        out["errors"][name] = [str(e), comm.stats.msgs_sent() - before]

# -- the non-blocking ring, several in flight, against MPI's Allreduce ---------------
rng = np.random.default_rng(100 + R)
lengths = sorted({0, 1, max(N - 1, 0), N + 1, 1001})
bufs = [rng.standard_normal(n) for n in lengths]
refs = []
for b in bufs:
    ref = np.empty_like(b)
    MPI.COMM_WORLD.Allreduce(b, ref, MPI.SUM)
    refs.append(ref)
comm.stats.reset()
reqs = [iallreduce(comm, b, TAG_BASE + i, name=f"nb{i}") for i, b in enumerate(bufs)]
while not all(r.progress() for r in reversed(reqs)):
    pass
for i, (n, b, ref) in enumerate(zip(lengths, bufs, refs)):
    everyone = MPI.COMM_WORLD.allgather(b)
    out["nonblocking"].append({
        "n": n, "close": bool(np.allclose(b, ref, rtol=1e-13, atol=1e-13)),
        "identical": all(np.array_equal(b, e) for e in everyone),
        "sent": comm.stats.bytes_sent(f"nb{i}"), "recv": comm.stats.bytes_recv(f"nb{i}"),
        "formula": list(ring_allreduce_bytes(n, 8, N, R))})

# -- a blocking all-reduce behind the request interface (DDP's small buckets) -------------
out["blocking"] = []
for algo in ("recursive_doubling", "tree"):
    b = rng.standard_normal(1001)
    ref = np.empty_like(b)
    MPI.COMM_WORLD.Allreduce(b, ref, MPI.SUM)
    req = BlockingAllreduceRequest(comm, b, algo, name=f"blocking-{algo}")
    out["blocking"].append({
        "algorithm": algo, "done": req.done and req.progress() and req.wait() is b,
        "close": bool(np.allclose(b, ref, rtol=1e-13, atol=1e-13)),
        "identical": all(np.array_equal(b, e) for e in MPI.COMM_WORLD.allgather(b)),
        "sent": comm.stats.bytes_sent(f"blocking-{algo}"),
        "formula": allreduce_bytes(1001, 8, N, R, algo)[0]})

# -- DDP against the serial run ----------------------------------------------------------
serial = serial_reference(SPEC)
cases = [("tiny", 1, "ring", True), ("medium", 4096, "ring", True), ("all", 1 << 30, "ring", True),
         ("medium-no-overlap", 4096, "ring", False), ("mpi", 4096, "mpi", True)]
for label, bucket, algo, overlap in cases:
    dp = DataParallel(grid, SPEC, bucket_bytes=bucket, algorithm=algo, overlap=overlap)
    comm.stats.reset()
    losses = loop.train(dp, dp.spec.batch_at, dp.spec.steps).losses
    params = MPI.COMM_WORLD.allgather(dp.states.params)
    out["dp"].append({
        "label": label, "buckets": len(dp.buckets),
        "bucket_sizes": [b.size for b in dp.buckets],
        "first_bucket": list(dp.buckets[0].names), "last_bucket": list(dp.buckets[-1].names),
        "losses": losses, "serial_losses": serial["losses"],
        "params": dp.states.params.tolist(), "serial_params": serial["params"].tolist(),
        "replicas_identical": all(np.array_equal(dp.states.params, p) for p in params),
        "sent_per_step": dp.bytes_sent_per_step(), "formula": bytes_formula(dp),
        "S": dp.layout.size * dp.itemsize, "msgs": comm.stats.msgs_sent("dp_grad_allreduce"),
        "peers": sorted(comm.stats.peers_sent("dp_grad_allreduce")),
        "timeline": dp.timelines[-1].as_dict(),
    })

# -- the default, auto: per bucket by size and N (ring_min_bytes moves the switch) ---------
out["auto"] = []
for label, bucket, ring_min in (("auto", 4096, None), ("auto-one-bucket", 1 << 30, None),
                                ("auto-both-kinds", 4096, 8704)):
    dp = DataParallel(grid, SPEC, bucket_bytes=bucket, ring_min_bytes=ring_min)
    comm.stats.reset()
    losses = loop.train(dp, dp.spec.batch_at, dp.spec.steps).losses
    params = MPI.COMM_WORLD.allgather(dp.states.params)
    out["auto"].append({
        "label": label, "algorithm": dp.algorithm, "bucket_sizes": [b.size for b in dp.buckets],
        "bucket_algorithms": dp.bucket_algorithms,
        "losses": losses, "serial_losses": serial["losses"],
        "params": dp.states.params.tolist(), "serial_params": serial["params"].tolist(),
        "replicas_identical": all(np.array_equal(dp.states.params, p) for p in params),
        "sent_per_step": dp.bytes_sent_per_step(), "formula": bytes_formula(dp),
        "loss_sent": comm.stats.bytes_sent("dp_loss_allreduce") / SPEC.steps,
        "timeline": dp.timelines[-1].as_dict()})

# -- SGD with momentum: parity as well; mixed precision: bytes of 16-bit grads, 16 bytes/param --
sgd = SPEC.with_(optimizer="sgd", weight_decay=0.0, lr=0.05)
dp = DataParallel(grid, sgd, bucket_bytes=4096)
out["sgd"] = {"losses": loop.train(dp, sgd.batch_at, sgd.steps).losses,
              "params": dp.states.params.tolist(),
              "serial_losses": serial_reference(sgd)["losses"],
              "serial_params": serial_reference(sgd)["params"].tolist()}
dp = DataParallel(grid, SPEC.with_(precision="mixed"), bucket_bytes=4096, algorithm="ring")
comm.stats.reset()
loop.train(dp, SPEC.batch_at, SPEC.steps)
params = MPI.COMM_WORLD.allgather(dp.states.params.view(np.uint16))
out["mixed"] = {"sent_per_step": dp.bytes_sent_per_step(), "formula": bytes_formula(dp),
                "itemsize": dp.itemsize, "psi": dp.layout.size,
                "model_state_bytes": sum(dp.states.bytes_by_category().values()),
                "replicas_identical": all(np.array_equal(params[0], p) for p in params)}

# -- a mixture of experts: the aux loss and its gradient go through the same walk ----------
moe = SPEC.with_(experts=4, top_k=2, capacity_factor=1.0)
dp = DataParallel(grid, moe, bucket_bytes=4096)
losses = loop.train(dp, dp.spec.batch_at, dp.spec.steps).losses
grouped, full = serial_reference(moe, N), serial_reference(moe)
x, _ = moe.local_batch(0, R, N)
_, cache = moe.model().forward(moe.initial_params(), x)  # this rank's step-0 routing
params = MPI.COMM_WORLD.allgather(dp.states.params)
out["moe"] = {"losses": losses, "params": dp.states.params.tolist(),
              "serial_losses": grouped["losses"], "serial_params": grouped["params"].tolist(),
              "full_batch_diff": float(np.abs(dp.states.params - full["params"]).max()),
              "dropped": sum(s["dropped"] for s in moe.model().moe_stats(cache)),
              "aux_loss": sum(s["aux_loss"] for s in moe.model().moe_stats(cache)),
              "replicas_identical": all(np.array_equal(dp.states.params, p) for p in params)}

# -- ranks that reduce buffers of different lengths: a clear error on each, no hang ----
if N == 2:
    comm.Barrier()
    try:
        iallreduce(comm, np.ones(10 + 2 * R), TAG_BASE + 999).wait()
        out["mismatch"] = None
    except ValueError as e:
        out["mismatch"] = str(e)

gathered = MPI.COMM_WORLD.gather(out, root=0)
if R == 0:
    print("DP-RESULT " + json.dumps(gathered), flush=True)
