"""All checks of hybrid (3D/4D) parallelism for one world size, in one launch.

Run by tests/test_hybrid.py as ``launch.run(N, this file)``; rank 0 prints
``HYBRID-SUMMARY N=<N> checks=<k> runs=<r> failures=<f> refused=<...>`` and the first
failures, then one ``HYBRID-LAYOUT`` line per layout; the job exits 1 if a check failed.

For every layout (a Grid rebuilt on the same world, freed after):

1. parity with the serial GPT (float64, ``parity.compare``, 3 AdamW steps);
2. bytes per axis per step, counted, equal to :func:`minipar.parallel.hybrid.measure.bytes_formula`
   (tp: the blocks' f and g; pp_p2p; dp or edp; cp), dense models; and to the planner's
   :func:`minipar.plan.step_time.axis_traffic` on tp, pp, dp and ring cp (what it models);
3. parameters per rank equal to the planner's ``stage_param_count``, and model-state
   bytes per rank within 5% of ``layout_memory`` (exact but for ZeRO's uneven shard);
   under ZeRO 1-3, equal to ZeRO's formula on the stage's share Ψ_p,
   ``model_state_bytes_3d(Ψ_p·p·t, p, t, N, zero)`` (float64: 8 + 8 + 16 bytes a
   parameter, 4x its (2 + 2 + K) with K = 4), but for the uneven shard C_r vs Ψ_p/N;
4. bad input: one line, a ValueError on every rank before any message;
5. ZeRO++ (``zeropp``, with ``node`` ranks per simulated node): bit for bit the serial ZeRO++
   arithmetic of the pipeline (:func:`~minipar.parallel.hybrid.oracle.hybrid_zeropp_reference`),
   ZeRO++'s bytes per rank (all, inside and across the node, by each peer's host) equal to
   the exact formula with m micro-batches, hpZ's slices held equal to Ψ_p/K·8.
"""

from __future__ import annotations

import numpy as np
from mpi4py import MPI

from minipar.comm import TracedComm
from minipar.comm.topology import Grid
from minipar.parallel import loop, parity
from minipar.parallel.common import RunSpec, serial_reference
from minipar.parallel.hybrid.engine import build
from minipar.parallel.hybrid.measure import engine_bytes, zeropp_stage_bytes
from minipar.parallel.zero.measure import hpz_secondary_elements, zeropp_measured
from minipar.parallel.hybrid.oracle import hybrid_zeropp_reference
from minipar.plan.hybrid import model_state_bytes_3d
from minipar.plan.layouts import Layout, gpt_model, layout_memory, stage_param_count
from minipar.plan.step_time import axis_traffic

world = TracedComm(MPI.COMM_WORLD)
N, R = world.size, world.rank
checks, runs = 0, 0
failures: list[str] = []
rows_out: list[str] = []
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


def trial(spec: RunSpec, dp: int = 1, pp: int = 1, tp: int = 1, cp: int = 1, ep: int = 1,
          kind: str = "1f1b", m: int = 2, v: int = 1, zero: int = 0, cp_kind: str = "ring",
          node: int | None = None, **kw) -> None:
    global runs
    runs += 1
    what = (f"dp{dp} pp{pp} cp{cp} tp{tp} ep{ep} {kind} m={m} v={v} zero={zero}"
            + (f" {cp_kind}" if cp > 1 else "") + (f" E={spec.experts}" if spec.experts else "")
            + (f" {kw}" if kw else ""))
    grid = Grid(world, dp=dp, pp=pp, tp=tp, cp=cp, ep=ep, node=node)
    world.stats.reset()
    h = build(spec, grid, schedule=kind, micro_batches=m, chunks=v, zero=zero, cp_kind=cp_kind,
              **kw)
    losses = loop.train(h, spec.batch_at, spec.steps).losses
    params = np.concatenate([np.asarray(v).ravel() for v in h.full_params().values()])
    if kw.get("zeropp"):  # bit for bit its serial ZeRO++ arithmetic; bytes, hpZ's memory
        zeropp_trial(h, grid, spec, what, losses, params)
    else:
        ser = oracle(spec, dp * m if spec.experts else 1)
        init = spec.initial_params()
        flat0 = np.concatenate([init[k].ravel() for k in init])
        verdict = parity.compare(losses, ser["losses"], params, ser["params"], flat0)
        check(verdict.status == "equal", f"{what}: {verdict.line()}")
    if ep > 1 and kind in ("dualpipe", "dualpipev"):  # every pair took turns
        pairs = sum(type(i).__name__ == "ForwardBackward" for i in h.instructions)
        check(pairs > 0 and h.overlapped_pairs == [pairs] * spec.steps,
              f"{what}: {h.overlapped_pairs} pairs overlapped per step, of {pairs}")
    counted = {k: b / spec.steps for k, b in grid.bytes_by_axis().items()}
    ops = {op: s.bytes_sent / spec.steps for op, s in world.stats.ops.items()}
    if not spec.experts:
        f = engine_bytes(h)
        blocks_tp = ops.get("tp_f", 0) + ops.get("tp_g", 0)  # the blocks' f and g
        blocks_tp += ops.get("sp_f", 0) + ops.get("sp_g", 0)  # SP's pairs: the same bytes
        tp_sum = blocks_tp + ops.get("pp_tp_gather", 0)  # + PTD-P's scatter/gather
        check(tp_sum == f["tp"], f"{what}: tp bytes {tp_sum} != {f['tp']}")
        for axis in ("pp_p2p", "dp", "edp", "cp"):
            check(counted[axis] == f[axis], f"{what}: {axis} bytes {counted[axis]} != {f[axis]}")
        if kind == "dualpipe":  # the copies summed over ranks s, p - 1 - s: a 2-rank ring
            mirror = world.stats.bytes_sent(comm="pp_mirror") / spec.steps  # sends S, the
            want = h.stage_layout.size * h.states.params.itemsize  # planner's pp_mirror
            check(mirror == want, f"{what}: pp_mirror bytes {mirror} != S = {want}")
        if spec.kv_heads:  # grouped-query attention: the plan's GPT has K = H; bytes above
            grid.free()
            return
        model = gpt_model(spec.layers, spec.d_model, spec.vocab, spec.seq, spec.heads)
        share = stage_param_count(model, pp, tp, grid.coord("pp"))
        psi = h.stage_layout.size
        # the plan's stages are a line; zb-v's and dualpipev's rank 0 holds both ends,
        # dualpipe's every rank two stages (the model twice over the ranks)
        v_shape = kind in ("zb-v", "dualpipe", "dualpipev")
        check(psi == share or v_shape,
              f"{what}: {psi} parameters on this rank, the plan counts {share}")
        lay = Layout(dp, tp, pp, cp, zero, "none", spec.batch // (dp * m), m)
        plan = layout_memory(model, lay, itemsize=8, K=16, formula="minipar",
                             sequence_parallel=bool(kw.get("sequence_parallel")), cp_kind=cp_kind)
        held = sum(h.model_state_bytes().values())
        act = h.activation_peak_bytes
        if zero:  # ZeRO's formula on my stage's share; exact when N divides Ψ_p
            n_shard = dp * cp
            want = 4 * model_state_bytes_3d(psi * pp * tp, pp, tp, n_shard, zero, K=4)["total"]
            check(abs(held - want) <= (32 if psi % n_shard else 0),
                  f"{what}: model states {held} vs ZeRO-{zero}'s {want}")
            check(zero != 2 or h.sync.grad_accumulation_bytes == psi * 8,
                  f"{what}: ZeRO-2 accumulates {h.sync.grad_accumulation_bytes} bytes, not Ψ_p·8")
            if zero == 3 and not ("remat" in kw and kw.get("reshard_after_forward", True)) \
                    and "zeropp" not in kw:  # (qwZ's all-gathers in flight: packed bytes)
                # the most held gathered, to the byte (no reshard: Ψ_p; remat's recomputed
                # segment is fetched inside a backward: more than the window's formula)
                peak, want = h.sync.gathered_peak()
                check(peak == want and (kw.get("reshard_after_forward", True) or
                                        want == psi * 8),
                      f"{what}: held gathered {peak} bytes, formula {want} (Ψ_p·8 {psi * 8})")
        if grid.coord("pp") == plan["stage"] and kind != "dualpipe":
            check(abs(held - plan["states"]) <= 0.05 * plan["states"],
                  f"{what}: model states {held} vs plan {plan['states']}")
            # the plan's schedule, no remat (ring CP: the plan's cp_kind="ring", no scores)
            if kind == "1f1b" and v == 1 and set(kw) <= {"sequence_parallel"}:
                check(abs(held + act - plan["total"]) <= 0.05 * plan["total"],
                      f"{what}: memory {held + act} vs plan {plan['total']}")
        traffic = axis_traffic(model, lay, None, itemsize=8)
        check(blocks_tp == traffic["tp"]["bytes"] or "remat" in kw  # the plan: no remat here
              or spec.layers % pp,  # and equal stages
              f"{what}: tp bytes {blocks_tp} vs plan {traffic['tp']['bytes']}")
        plan_pp = traffic["pp"]["bytes"] / (1 if 0 < grid.coord("pp") < pp - 1 else 2)
        if v == 1:  # the plan has no interleaving; h/t per tp rank: PTD-P's scatter/gather
            check(counted["pp_p2p"] == plan_pp,
                  f"{what}: pp bytes {counted['pp_p2p']} vs plan {plan_pp}")
        held_here = stage_param_count(model, pp, tp, grid.coord("pp"))
        if not v_shape and held_here == max(stage_param_count(model, pp, tp, i)
                                            for i in {0, pp - 1}) and (
                held_here % (dp * cp) == 0) and zero != 2 and not (zero == 3 and "remat" in kw) and (
                kw.get("reshard_after_forward", True)) and "zeropp" not in kw:
            # the plan: the fuller end stage, even ring chunks; its ZeRO-2 is DeepSpeed's (m
            # reduce-scatters), its ZeRO-3 gathers nothing again for remat and reshards
            red = counted["dp" if cp == 1 else "edp"]
            check(red == traffic["dp"]["bytes"],
                  f"{what}: dp bytes {red} vs plan {traffic['dp']['bytes']}")
        if cp > 1 and cp_kind == "ring" and "remat" not in kw:  # the plan models ring CP
            check(counted["cp"] == traffic["cp"]["bytes"],
                  f"{what}: cp bytes {counted['cp']} vs plan {traffic['cp']['bytes']}")
        # every rank's figures, for the summary line: bytes per axis, states, activations
        line = (f"{what} | rank {R} stage {grid.coord('pp')}: "
                + " ".join(f"{a}={int(counted[a])}" for a in ("tp", "pp_p2p", "dp", "edp", "cp")
                           if counted[a]) + f" states={held} act_peak={h.activation_peak_bytes}"
                + (f" plan_states={int(plan['states'])} plan_act={int(plan['activations'])}"
                   if grid.coord("pp") == plan["stage"] else "")
                + " plan: " + " ".join(f"{a}={traffic[a]['bytes']:g}" for a in traffic))
        rows_out.append(line)
    h.close()
    grid.free()


def zeropp_trial(h, grid, spec, what, losses, params) -> None:
    z = h.sync.zeropp
    k, cp = z["node"].size, grid.size("cp")
    if cp == 1:  # (with cp, CP's sums are not the serial ones: bytes and memory only)
        ref = hybrid_zeropp_reference(spec, grid.size("dp"), grid.size("pp"), h.m, z["parts"],
                                      k, z["block"], h.kind)
        verdict = parity.bitwise(losses, ref["losses"], params, ref["params"], "its serial")
        check(verdict.status == "equal", f"{what}: {verdict.line()}")
    got = zeropp_measured(world.stats, grid.hosts, world.world_ranks, grid.rank, spec.steps,
                          ("dp" if cp == 1 else "edp", "zeropp_node", "zeropp_cross"))
    want = zeropp_stage_bytes(h)
    check(all(got[x] == want[x] for x in ("total", "intra", "inter")),
          f"{what}: ZeRO++ bytes {got} vs exact {want}")
    check(bool(want["intra"]) == (k > 1) and bool(want["inter"]) == (k < h.sync.comm.size),
          f"{what}: nodes of {k}: intra {want['intra']}, inter {want['inter']}")
    held = 8 * hpz_secondary_elements(h.stage_layout.size, k, z["node"].rank)
    check(h.sync.zero_hooks.peak_secondary_bytes == (held if "hpz" in z["parts"] else 0),
          f"{what}: hpZ held {h.sync.zero_hooks.peak_secondary_bytes}, formula {held}")


def bad_input(spec: RunSpec) -> list[str]:
    """Each bad layout: one line, ValueError on every rank, no message sent."""
    bad = [("product", {"dp": N + 1}), ("tp not dividing heads", {"tp": N, "dp": 1}),
           ("pp more than layers", {"pp": N, "dp": 1}),
           ("ep not dividing experts", {"dp": N, "ep": N}),
           ("ep not dividing dp", {"dp": 1, "pp": N, "ep": 2})]
    seen = []
    for what, sizes in bad:
        s = spec.with_(heads=3, d_model=12) if what == "tp not dividing heads" else spec
        s = s.with_(layers=N - 1) if what == "pp more than layers" else s
        s = s.with_(experts=3, batch=N * 2) if what == "ep not dividing experts" else s
        s = s.with_(experts=2, batch=8) if what == "ep not dividing dp" else s
        world.stats.reset()
        try:
            g = Grid(world, **sizes)  # the layout's own checks: before the Split
        except ValueError as e:
            check(world.stats.msgs_sent() == 0, f"{what}: messages before the error")
            check(len(str(e).splitlines()) == 1, f"{what}: not one line: {e}")
            seen.append(f"{what}: {e}")
            continue
        world.stats.reset()
        try:
            build(s, g, schedule="1f1b", micro_batches=1)
            check(False, f"bad input accepted: {what}")
        except ValueError as e:
            check(world.stats.msgs_sent() == 0 and world.stats.msgs_recv() == 0,
                  f"{what}: messages before the error")
            check(len(str(e).splitlines()) == 1, f"{what}: not one line: {e}")
            seen.append(f"{what}: {e}")
        finally:
            g.free()
    return seen


def run_all() -> list[str]:
    dense = RunSpec(vocab=8, seq=8, d_model=16, layers=4, heads=8, batch=8, steps=3)
    if N == 8:  # every dp x pp x tp of 8 ranks; pp = 8 on a model of 8 layers
        for dp, pp, tp in ((2, 2, 2), (1, 2, 4), (4, 1, 2), (2, 1, 4), (2, 4, 1), (1, 4, 2),
                           (8, 1, 1), (4, 2, 1), (1, 1, 8), (1, 8, 1)):
            trial(dense.with_(layers=8) if pp == 8 else dense, dp, pp, tp,
                  m=1 if dp == 8 else 2)
        trial(dense, 2, 2, 2, zero=1)
        trial(dense, 2, 2, 2, zero=2)
        trial(dense, 2, 2, 2, zero=3)
        trial(dense, 4, 2, 1, zero=3)
        trial(dense, 2, 2, 2, sequence_parallel=True)
        trial(dense, 1, 2, 4, kind="gpipe", sequence_parallel=True)
        trial(dense, 2, 2, 1, cp=2, m=2)
        trial(dense, 1, 2, 2, cp=2)  # cp x tp: ring zigzag on each tp rank's 4 heads
        trial(dense, 2, 1, 2, cp=2, cp_kind="ulysses")  # Ulysses: heads/t = 4 over cp 2
        # grouped-query attention: K = 2 key/value heads, one per tp rank, all-gathered over cp;
        # K = 1 under tp 2: replicated on both tp ranks, its gradient summed (tp_kv_grads)
        trial(dense.with_(kv_heads=2), 2, 1, 2, cp=2, cp_kind="allgather")
        trial(dense.with_(kv_heads=1), 2, 2, 2, zero=1)
        # USP: U = 2 Ulysses ranks x R = 2 ring groups on each tp rank's 4 heads, K = 4 / t
        trial(dense.with_(kv_heads=4), 1, 1, 2, cp=4, cp_kind="usp", cp_ulysses=2)
        trial(dense.with_(kv_heads=2), 2, 1, 1, cp=4, cp_kind="usp", cp_ulysses=2)  # x dp 2
        # zero bubble (Qi et al. 2023): B and W with tp inside the stage, SP's W, ZeRO-1
        trial(dense, 2, 2, 2, kind="zb-h1", m=4)
        trial(dense, 2, 2, 2, kind="zb-h1", m=2, sequence_parallel=True)
        trial(dense, 2, 2, 2, kind="zb-h2", m=4, zero=1)
        trial(dense, 2, 2, 2, kind="zb-v", m=4, v=2, zero=1)
        # ZeRO++ over dp 4 in 2 nodes of 2 per stage: qgZ's two hops, hpZ inside the node
        trial(dense, 4, 2, 1, zero=3, node=4, zeropp=("qwz", "hpz", "qgz"))
    if N == 4:  # --tp-overlap inside a pipeline stage, with and without SP
        trial(dense, 1, 2, 2, tp_overlap=True)
        trial(dense, 1, 2, 2, sequence_parallel=True, tp_overlap=True)
        trial(dense, 1, 2, 1, cp=2)
        trial(dense, 2, 1, 1, cp=2, cp_kind="ulysses")
        trial(dense.with_(kv_heads=2), 1, 2, 1, cp=2, cp_kind="allgather")
        trial(dense.with_(kv_heads=1), 2, 1, 1, cp=2, cp_kind="ulysses")  # K copied to 2
        trial(dense, 1, 1, 1, cp=4, kind="gpipe", m=2)
        trial(dense, 1, 1, 1, cp=4, cp_kind="usp", cp_ulysses=2)  # 2 Ulysses x 2 ring
        trial(dense, 1, 2, 2, kind="interleaved", m=2, v=2, remat=True)
        trial(dense, 2, 2, 1, kind="gpipe", m=2, offload="host")
        trial(dense.with_(layers=8), 1, 2, 1, cp=2, remat=2)  # recomputed: the ring again
        trial(dense, 2, 1, 1, cp=2, cp_kind="ulysses", kind="gpipe", remat=True)
        trial(dense, 2, 2, 1, zero=1)
        trial(dense, 2, 1, 1, cp=2, zero=1)
        trial(dense, 2, 2, 1, zero=2)
        trial(dense, 2, 2, 1, kind="gpipe", zero=3, remat=True)
        trial(dense, 2, 2, 1, zero=3, prefetch=1)  # the stage's walk learnt, then prefetched
        trial(dense, 2, 1, 2, kind="gpipe", zero=3, remat=True, prefetch=2, tp_overlap=True)
        trial(dense, 2, 2, 1, zero=3, reshard_after_forward=False)  # FSDP2's switch
        trial(dense, 2, 1, 2, kind="gpipe", zero=3, remat=True, prefetch=1,
              reshard_after_forward=False)
        trial(dense, 1, 2, 1, cp=2, zero=3)
        # ZeRO++: dp 2 in one node (hpZ, qgZ's node hop), across 2 nodes (the cross hop);
        # the first step plans its walk fetch by fetch, prefetch along the learnt one after
        trial(dense, 2, 2, 1, zero=3, node=4, prefetch=1, zeropp=("qwz", "hpz", "qgz"))
        trial(dense, 2, 2, 1, kind="gpipe", zero=3, node=2, remat=True,  # a unit recomputed:
              zeropp=("qwz", "hpz", "qgz"))  # fetched once more (the learnt walk's count)
        trial(dense, 2, 1, 1, cp=2, zero=3, node=2, zeropp=("qwz", "hpz", "qgz"))  # over edp
        moe = dense.with_(experts=4, top_k=1)
        trial(moe, 2, 2, 1, ep=2, m=2)
        trial(moe, 4, 1, 1, ep=2, m=1)
        trial(moe, 1, 2, 2, m=2)
        trial(moe, 2, 2, 1, m=2, zero=3)  # ep = 1: the experts gathered with their block
        # DeepSeek-V3's schedules with tensor parallelism inside the stages (and ZeRO-1)
        # (3 blocks: each rank's two chunks unequal, 2 blocks and 1, tp bytes per micro-batch)
        trial(dense.with_(layers=3), 1, 2, 2, kind="dualpipe", m=4, v=2)
        trial(dense, 1, 2, 2, kind="dualpipev", m=4, v=2, zero=1)
        v3 = moe.with_(top_k=2, router="sigmoid", shared_experts=1, expert_width=24,
                       load_balance="loss-free", bias_update_rate=0.01, capacity_factor=None,
                       expert_groups=2, groups_per_token=1, seq_aux_loss_coef=0.01)
        # DeepSeek-V3's experts in a dp·ep × pp grid, on DualPipe: the dropless all-to-alls
        # (counts first) of one micro-batch in flight while the pair's other one computes
        trial(v3, 2, 2, 1, ep=2, kind="dualpipe", m=4, v=2)
    return bad_input(dense)


refused = run_all()  # an exception on one rank ends the job (minipar.launch.rank aborts)
everyone = world.comm.gather((checks, runs, failures, rows_out), root=0)
if R == 0:
    total = sum(c for c, _, _, _ in everyone)
    fails = [f for _, _, fs, _ in everyone for f in fs]
    print(f"HYBRID-SUMMARY N={N} checks={total} runs={everyone[0][1]} failures={len(fails)}")
    for f in fails[:20]:
        print("  " + f)
    for line in refused:
        print("HYBRID-REFUSED " + line)
    for _, _, _, rs in everyone:
        for line in rs:
            print("HYBRID-LAYOUT " + line)
    raise SystemExit(1 if fails else 0)
