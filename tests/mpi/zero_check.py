"""ZeRO on N ranks, all stages in one launch: float64 parity, mixed-precision memory and bytes.

Rank 0 prints one line ``ZERO_CHECK {json}`` that tests/test_zero.py judges (and
``prefetch``: ZeRO-3 prefetching, K = 1, 2, resharding after forward or not):
per stage, parity with the serial run (float64, the default ``allreduce="auto"``;
stages 1-3 also on a mixture of experts, against the serial run of the same
routing groups) and, for stage 0, every rank's bytes next to auto's exact
figure; and per rank the model-state bytes (ledger by category, tracemalloc),
the gathered parameters stage 3 held at most and after the steps, bytes sent
per step and shard sizes (mixed precision and stage 0 on the ring: the paper's
setting).
"""

from __future__ import annotations

import json

import numpy as np
from mpi4py import MPI

from minipar.comm import TracedComm
from minipar.comm.topology import Grid
from minipar.parallel.common import RunSpec, loss_weight, max_abs_diff, parity, serial_reference
from minipar.parallel.zero.engine import STAGES, ZeRO
from minipar.parallel.zero.measure import (
    engine_exact_bytes,
    exact_bytes_sent,
    hpz_secondary_elements,
    measure_stage,
    step_bytes,
    zeropp_exact_bytes,
    zeropp_measured,
)
from minipar.parallel.zero.oracle import zeropp_reference
from minipar.parallel.zero.shard import unit_table

#: parity: a tiny GPT, 3 AdamW steps, 10 rows (uneven on 3 and 4 ranks)
PARITY = RunSpec(vocab=10, seq=8, d_model=16, layers=2, heads=2, batch=10, steps=3)
#: a mixture of experts: 4 experts, top-2, tokens dropped at capacity factor 1.0
MOE = PARITY.with_(experts=4, top_k=2, capacity_factor=1.0)
#: memory: Ψ of ~50 thousand so the model states dominate the engine's bookkeeping
MEMORY = RunSpec(vocab=16, seq=8, d_model=32, layers=4, heads=2, batch=8, steps=1,
                 precision="mixed")

comm = TracedComm(MPI.COMM_WORLD)
grid = Grid(comm, dp=comm.size)
out: dict = {"world": comm.size, "parity": {}, "moe_parity": {}, "gqa_parity": {}, "memory": {},
             "auto": [], "refused": [], "prefetch": {}, "zeropp": {}}
#: grouped-query attention (4 heads, 1 key/value head): ZeRO shards the smaller w_qkv alike
GQA = PARITY.with_(heads=4, kv_heads=1)
for spec, key, stages in ((PARITY, "parity", STAGES), (MOE, "moe_parity", (1, 2, 3)),
                          (GQA, "gqa_parity", (0, 1, 3))):
    serial = serial_reference(spec, comm.size) if comm.rank == 0 else None
    for stage in stages:
        m = measure_stage(grid, spec, stage)
        losses = m["losses"]  # the global losses, the same on every rank
        final = m["engine"].layout.flatten(m["engine"].full_params())
        if key == "parity" and stage == 3:
            blocking_final = final  # what prefetching must give, bit for bit
        if key == "parity" and stage == 0:  # the default all-reduce: auto, exact bytes
            rows = comm.comm.gather({"sent": m["bytes_sent_per_step"],
                                     "exact": m["bytes_exact_per_step"],
                                     "grad_allreduce": m["grad_allreduce"],
                                     "psi": m["engine"].layout.size,
                                     "itemsize": m["engine"].grads.itemsize})
            out["auto"] = rows if comm.rank == 0 else None
        if comm.rank == 0:
            out[key][stage] = {
                "ok": parity(losses, serial["losses"], final, serial["params"]),
                "max_param_diff": max_abs_diff(final, serial["params"]),
                "max_loss_diff": max_abs_diff(losses, serial["losses"]),
            }
# ZeRO-3 prefetching K units ahead, resharding after forward or not: parity, the bytes of
# the blocking form (each rank: sent and exact), the gathered peak against its formula
serial = serial_reference(PARITY, comm.size) if comm.rank == 0 else None
for k, reshard, remat in ((1, True, None), (2, True, None), (1, False, None), (2, False, None),
                          (0, False, None), (2, True, 1)):
    extra = {} if remat is None else {"remat": remat}  # remat: a unit fetched twice
    m = measure_stage(grid, PARITY, 3, prefetch=k, reshard_after_forward=reshard, **extra)
    eng = m["engine"]
    final = eng.layout.flatten(eng.full_params())
    blocking = exact_bytes_sent(eng.layout.size, comm.size, comm.rank, 3,
                                eng.policy.param_dtype.itemsize, eng.allreduce)
    keys = ("bytes_sent_per_step", "bytes_exact_per_step", "peak_gathered_bytes",
            "gathered_after_steps", "peak_gathered_formula_bytes")
    hooks = eng.zero_hooks
    rows = comm.comm.gather({k2: m[k2] for k2 in keys}
                            | {"blocking_exact": blocking, "inflight": len(hooks.inflight),
                               "pending": len(hooks.pending)})
    if comm.rank == 0:
        out["prefetch"][f"{k},{reshard}" + (",remat" if remat else "")] = {
            "ok": parity(m["losses"], serial["losses"], final, serial["params"]),
            "max_param_diff": max_abs_diff(final, serial["params"]), "ranks": rows,
            "as_blocking": final.tobytes() == blocking_final.tobytes()}
for stage in STAGES:
    m = measure_stage(grid, MEMORY, stage, allreduce="ring")  # the paper's stage 0
    row = {k: m[k] for k in ("ledger", "tracemalloc_bytes", "bytes_sent_per_step", "shard",
                             "step_peak_bytes", "held_after_steps_bytes",
                             "bytes_exact_per_step", "grad_allreduce")}
    row["psi"] = m["engine"].layout.size
    hooks = m["engine"].hooks  # what stage 3 held gathered: at most, and after the steps
    row["peak_gathered_bytes"], row["gathered_after_steps"] = (hooks.peak_gathered_bytes,
                                                               len(hooks.gathered))
    row["unit_sizes"] = [hi - lo for _, lo, hi, _ in unit_table(MEMORY.config("bfloat16"))]
    rows = comm.comm.gather(row)
    if comm.rank == 0:
        out["memory"][stage] = rows
# ZeRO++ (qwZ, hpZ, qgZ) in nodes of K ranks (two nodes of 2 on 4 ranks, nodes of 1 on 2
# and 3: the cross-node hop alone): bit for bit its serial arithmetic, the distance from the
# unquantized serial run, bytes per rank (all, inside, across the node) against the exact
# figure, hpZ's secondary slices against Ψ/K
node = 2 if comm.size == 4 else 1
zgrid = Grid(comm, dp=comm.size, node=node)
for parts, k, remat in ((("qwz",), 0, None), (("hpz",), 0, None), (("qgz",), 0, None),
                        (("qwz", "hpz", "qgz"), 0, None), (("qwz", "hpz", "qgz"), 2, None),
                        (("qwz", "hpz", "qgz"), 1, 1)):  # remat: the first walk learnt
    eng = ZeRO(zgrid, PARITY, stage=3, zeropp=parts, prefetch=k, remat=remat)
    eng.step(PARITY.batch_at(0))  # first-use caches; then the measured steps
    eng.close()
    eng = ZeRO(zgrid, PARITY, stage=3, zeropp=parts, prefetch=k, remat=remat)
    ws = comm.world_ranks
    before = (step_bytes(comm.stats), zeropp_measured(comm.stats, zgrid.hosts, ws, comm.rank, 1))
    losses = [eng.step(PARITY.batch_at(s)).loss for s in range(PARITY.steps)]
    after = (step_bytes(comm.stats), zeropp_measured(comm.stats, zgrid.hosts, ws, comm.rank, 1))
    final = eng.layout.flatten(eng.full_params())
    spans = [(a, b) for _, a, b, _ in unit_table(PARITY.config())]
    block = eng.zero_hooks.block
    fetches = [eng._learned.count(u.name) for u in eng.units] if remat else None
    row = {"sent": (after[0] - before[0]) / PARITY.steps, "exact": engine_exact_bytes(eng),
           **{w: (after[1][w] - before[1][w]) / PARITY.steps for w in ("intra", "inter")},
           "exact_split": zeropp_exact_bytes(spans, comm.size, node, comm.rank, parts, block, 8,
                                             fetches=fetches),
           "zero3": zeropp_exact_bytes(spans, comm.size, node, comm.rank, (), block, 8,
                                       fetches=fetches),
           "secondary": eng.zero_hooks.peak_secondary_bytes,
           "secondary_formula": 8 * hpz_secondary_elements(eng.layout.size, node,
                                                           comm.rank % node),
           "idle": (len(eng.zero_hooks.inflight), len(eng.zero_hooks.pending))}
    rows = comm.comm.gather(row)
    eng.close()
    if comm.rank == 0:
        ref = zeropp_reference(PARITY, comm.size, parts, node, block)
        out["zeropp"]["+".join(parts) + (f",prefetch {k}" if k else "")
                       + (f",remat {remat}" if remat else "")] = {
            "bitwise": final.tobytes() == ref["params"].tobytes() and losses == ref["losses"],
            "from_serial": max_abs_diff(final, serial["params"]), "node": node,
            "psi": eng.layout.size, "ranks": rows}
zgrid.free()
# mixed-fp16 loss scaling: a scale at which a few gradients overflow; the inf lands in
# some ranks' shards only, and every rank must still skip the step (found_inf agreed)
fp16 = PARITY.with_(precision="mixed-fp16", steps=1)
x, y = fp16.local_batch(0, comm.rank, comm.size)
w = loss_weight(fp16.batch, comm.rank, comm.size)
init32 = {k: v.astype(np.float32) for k, v in fp16.initial_params().items()}
_, g = fp16.with_(precision="float32").model().loss_and_grads(init32, x, y, w)
gmax = comm.comm.allreduce(max(float(np.abs(v).max()) for v in g.values()), op=MPI.MAX)
out["fp16_skip"] = {}
for stage in (1, 2, 3):
    eng = ZeRO(grid, fp16, stage=stage)
    before = eng.layout.flatten(eng.full_params())
    eng.states.scaler.scale = 65504.0 / (0.5 * gmax)  # the same on every rank
    with np.errstate(over="ignore", invalid="ignore"):
        said = eng.step(fp16.batch_at(0)).skipped  # the StepResult says so too
    row = (eng.states.scaler.skipped if said else 0, bool(eng.states.local_found_inf()),
           before.tobytes() == eng.layout.flatten(eng.full_params()).tobytes())
    rows = comm.comm.gather(row)
    if comm.rank == 0:
        out["fp16_skip"][stage] = rows
# refused on every rank before any message, in one line: a grid with another axis, a
# batch with fewer rows than ranks
bad = []
if comm.size > 1:
    tp_grid = Grid(comm, tp=comm.size)
    bad.append((tp_grid, PARITY))
bad.append((grid, PARITY.with_(batch=comm.size - 1) if comm.size > 1 else None))
for g, spec in bad:
    if spec is None:
        continue
    sent = comm.stats.bytes_sent()
    try:
        ZeRO(g, spec, stage=1)
        out["refused"].append("built")
    except ValueError as e:
        out["refused"].append(str(e) if comm.stats.bytes_sent() == sent else "sent")
if comm.size > 1:
    tp_grid.free()
if comm.rank == 0:
    print("ZERO_CHECK " + json.dumps(out), flush=True)
