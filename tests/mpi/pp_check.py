"""All checks of the pipeline executor for one world size, in one launch.

Run by tests/test_pipeline_parallel.py as ``launch.run(N, this file)``; rank 0
prints ``PP-SUMMARY N=<N> checks=<k> runs=<r> failures=<f>`` and the first
failures; the job exits 1 if any check failed.

1. parity with the serial GPT (float64, ``parity.compare`` over 3 AdamW steps) on
   p = N stages for every schedule, m from 1 to 8, even and ``balance`` splits,
   interleaved with v = 2, remat, offload to host and disk, a mixture of experts, a
   learner's list;
   on 4 ranks also dp 2 x pp 2, and a state saved by dp 2 x pp 2 resumed by pp 4;
   DeepSeek-V3's dualpipe and dualpipev (N = 2, 4: m = 2N, odd m for dualpipev, remat,
   offload, experts; dp 2 x pp 2), and a dualpipe state resumed by 1F1B and back;
2. the records: one per instruction, and the rebuilt timeline replays them;
3. bytes on ``pp_p2p`` = Σ over sends of the micro-batch's rows·T·d·8, and a middle
   stage's = the plan's 2·m·v·b·s·h·bytes; a middle stage's activation ledger = GPipe's
   formula (N·(L/K)·layer bytes; with remat N·input + (L/K)(N/M)·layer bytes), exactly;
   remat and 1F1B hold less than GPipe;
4. bad input: a ValueError of one line on every rank, before any message.
"""

from __future__ import annotations

import numpy as np
from mpi4py import MPI

from minipar import spans
from minipar.comm import TracedComm
from minipar.comm.topology import Grid
from minipar.memory import nbytes
from minipar.parallel import loop, parity
from minipar.parallel.common import RunSpec, serial_reference
from minipar.parallel.pipeline.engine import PipelineParallel
from minipar.parallel.pipeline.measure import measured_bubble
from minipar.parallel.pipeline.schedule import stage_schedule
from minipar.parallel.pipeline.simulate import WHAT, message_key
from minipar.parallel.pipeline.stage_loop import ForwardBackward, SendAct, SendGrad, rank_of
from minipar.plan.pipeline import gpipe_activation_bytes, pipeline_p2p_bytes_per_rank

world = TracedComm(MPI.COMM_WORLD)
N, R = world.size, world.rank
checks, runs = 0, 0
failures: list[str] = []
_serial: dict[tuple[RunSpec, int], dict] = {}


def check(ok: bool, what: str) -> None:
    global checks
    checks += 1
    if not ok:
        failures.append(f"rank {R}: {what}")


def oracle(spec: RunSpec, groups: int) -> dict:
    if (spec, groups) not in _serial:
        _serial[(spec, groups)] = serial_reference(spec, groups)
    return _serial[(spec, groups)]


def trial(grid: Grid, spec: RunSpec, kind: str, m: int, v: int = 1, **kw) -> PipelineParallel:
    """Train, compare with the serial run, check the records and the bytes."""
    global runs
    runs += 1
    what = f"{kind} p={grid.size('pp')} dp={grid.size('dp')} m={m} v={v} {kw}"
    world.stats.reset()
    pp = PipelineParallel(grid, spec, kind, m, v, **kw)
    losses = loop.train(pp, spec.batch_at, spec.steps).losses
    params = flat(pp.full_params())
    ser = oracle(spec, grid.size("dp") * m if spec.experts else 1)
    init = spec.initial_params()
    flat0 = np.concatenate([init[k].ravel() for k in init])
    verdict = parity.compare(losses, ser["losses"], params, ser["params"], flat0)
    check(verdict.status == "equal", f"{what}: {verdict.line()}")
    # one record per instruction (an overlapped pair: its forward's and its backward's), in
    # order; the rebuilt timeline replays them
    parts = [x for i in pp.instructions for x in ((i.forward, i.backward) if isinstance(
        i, ForwardBackward) else (i,))]
    check([r.what for r in pp.records[-1]] == [WHAT[type(i)] for i in parts],
          f"{what}: one record per instruction")
    recs = pp.gather_records()
    if "instructions" not in kw:
        b = measured_bubble(recs, kind, grid.size("pp"), m, v)
        check(0 <= b["rebuilt"] < 1 and 0 <= b["wall_clock"] < 1, f"{what}: bubble {b}")
    # bytes: every send carries its micro-batch's rows x T x d float64
    cuts = [spans.span(spans.counts(spec.batch, grid.size("dp"))[grid.coord("dp")], m, i)
            for i in range(m)]
    p = grid.size("pp")
    half = m // 2 if kind == "dualpipe" else 0  # dualpipe: chunk 1 carries the 2nd half

    def remote(i) -> bool:  # dualpipev's turn on rank p - 1 is a hand-off: no bytes
        return rank_of(message_key(i, pp.stage, p, pp.place)[3], p, pp.place) != pp.stage
    expect = sum((cuts[i.mb + i.chunk * half][1] - cuts[i.mb + i.chunk * half][0]) * spec.seq
                 * spec.d_model * 8 for i in pp.instructions
                 if isinstance(i, (SendAct, SendGrad)) and p > 1 and remote(i))
    got = world.stats.bytes_sent(comm="pp_p2p") / spec.steps
    check(got == expect, f"{what}: pp_p2p bytes {got} != {expect}")
    return pp


def flat(params: dict) -> np.ndarray:
    return np.concatenate([np.asarray(v).ravel() for v in params.values()])


def resume_elsewhere(spec: RunSpec) -> None:
    """dp 2 x pp 2 saves its state after one step; pp 4 (GPipe) loads it: the same
    parameters to the bit, the optimizer's states too (the next step agrees to 1e-12)."""
    g = Grid(world, dp=2, pp=2)
    a = PipelineParallel(g, spec, "1f1b", 2)
    a.step(spec.batch_at(0))
    saved = world.comm.allgather(a.state_dict())  # every rank's state (pickled: copies)
    g4 = Grid(world, pp=4)
    b = PipelineParallel(g4, spec, "gpipe", 2)
    b.load_state_dict(saved)
    check(flat(a.full_params()).tobytes() == flat(b.full_params()).tobytes(),
          "dp 2 x pp 2 -> pp 4: parameters after load_state_dict differ")
    check(b.steps_done == 1, f"pp 4 loaded step {b.steps_done}, not 1")
    la, lb = a.step(spec.batch_at(1)).loss, b.step(spec.batch_at(1)).loss
    check(abs(la - lb) <= 1e-12 * abs(la), f"dp 2 x pp 2 -> pp 4: next loss {lb} != {la}")
    gap = float(np.abs(flat(a.full_params()) - flat(b.full_params())).max())
    check(gap <= 1e-12, f"dp 2 x pp 2 -> pp 4: parameters after the next step differ by {gap}")
    g.free()
    g4.free()


def dualpipe_resume(spec: RunSpec) -> None:
    """A dualpipe state (its second copies not saved) resumed by 1F1B, and a 1F1B state by
    dualpipe (both copies loaded): the next losses agree."""
    g = Grid(world, pp=N)
    for a_kind, b_kind in (("dualpipe", "1f1b"), ("1f1b", "dualpipe")):
        a = PipelineParallel(g, spec, a_kind, 2 * N, 2 if a_kind == "dualpipe" else 1)
        a.step(spec.batch_at(0))
        saved = world.comm.allgather(a.state_dict())
        b = PipelineParallel(g, spec, b_kind, 2 * N, 2 if b_kind == "dualpipe" else 1)
        b.load_state_dict(saved)
        check(flat(a.full_params()).tobytes() == flat(b.full_params()).tobytes(),
              f"{a_kind} -> {b_kind}: parameters after load_state_dict differ")
        la, lb = a.step(spec.batch_at(1)).loss, b.step(spec.batch_at(1)).loss
        check(abs(la - lb) <= 1e-12 * abs(la), f"{a_kind} -> {b_kind}: next loss {lb} != {la}")
        gap = float(np.abs(flat(a.full_params()) - flat(b.full_params())).max())
        check(gap <= 1e-12, f"{a_kind} -> {b_kind}: parameters after the next step differ by "
              f"{gap}")
        a.close()
        b.close()
    g.free()


def dualpipes(base: RunSpec) -> None:
    """DeepSeek-V3's schedules on p = N ranks (N even for dualpipe), and on 4 ranks dp 2."""
    g = Grid(world, pp=N)
    v_spec = base.with_(layers=2 * N, batch=max(12, 2 * N + 3))
    runs = [("dualpipev", v_spec, 2 * N + 1, {}),
            ("dualpipev", v_spec.with_(experts=2, top_k=1, batch=4 * N), 2 * N, {})]
    if N == 2:  # the smallest m, and remat, once
        runs += [("dualpipev", v_spec, 2 * N, {"remat": True})]
    if N % 2 == 0:
        d_spec = base.with_(batch=max(12, 4 * N))
        # (experts: DeepSeek-V3's, whose loads both copies sum; the plain softmax router
        # with capacity runs on dualpipev above)
        runs += [("dualpipe", d_spec, 2 * N, {}),
                 ("dualpipe", d_spec, 2 * N, {"remat": 1, "offload": "host"}),
                 ("dualpipe", V3.with_(batch=4 * N), 2 * N, {})]  # loads of both copies
        runs += [("dualpipe", d_spec, 2 * N + 2, {})] if N == 2 else []
    for kind, spec, m, kw in runs:
        trial(g, spec, kind, m, 2, **kw).close()
    g.free()
    if N == 4:  # dp 2 x pp 2
        g = Grid(world, dp=2, pp=2)
        trial(g, base.with_(batch=8), "dualpipe", 4, 2).close()
        trial(g, base.with_(batch=8), "dualpipev", 4, 2).close()
        g.free()
    if N == 4:  # ranks 0 and 3, 1 and 2 hold the two copies
        dualpipe_resume(base.with_(batch=4 * N))


#: DeepSeek-V3's experts (issue 34): sigmoid, a shared expert, narrow experts, loss-free
#: balancing, dropless, node-limited routing
V3 = RunSpec(layers=4, batch=10, steps=3, d_model=16, heads=2, seq=8, experts=4, top_k=2,
             router="sigmoid", shared_experts=1, expert_width=24, load_balance="loss-free",
             bias_update_rate=0.01, capacity_factor=None, expert_groups=2, groups_per_token=1)


def run_all() -> None:
    base = RunSpec(layers=4, batch=10, steps=3, d_model=16, heads=2, seq=8)
    g = Grid(world, pp=N)
    p = N
    ms = {1: [1, 3, 8], 2: [1, 2, 5, 8], 3: [1, 4, 7], 4: [1, 3, 6, 8]}[N]
    peak = {}
    for kind in ("gpipe", "1f1b"):
        for m in ms:
            peak[kind, m] = trial(g, base, kind, m).activation_peak_bytes
    if g.coord("pp") < p - 1:  # 1F1B holds p - s micro-batches, GPipe all m (equal rows)
        m = ms[-1]
        check(peak["1f1b", m] < peak["gpipe", m], f"1F1B's peak {peak['1f1b', m]} not below "
              f"GPipe's {peak['gpipe', m]} at m={m}")
    trial(g, base, "naive", 2)
    if N > 1:  # balance lists
        bal = {2: [1, 3], 3: [2, 1, 1], 4: [1, 1, 1, 1]}[N]
        trial(g, base, "1f1b", 4, balance=bal)
    kept = trial(g, base, "gpipe", 3).activation_peak_bytes
    gpipe = trial(g, base, "gpipe", 3, remat=True).activation_peak_bytes  # inputs + one mb
    check(gpipe < kept, f"GPipe remat's activation peak {gpipe} not below {kept}")
    deep = base.with_(layers=2 * p)  # two blocks per stage: remat=1 keeps one's input only
    kept = trial(g, deep, "gpipe", 5).activation_peak_bytes
    remat = trial(g, deep, "gpipe", 5, remat=1).activation_peak_bytes
    check(remat < kept, f"remat's activation peak {remat} not below {kept}")
    whole = trial(g, deep, "gpipe", 5, remat=True).activation_peak_bytes
    if 0 < g.coord("pp") < p - 1:  # a middle stage holds blocks only: GPipe's formula, exactly
        blk = deep.model().units()[1]
        one = np.zeros((1, deep.seq, deep.d_model))
        layer = nbytes(blk.forward(blk.params(deep.initial_params()), one)[1])
        for got, rm in ((kept, False), (whole, True)):
            want = gpipe_activation_bytes(deep.batch, deep.layers, p, 5, layer, one.nbytes, rm)
            check(got == want, f"GPipe activations (remat {rm}): ledger {got} != formula {want}")
    trial(g, base, "1f1b", 2, remat=1)
    trial(g, base, "1f1b", 3, offload="host")
    off = trial(g, base, "gpipe", 2, remat=True, offload="disk")
    check(off.offload_stats["bytes_out"] > 0 and off.offload_stats["peak_bytes"] > 0,
          f"disk offload moved nothing: {off.offload_stats}")
    inter = base.with_(layers=2 * p, batch=max(10, 2 * p))
    trial(g, inter, "interleaved", p, 2)
    trial(g, inter, "interleaved", 2 * p, 2, remat=True)
    trial(g, base.with_(experts=2, top_k=1), "1f1b", 2)
    # DeepSeek-V3's experts: the loss-free bias (recomputed forwards count no load again)
    pp = trial(g, V3, "gpipe", 2, remat=True)
    counted = [sum(n) for step in pp.bias.loads for n in step.values()]
    check(counted and all(c == V3.batch * V3.seq * V3.top_k for c in counted),
          f"loss-free: loads per step and block {counted}, not the global batch's once")
    mine = stage_schedule("1f1b", g.coord("pp"), p, 3)  # a learner's list: the executor runs it
    trial(g, base, "1f1b", 3, instructions=mine)
    if N == 3:  # the middle stage sends the plan's 2·m·v·b·s·h·bytes
        pp = trial(g, base, "1f1b", 5)
        if g.coord("pp") == 1:
            got = world.stats.bytes_sent(comm="pp_p2p") / base.steps
            check(got == pipeline_p2p_bytes_per_rank(2, base.seq, base.d_model, 5, 1, 8),
                  f"middle stage bytes {got}")
        del pp
    bad_input(g, base)
    g.free()
    if N == 4:  # data parallelism across pipeline replicas: dp 2 x pp 2
        g = Grid(world, dp=2, pp=2)
        for kind, m, v in (("gpipe", 2, 1), ("1f1b", 3, 1), ("interleaved", 2, 2)):
            trial(g, base, kind, m, v)
        trial(g, base, "1f1b", 2, remat=True)
        trial(g, base.with_(experts=2, batch=8), "gpipe", 2)  # cut like train(micro_batches=4)
        trial(g, V3.with_(batch=8), "1f1b", 2)  # the loads summed over the dp replicas
        g.free()
        resume_elsewhere(base)
        resume_elsewhere(V3.with_(batch=8))  # the bias resumes on another layout
    if N > 1:
        dualpipes(base)


def bad_input(g: Grid, spec: RunSpec) -> None:
    p = g.size("pp")
    bad = [("more stages than layers", spec.with_(layers=max(1, p - 1)) if p > 1 else None,
            "gpipe", 2, 1, {}),
           ("m < 1", spec, "gpipe", 0, 1, {}),
           ("more micro-batches than rows", spec, "gpipe", spec.batch + 1, 1, {}),
           ("balance wrong sum", spec, "1f1b", 2, 1, {"balance": [1] * (p - 1) + [9]}),
           ("balance wrong length", spec, "1f1b", 2, 1, {"balance": [spec.layers]} if p > 1
            else {"balance": [1, 3]}),
           ("remat interval 0", spec, "1f1b", 2, 1, {"remat": 0}),
           ("interleaved m not multiple of p", spec.with_(layers=4 * p), "interleaved",
            p + 1 if p > 1 else 0, 2, {}),
           ("interleaved layers not divisible", spec.with_(layers=2 * p + 1), "interleaved",
            p, 2, {}),
           ("chunks without interleaving", spec, "1f1b", 2, 2, {})]
    for what, s, kind, m, v, kw in bad:
        if s is None:
            continue
        world.stats.reset()
        try:
            PipelineParallel(g, s, kind, m, v, **kw)
            check(False, f"bad input accepted: {what}")
        except ValueError as e:
            check(world.stats.msgs_sent() == 0 and world.stats.msgs_recv() == 0,
                  f"{what}: messages before the error")
            check(len(str(e).splitlines()) == 1, f"{what}: not one line: {e}")


run_all()  # an exception on one rank ends the job (minipar.launch.rank aborts)
everyone = world.comm.gather((checks, runs, failures), root=0)
if R == 0:
    total = sum(c for c, _, _ in everyone)
    fails = [f for _, _, fs in everyone for f in fs]
    print(f"PP-SUMMARY N={N} checks={total} runs={everyone[0][1]} failures={len(fails)}")
    for f in fails[:20]:
        print("  " + f)
    raise SystemExit(1 if fails else 0)
