"""A hybrid (3D/4D) layout's bytes per axis, without MPI — байты гибридной раскладки по
осям — 混合并行布局各轴的通信字节.

EN 3D parallelism (bytes per axis) · RU трёхмерный (гибридный) параллелизм: байты по осям ·
ZH 3D 并行（各轴字节）

The exact bytes a rank of the hybrid engine (:func:`minipar.parallel.hybrid.engine.build`)
sends per step on each grid axis (:func:`bytes_formula`; of a built engine:
:func:`engine_bytes`), the figures the tests compare with the counters (Narayanan et al.
2021, arXiv 2104.04473, PTD-P).

Per step, rank (d, p, c, t); micro-batch i of my replica has b_i rows, s_c = s/cp
tokens of each, h = d_model, e bytes per element, L_p my stage's blocks,
Ψ_p my stage's parameters (my tensor shard of them):

* ``tp``  blocks: 4·L_p ring all-reduces of b_i·s_c·h per micro-batch (Megatron's two f
  and two g per block, on my s_c tokens): Σ_i 4·L_p·(2(t−1)/t)·b_i·s_c·h·e (exact: uneven
  ring chunks);
  a block recomputed in backward (remat) runs its forward's 2 again (6 in all);
* ``pp_p2p``: every send of an activation or its gradient, b_i·s_c·h·e each
  (a middle stage: 2·m·v of them, :func:`minipar.plan.pipeline.pipeline_p2p_bytes_per_rank`);
  with tp > 1, PTD-P's scatter/gather (§4.1): each tp rank sends 1/t of it,
  b_i·s_c·h/t·e, and the receiving tp group all-gathers it, (t−1)/t·b_i·s_c·h·e on tp;
* ``dp`` (``edp`` when cp > 1: the dp·cp ranks that hold the same shard): one ring
  all-reduce of Ψ_p after the flush, 2(N−1)/N·Ψ_p·e; with ZeRO-1 and ZeRO-2 a
  reduce-scatter and an all-gather of Ψ_p instead, (2Ψ_p − C_r − C_{r+1})·e (the same
  bytes; C_r: rank r's shard, the array_split rule); ZeRO-3 per micro-batch two
  all-gathers (forward, backward) and a reduce-scatter of every unit of the stage,
  m·(3Ψ_p − C_r − 2C_{r+1})·e, plus one all-gather more per unit remat recomputes;
  without resharding after forward (``reshard=False``) one all-gather of every unit per
  step and m reduce-scatters, (Ψ_p − C_{r+1})·e + m·(Ψ_p − C_r)·e;
* ``cp``: ring attention, per micro-batch and block, 2(P−1)·b_i·s_c·h·e forward and
  2(P−1)·E·e + 2P·E·e backward (E = b_i·s_c·h); Ulysses 4·b_i·s·h·(P−1)/P²·e each way;
  with tp > 1 the cp ranks exchange only their n_head/t heads: h/t in place of h.
"""
from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from minipar import spans
from minipar.parallel.hybrid.layout import micro_rows

__all__ = ["bytes_formula", "engine_bytes"]


def bytes_formula(spec: Any, lay: Any, coords: dict[str, int], m: int,
                  blocks: int | Sequence[int], sends: int, psi_stage: int, itemsize: int,
                  zero: int = 0, cp_kind: str = "ring", gathers: int = 0,
                  sequence_parallel: bool = False, recomputed: int | Sequence[int] = 0,
                  units: Any = None, cp_ulysses: int = 0,
                  reshard: bool = True) -> dict[str, int]:
    """Exact bytes per step rank ``coords`` sends on tp, pp_p2p, dp/edp and cp (module doc).

    ``lay``: the grid's :class:`~minipar.comm.topology.Layout` (sizes dp, pp, cp, tp).

    ``blocks``: transformer blocks of my stage (or a list: the blocks micro-batch i runs
    through, DualPipe's two chunks of unequal stages); ``sends``: activations and gradients my
    stage sends per micro-batch; ``psi_stage``: elements of my stage's parameters;
    ``gathers``: receives per micro-batch under PTD-P's scatter/gather (0: off): each send
    then carries b_i·s_c·h/t elements, and each receive costs one all-gather on tp;
    ``sequence_parallel``: each send is my sequence shard, b_i·(s/t)·h, nothing gathered (the
    blocks' all-gathers and reduce-scatters send what f and g's all-reduces would);
    ``reshard``: ZeRO-3 reshards after forward (False: each unit gathered once a step);
    ``recomputed``: blocks whose forward runs again in backward (remat; or per micro-batch,
    as ``blocks``), each again
    sending its forward traffic: 2 more all-reduces on tp, the forward ring on cp;
    ``units`` (ZeRO-3): ([lo, hi) of each unit of my stage in its flat buffer, those of
    the units remat recomputes) — each unit's all-gather is cut at the shard borders."""
    from minipar.collectives import chunk_counts
    from minipar.collectives.cost import (
        all_gather_bytes,
        allreduce_bytes_sent,
        reduce_scatter_bytes,
    )

    rows = micro_rows(spec, lay.dp, coords["dp"], m)
    s, h, t, P = spec.seq, spec.d_model, lay.tp, lay.cp
    out = {"tp": 0, "pp_p2p": 0, "dp": 0, "edp": 0, "cp": 0}
    per_mb = [blocks] * m if isinstance(blocks, int) else list(blocks)
    again_mb = [recomputed] * m if isinstance(recomputed, int) else list(recomputed)
    for b, nb, nr in zip(rows, per_mb, again_mb):
        out["tp"] += (4 * nb + 2 * nr) * allreduce_bytes_sent(
            b * (s // P) * h, itemsize, t, coords["tp"], "ring")
        act = b * (s // P) * h
        if sequence_parallel:
            out["pp_p2p"] += sends * act // t * itemsize
        elif gathers:
            out["pp_p2p"] += sends * act // t * itemsize
            out["tp"] += gathers * all_gather_bytes([act // t] * t, itemsize, coords["tp"])[0]
        else:
            out["pp_p2p"] += sends * act * itemsize
        if P > 1:
            from minipar.parallel.context_parallel import measure as cpm

            kv = max(spec.config().n_kv_head // t, 1)  # my tensor slice's key/value heads
            dkv = kv * (h // spec.heads)
            if cp_kind == "ring":
                out["cp"] += ((nb + nr) * cpm.ring_forward_bytes(
                    b, s, h // t, P, itemsize, dkv)
                    + nb * cpm.ring_backward_bytes(b, s, h // t, P, itemsize, dkv=dkv))
            elif cp_kind == "usp":
                parts = cpm.usp_bytes_per_rank(b, s, h // t, spec.heads // t, kv, cp_ulysses,
                                               P // cp_ulysses, coords["cp"], itemsize).values()
                out["cp"] += sum((nb + nr) * f["forward"] + nb * f["backward"]
                                 for f in parts)
            elif cp_kind == "allgather":
                ag = cpm.allgather_bytes_per_rank(b, s, dkv, P, coords["cp"], itemsize)
                out["cp"] += (nb + nr) * ag["forward"] + nb * ag["backward"]
            else:
                out["cp"] += (2 * nb + nr) * cpm.ulysses_bytes_per_rank(
                    b, s, h // t, spec.heads // t, P, coords["cp"], itemsize, kv)
    n = lay.dp * lay.cp
    axis = "dp" if lay.cp == 1 else "edp"
    rank = coords["dp"] * lay.cp + coords["cp"]
    if zero == 3:
        shards = [spans.span(psi_stage, n, q) for q in range(n)]
        every, again = units

        def gathered(a: int, b: int) -> int:  # one unit's ring all-gather, uneven pieces
            cut = [max(0, min(b, hi) - max(a, lo)) for lo, hi in shards]
            return all_gather_bytes(cut, itemsize, rank)[0]

        rs = reduce_scatter_bytes(psi_stage, itemsize, n, rank)[0]
        if reshard:
            out[axis] = m * (2 * sum(gathered(a, b) for a, b in every)
                             + sum(gathered(a, b) for a, b in again) + rs)
        else:  # each unit gathered once a step, kept until its last fetch
            out[axis] = sum(gathered(a, b) for a, b in every) + m * rs
    elif zero:
        out[axis] = (reduce_scatter_bytes(psi_stage, itemsize, n, rank)[0]
                     + all_gather_bytes(chunk_counts(psi_stage, n), itemsize, rank)[0])
    else:
        out[axis] = allreduce_bytes_sent(psi_stage, itemsize, n, rank, "ring")
    return out


def engine_bytes(engine: Any) -> dict[str, int]:
    """:func:`bytes_formula` of this rank of a built hybrid engine (a
    :class:`~minipar.parallel.pipeline.engine.PipelineParallel` given a
    :class:`~minipar.parallel.hybrid.stages.HybridStage`): its stage's blocks, sends and
    receives per micro-batch, Ψ_p, ZeRO stage, wire and the units remat recomputes (dense
    GPT)."""
    from minipar.nn.units import spans as unit_spans
    from minipar.parallel.hybrid.sync import ZeroSync
    from minipar.parallel.hybrid.wire import ScatterGather
    from minipar.parallel.pipeline.stage_loop import (
        RecvAct,
        RecvGrad,
        SendAct,
        SendGrad,
        rank_of,
        virtual_stage,
    )

    h, model = engine, engine.stage_model
    units = h.units  # in the stage buffer's order (DualPipe: the model's)
    again = h.stage_memory.recomputed_units()

    def count(us: Any) -> int:
        return sum(u.name.startswith("block") for u in us)

    blocks: Any = count(units)
    recomputed: Any = count(again)
    if h.place == "dual":  # DualPipe: micro-batch i < m/2 runs my chunk 0, the rest chunk 1
        half = h.m // 2
        blocks = [count(h.chunk_units[i >= half]) for i in range(h.m)]
        again_names = {u.name for u in again}
        recomputed = [count(u for u in h.chunk_units[i >= half] if u.name in again_names)
                      for i in range(h.m)]
    toward = {SendAct: 1, RecvGrad: 1, SendGrad: -1, RecvAct: -1}

    def remote(i: Any) -> bool:  # zb-v's turn on rank p - 1 is a local hand-off: no bytes
        vs = virtual_stage(h.stage, i.chunk, h.p, h.place) + toward[type(i)]
        return rank_of(vs, h.p, h.place) != h.stage

    sends, recvs = ((sum(isinstance(i, k) and remote(i) for i in h.instructions) // h.m
                     if h.p > 1 else 0) for k in ((SendAct, SendGrad), (RecvAct, RecvGrad)))
    at = dict(zip((u.name for u in units), unit_spans(units, h.stage_layout)))
    zero = h.sync.stage if isinstance(h.sync, ZeroSync) else 0
    gathers = recvs if isinstance(h.wire, ScatterGather) else 0
    coords = {a: h.grid.coord(a) for a in ("dp", "pp", "cp", "tp")}
    out = bytes_formula(h.spec, h.grid.layout, coords, h.m, blocks, sends,
                         h.stage_layout.size, h.states.params.itemsize, zero, model.cp_kind,
                         gathers, model.sp, recomputed,
                         (list(at.values()), [at[u.name] for u in again]), model.cp_ulysses,
                         getattr(h.sync, "reshard", True))
    if zero == 3 and h.sync.zeropp:  # ZeRO++: its ZeRO, node and cross-node communicators
        out["dp" if h.grid.layout.cp == 1 else "edp"] = zeropp_stage_bytes(h)["total"]
    rows = getattr(h, "rows_comm", None)  # per-tensor FP8 (fp8_rows): 16 one-FP32 rings a block
    if (rows is not None and rows.Get_size() > 1 and h.spec.precision == "fp8"
            and h.spec.fp8_scaling == "tensor" and not h.spec.experts):
        from minipar.collectives.cost import allreduce_bytes_sent

        out["dp" if h.grid.layout.cp == 1 else "edp"] += 16 * blocks * allreduce_bytes_sent(
            1, 4, rows.Get_size(), rows.Get_rank(), "ring")
    return out


def zeropp_stage_bytes(engine: Any, parts: Any = None) -> dict[str, int]:
    """The exact ZeRO++ bytes per step of this rank of a hybrid engine with ZeRO-3's ZeRO++
    (``parts``: these instead, () for ZeRO-3's own): :func:`~minipar.parallel.zero.measure.\
zeropp_exact_bytes` on the stage's units over the dp·cp ranks, m micro-batches, each
    unit fetched as often as the learnt walk fetches it (remat: once more per micro-batch)."""
    from minipar.nn.units import spans as unit_spans
    from minipar.parallel.zero.measure import zeropp_exact_bytes

    h, z = engine, engine.sync.zeropp
    comm, k, walk = h.sync.comm, z["node"].size, h.sync.zero_hooks.learned
    return zeropp_exact_bytes(list(unit_spans(h.units, h.stage_layout)), comm.size, k,
                              comm.rank, z["parts"] if parts is None else parts, z["block"],
                              h.states.params.itemsize, h.m,
                              [walk.count(u.name) for u in h.units] if walk else None)
