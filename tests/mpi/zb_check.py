"""Zero-bubble pipelines on MPI ranks, every check for one world size in one launch.

Run by tests/test_pipeline_zero_bubble.py as ``launch.run(N, this file)``; rank 0 prints
``ZB-SUMMARY N=<N> checks=<k> runs=<r> failures=<f>`` and the first failures, and the
measured figures as ``ZB-FIGURE {json}`` lines; the job exits 1 if any check failed.

1. parity with the serial GPT (float64, ``parity.compare`` over 2 AdamW steps) of ZB-H1,
   ZB-H2 and ZB-V (Qi et al. 2023) on p = N stages (2, 3, 4), m = 1..8; with remat (GPipe's and
   k-unit segments), a mixture of experts, and on 4 ranks dp 2 x pp 2;
2. one record per instruction, B and W among them; the bytes kept only for W
   (``w_peak_bytes``) > 0, and 0 for 1F1B; the activation ledger (F to B) of ZB-H1 is
   1F1B's, ZB-H2's stage 0 holds more;
3. (N = 2, 4) the tensor- (with and without sequence parallelism), context- (Ulysses,
   ring) and expert-parallel units: each unit's B then W is its backward, bit for bit (float64).
"""

from __future__ import annotations

import json

import numpy as np
from mpi4py import MPI

from minipar.comm import TracedComm
from minipar.comm.topology import Grid
from minipar.nn import Hooks
from minipar.parallel import loop, parity
from minipar.parallel.common import RunSpec, serial_reference
from minipar.parallel.pipeline.engine import PipelineParallel
from minipar.parallel.pipeline.measure import measured_bubble
from minipar.parallel.pipeline.measure import in_flight
from minipar.parallel.pipeline.simulate import WHAT
from minipar.parallel.pipeline.measure import w_pending

world = TracedComm(MPI.COMM_WORLD)
N, R = world.size, world.rank
checks, runs = 0, 0
failures: list[str] = []
figures: list[dict] = []
_serial: dict = {}


def check(ok: bool, what: str) -> None:
    global checks
    checks += 1
    if not ok:
        failures.append(f"rank {R}: {what}")


def flat(params: dict) -> np.ndarray:
    return np.concatenate([np.asarray(v).ravel() for v in params.values()])


def trial(grid: Grid, spec: RunSpec, kind: str, m: int, **kw) -> PipelineParallel:
    global runs
    runs += 1
    v = 2 if kind == "zb-v" else 1
    what = f"{kind} p={grid.size('pp')} dp={grid.size('dp')} m={m} {kw}"
    pp = PipelineParallel(grid, spec, kind, m, v, **kw)
    losses = loop.train(pp, spec.batch_at, spec.steps).losses
    groups = grid.size("dp") * m if spec.experts else 1
    if (spec, groups) not in _serial:
        _serial[(spec, groups)] = serial_reference(spec, groups)
    ser = _serial[(spec, groups)]
    init = spec.initial_params()
    verdict = parity.compare(losses, ser["losses"], flat(pp.full_params()), ser["params"],
                             np.concatenate([init[k].ravel() for k in init]))
    check(verdict.status == "equal", f"{what}: {verdict.line()}")
    gap = float(np.abs(flat(pp.full_params()) - ser["params"]).max())
    check([r.what for r in pp.records[-1]] == [WHAT[type(i)] for i in pp.instructions],
          f"{what}: one record per instruction")
    if kind != "1f1b":
        check("backward_input" in {r.what for r in pp.records[-1]}, f"{what}: no B record")
    split = kind.startswith("zb")
    peaks = world.comm.allgather((pp.w_peak_bytes, pp.activation_peak_bytes,
                                  in_flight(list(pp.instructions)),
                                  w_pending(list(pp.instructions))))
    check((pp.w_peak_bytes > 0) == split, f"{what}: W-kept bytes {pp.w_peak_bytes}")
    recs = pp.gather_records()
    b = measured_bubble(recs, kind, grid.size("pp"), m, v)
    check(0 <= b["rebuilt"] < 1, f"{what}: bubble {b}")
    if grid.size("dp") == 1 and not kw:
        figures.append({"schedule": kind, "p": grid.size("pp"), "m": m, "max_diff": gap,
                        "verdict": verdict.status,
                        "in_flight": [x[2] for x in peaks], "w_pending": [x[3] for x in peaks],
                        "w_peak_bytes": [x[0] for x in peaks],
                        "activation_peak_bytes": [x[1] for x in peaks],
                        "rebuilt": float(b["rebuilt"]), "formula": float(b["formula"])})
    return pp


def b_then_w_is_backward(units, params: dict, x, what: str, top=None) -> None:
    """Forward through ``units``; then, unit by unit from the last, its backward and its
    B followed by its W on the same dy: the same dx and gradients, to the bit."""
    out, kept = __import__("minipar.nn.executor", fromlist=["forward"]).forward(
        units, Hooks(params), x)
    rng = np.random.default_rng(7)
    dy = rng.standard_normal(out.shape) if top is None else top(out)
    for u, saved in reversed(list(zip(units, kept))):
        q = u.params(params)
        dx, g = u.backward(q, saved, dy, 0.5)
        bx, pending = u.backward_input(q, saved, dy, 0.5)
        gw = u.backward_weight(pending)
        same = (dx is None and bx is None) or (dx is not None and bx is not None
                                               and dx.tobytes() == bx.tobytes())
        check(same, f"{what} {u.name}: B's dx differs from backward's")
        check(list(gw) == list(g) and all(np.asarray(gw[k]).tobytes() == np.asarray(g[k])
                                          .tobytes() for k in g),
              f"{what} {u.name}: W's gradients differ from backward's")
        dy = dx if dx is not None else dy


def units_split() -> None:
    from minipar.parallel.context_parallel.engine import ContextParallel
    from minipar.parallel.expert_parallel.engine import ExpertParallel
    from minipar.parallel.tensor_parallel.engine import TensorParallelGPT
    from minipar.parallel.tensor_parallel.shards import shard_params

    spec = RunSpec(vocab=12, layers=2, batch=4, d_model=16, heads=4 if N == 4 else 2, seq=8,
                   experts=0)
    tokens = spec.batch_at(0).tokens
    for experts in (0, N):
        s = spec.with_(experts=experts, top_k=1) if experts else spec
        cfg = s.config()
        g = Grid(world, tp=N)
        for sp in (False, True):
            if sp and experts:
                continue
            tp = TensorParallelGPT(cfg, g.comm("tp"), sp)
            shard = shard_params(s.initial_params(), cfg, N, g.coord("tp"))
            b_then_w_is_backward(tp.units(), shard, tokens, f"tp sp={sp} experts={experts}")
        g.free()
    for kind in ("ulysses", "ring"):
        g = Grid(world, cp=N)
        cp = ContextParallel(g, spec, kind)
        b_then_w_is_backward(cp.units, spec.initial_params(), cp.shard(tokens), f"cp {kind}")
        g.free()
    s = spec.with_(experts=2 * N, top_k=2)
    g = Grid(world, dp=N, ep=N)
    ep = ExpertParallel(g, s)
    x, _ = ep._local(s.batch_at(0))
    init = s.initial_params()
    b_then_w_is_backward(ep.units, {n: init[n] for u in ep.units for n in u.full_names}, x,
                         "ep")
    g.free()


def run_all() -> None:
    base = RunSpec(layers=2 * N, batch=10, steps=2, d_model=16, heads=2, seq=8)
    g = Grid(world, pp=N)
    peak = {}
    for kind in ("zb-h1", "zb-h2", "zb-v"):
        for m in range(1, 9):
            peak[kind, m] = trial(g, base, kind, m).activation_peak_bytes
    peak["1f1b", 4] = trial(g, base, "1f1b", 4).activation_peak_bytes
    # the ledger counts F -> B (W's operands apart): ZB-H1 holds 1F1B's p - s micro-batches
    check(peak["zb-h1", 4] == peak["1f1b", 4], f"ZB-H1's activation peak {peak['zb-h1', 4]} "
          f"is not 1F1B's {peak['1f1b', 4]}")
    if g.coord("pp") == 0 and N > 1:  # ZB-H2 holds 2p - 1 on stage 0, more than 1F1B's p
        check(peak["zb-h2", 8] > peak["zb-h1", 8], f"ZB-H2's stage-0 peak {peak['zb-h2', 8]} "
              f"not above ZB-H1's {peak['zb-h1', 8]}")
    trial(g, base, "zb-h1", 4, remat=True)
    trial(g, base, "zb-h2", 5, remat=1)
    trial(g, base, "zb-v", 3, remat=True)
    trial(g, base.with_(experts=2, top_k=1), "zb-h1", 2)
    g.free()
    if N == 4:  # data parallelism across pipeline replicas: dp 2 x pp 2
        g = Grid(world, dp=2, pp=2)
        for kind, m in (("zb-h1", 3), ("zb-h2", 4), ("zb-v", 3)):
            trial(g, base.with_(layers=4), kind, m)
        g.free()
    if N != 3:  # t = cp = 3 divides none of the small model's heads, width or sequence
        units_split()


run_all()
everyone = world.comm.gather((checks, runs, failures), root=0)
if R == 0:
    total = sum(c for c, _, _ in everyone)
    fails = [f for _, _, fs in everyone for f in fs]
    print(f"ZB-SUMMARY N={N} checks={total} runs={everyone[0][1]} failures={len(fails)}")
    for f in fails[:20]:
        print("  " + f)
    for fig in figures:
        print("ZB-FIGURE " + json.dumps(fig))
    raise SystemExit(1 if fails else 0)
