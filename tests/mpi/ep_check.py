"""All checks of expert parallelism for one world size, in one launch.

Run by tests/test_expert_parallel.py as ``launch.run(N, this file)``; rank 0
prints ``EP-SUMMARY N=<N> cases=<c> checks=<k> failures=<f>`` and the first
failures, one ``EP-CASE`` line per configuration, and the job exits 1 if any
check failed.

1. bad input first, on a fresh traced communicator: every rank raises the same
   one-line ValueError and not one byte is sent;
2. per configuration (E = 4 and 8 each with top-1 and top-2 at ep = N, capacity
   factors that drop tokens, ep < N, even and uneven rows): several AdamW steps, the
   shared verdict against ``serial_reference(spec, N)`` (float64) is "equal",
   tokens were dropped, and the bytes counted on each grid axis equal the
   formula exactly (and ``minipar.plan.moe``'s figure for top-1, equal C);
3. the state: replica 0 of every rank's ``state_dict`` holds each tensor once, and an
   ep = 1 engine loading every rank's state of an ep = N one goes on like it.
"""

from __future__ import annotations

from mpi4py import MPI

from minipar.comm import TracedComm
from minipar.comm.topology import Grid
from minipar.optim import FlatParams
from minipar.parallel import loop
from minipar.parallel.common import RunSpec, local_rows, serial_reference
from minipar.parallel.expert_parallel.engine import ExpertParallel
from minipar.parallel.expert_parallel.options import check_ep
from minipar.parallel.parity import compare
from minipar.plan.moe import moe_alltoall_bytes_per_rank

world = MPI.COMM_WORLD
N, R = world.size, world.rank
checks = 0
failures: list[str] = []


def check(ok: bool, what: str) -> None:
    global checks
    checks += 1
    if not ok:
        failures.append(f"rank {R}: {what}")


# -- 1. bad input: the same line on every rank, no message --------------------------
fresh = TracedComm(world, name="bad-input")
base = RunSpec(experts=4, batch=8, steps=1)
grid_n = Grid(fresh, dp=N, ep=N)  # a good grid (Split is MPI's own: no counted byte)
bad = [(lambda: check_ep(0, 1, 1.25, 1, N), "--experts must be a positive integer"),
       (lambda: check_ep(4, 5, 1.25, 1, N), "--top-k must be between 1 and --experts 4"),
       (lambda: check_ep(4, 0, 1.25, 1, N), "--top-k must be between 1 and --experts 4"),
       (lambda: check_ep(12, 2, None, 4, 4, 3), "--expert-groups 3 and --ep 4"),
       (lambda: check_ep(4, 1, 0.0, 1, N), "--capacity-factor must be > 0"),
       (lambda: check_ep(4, 1, -1.0, 1, N), "--capacity-factor must be > 0"),
       # ep is the grid's: the Grid refuses an ep not dividing the ranks, check_ep says it so
       (lambda: check_ep(4, 1, 1.25, N + 1, N), f"must divide the {N} data-parallel"),
       (lambda: Grid(fresh, dp=N, ep=N + 1), f"ep = {N + 1} must divide dp·cp = {N}"),
       (lambda: ExpertParallel(grid_n, base.with_(experts=3)) if N > 1 else
        check_ep(3, 1, 1.25, 2, N),
        f"--ep {N} does not divide --experts 3" if N > 1 else "must divide the 1 data-parallel"),
       (lambda: ExpertParallel(grid_n, base, ep=2), "expert parallelism takes no option ep; its options: none"),
       (lambda: ExpertParallel(grid_n, base.with_(routing=(N, 2))),
        f"each of the {N} data-parallel ranks routes its own rows as one group")]
if N == 4:
    bad.append((lambda: check_ep(4, 1, 1.25, 3, 4), "--ep 3 must divide the 4"))
messages = []
for fn, want in bad:
    try:
        fn()
        check(False, f"no error for {want!r}")
    except ValueError as e:
        messages.append(str(e))
        check(want in str(e) and "\n" not in str(e), f"message {e!r} lacks {want!r}")
check(fresh.stats.bytes_sent() == 0, f"bad input sent {fresh.stats.bytes_sent()} bytes")
same = world.allgather(messages)
check(all(m == messages for m in same), f"ranks raised different messages: {same}")
grid_n.free()

# -- 2. parity, drops and bytes ----------------------------------------------------
#: DeepSeek-V3's experts (issue 34): sigmoid, a shared expert, narrow routed experts,
#: loss-free bias, the sequence-wise loss, dropless, node-limited over the ep ranks
V3 = dict(router="sigmoid", shared_experts=1, expert_width=24, load_balance="loss-free",
          bias_update_rate=0.01, seq_aux_loss_coef=0.01)
CASES = [  # (name, ep, experts, top_k, capacity factor, global batch rows, more options)
    ("E4 top1 cf0.75", N, 4, 1, 0.75, 8, {}),
    ("E4 top2 cf1.0", N, 4, 2, 1.0, 8, {}),
    ("E8 top1 cf1.25", N, 8, 1, 1.25, 8, {}),
    ("E8 top2 cf1.0", N, 8, 2, 1.0, 8, {}),
    ("E8 top3 V3 dropless", N, 8, 3, None, 8,
     {**V3, "expert_groups": min(N, 2), "groups_per_token": 1 if N > 1 else 1}),
    ("E8 top2 sigmoid shared2 cf1.0", N, 8, 2, 1.0, 8,
     {"shared_experts": 2, "router": "sigmoid"}),
    ("E4 top1 cf1.0 multi-query attention (K=1)", N, 4, 1, 1.0, 8, {"kv_heads": 1}),
]
if N == 2:
    CASES += [("E4 top2 cf1.25 ep1 (pure DP)", 1, 4, 2, 1.25, 8, {}),
              ("E4 top1 cf1.0 uneven rows", 2, 4, 1, 1.0, 7, {})]
if N == 4:
    CASES += [("E4 top2 cf1.0 ep2 x edp2", 2, 4, 2, 1.0, 8, {}),
              ("E8 top1 cf0.75 ep2 x edp2", 2, 8, 1, 0.75, 8, {}),
              ("E4 top1 cf1.25 uneven rows", 4, 4, 1, 1.25, 10, {}),
              ("E8 top2 V3 dropless ep2 x edp2 G2 M1", 2, 8, 2, None, 10,
               {**V3, "expert_groups": 2, "groups_per_token": 1})]

for name, ep, experts, top_k, cf, batch, more in CASES:
    spec = RunSpec(experts=experts, top_k=top_k, capacity_factor=cf, batch=batch, steps=4,
                   d_model=16, seq=8, **more)
    comm = TracedComm(world, name="world")
    grid = Grid(comm, dp=N, ep=ep)
    eng = ExpertParallel(grid, spec)
    losses = loop.train(eng, spec.batch_at, spec.steps).losses
    init = spec.initial_params()
    flat = FlatParams.like(init).flatten(eng.full_params())
    drops = world.allreduce(sum(s["dropped"] for st in eng.stats for s in st))
    check(drops > 0 if cf is not None else drops == 0, f"{name}: {drops} tokens dropped")
    for bias in eng.bias.arrays.values():  # the same on every rank, and it moved
        check(all((b == bias).all() for b in world.allgather(bias)), f"{name}: bias differs")
        check(abs(bias).max() > 0, f"{name}: the bias never moved")
    check(len(eng.bias.arrays) == (spec.layers if more.get("load_balance") else 0),
          f"{name}: {len(eng.bias.arrays)} biases")
    counted, formula = eng.bytes_by_axis(), eng.bytes_formula()
    for axis in ("ep", "edp", "dp"):
        check(counted[axis] == formula[axis],
              f"{name}: {axis} bytes counted {counted[axis]} != formula {formula[axis]}")
    check(counted["ep"] > 0 or ep == 1, f"{name}: nothing travelled on ep")
    lo, hi = local_rows(spec.batch, R, N)
    even = len(set(eng.caps)) == 1
    if spec.top_k == 1 and even and not more:
        plan = spec.layers * moe_alltoall_bytes_per_rank(
            (hi - lo) * spec.seq, spec.d_model, ep, 1, spec.experts, spec.capacity_factor,
            bytes_per_elem=8, backward=True)
        check(eng.alltoall_data_bytes() == plan,
              f"{name}: a2a data bytes {eng.alltoall_data_bytes()} != plan's {plan}")
    if R == 0:
        ser = serial_reference(spec, N)
        v = compare(losses, ser["losses"], flat, ser["params"], FlatParams.like(init).flatten(init))
        check(v.status == "equal", f"{name}: {v.line()}")
        print(f"EP-CASE {name}: ep={ep} drops={drops} param_gap={v.param_gap:.2e} "
              f"loss_gap={v.loss_gap:.2e} ep_bytes={counted['ep']:.0f} "
              f"caps={eng.caps}", flush=True)
    eng.close()
    grid.free()

# -- 3. the state: each tensor saved once; another layout resumes it ----------------
# ep = N writes its state; ep = 1 (every rank all experts) loads every rank's and goes
# on as the ep = N engine does (the same weights; only sums' order differs after a step)
spec = RunSpec(experts=4, top_k=2, capacity_factor=None, batch=8, steps=2, **V3)
comm = TracedComm(world, name="world")
ga, gb = Grid(comm, dp=N, ep=N), Grid(comm, dp=N, ep=1)
a, b = ExpertParallel(ga, spec), ExpertParallel(gb, spec)
a.step(spec.batch_at(0))
mine = a.state_dict()
saved = [(k, sh.name) for k, (sh, _) in mine.arrays.items() if sh.replica == 0]
everyone = [x for part in world.allgather(saved) for x in part]
names = list(spec.model().param_shapes())
kinds = {k for (k, _), _ in everyone}
check(kinds == {"param", "exp_avg", "exp_avg_sq", "buffer"},
      f"state: kinds {kinds} (float64 AdamW, the loss-free bias)")
check(sorted(n for (k, _), n in everyone if k == "buffer")
      == [f"blocks.{i}.moe.expert_bias" for i in range(spec.layers)], "state: the biases once")
for kind in sorted(kinds - {"buffer"}):
    got = sorted(n for (k, _), n in everyone if k == kind)
    check(got == sorted(names), f"state: replica 0 of {kind} is not each tensor once")
b.load_state_dict(world.allgather(mine))  # pickled: a test's copy of every rank's state
la, lb = a.step(spec.batch_at(1)).loss, b.step(spec.batch_at(1)).loss
check(abs(la - lb) <= 1e-12 * abs(la), f"ep {N} -> ep 1: loss {lb!r} != {la!r}")
pa, pb = a.full_params(), b.full_params()
gap = max(float(abs(pa[n] - pb[n]).max()) for n in names)
check(gap <= 1e-12, f"ep {N} -> ep 1: params differ by {gap:.2e} after a step")
check(all((a.bias.arrays[k] == b.bias.arrays[k]).all() for k in a.bias.arrays),
      f"ep {N} -> ep 1: the biases differ after a step")
for e in (a, b):
    e.close()
ga.free()
gb.free()

all_failures = world.gather(failures)
total_checks = world.reduce(checks)
if R == 0:
    flat_failures = [f for fs in all_failures for f in fs]
    print(f"EP-SUMMARY N={N} cases={len(CASES)} checks={total_checks} "
          f"failures={len(flat_failures)}", flush=True)
    for f in flat_failures[:20]:
        print("FAIL", f, flush=True)
    if flat_failures:
        world.Abort(1)
