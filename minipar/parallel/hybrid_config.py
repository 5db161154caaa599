"""A hybrid (3D/4D) layout's checks and arithmetic, without MPI — проверки и арифметика
гибридной раскладки — 混合并行布局的检查与算术.

EN 3D parallelism (hybrid layout) · RU трёхмерный (гибридный) параллелизм · ZH 3D 并行（混合布局）

What :class:`minipar.parallel.hybrid.HybridParallel` can be told, checked in the
launching process before MPI starts (``minipar run hybrid``) and again on every
rank before any message (:func:`check_hybrid`), and the exact bytes a rank sends
per step on each grid axis (:func:`bytes_formula`), the figures the tests compare
with the counters.  N = dp·pp·cp·tp ranks (Narayanan et al. 2021, arXiv
2104.04473: n = p·t·d), ep carved out of the dp·cp ranks (DeepSpeed-MoE).

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
* ``cp``: ring attention, per micro-batch and block, 2(P−1)·b_i·s_c·h·e forward and
  2(P−1)·E·e + 2P·E·e backward (E = b_i·s_c·h); Ulysses 4·b_i·s·h·(P−1)/P²·e each way;
  with tp > 1 the cp ranks exchange only their n_head/t heads: h/t in place of h.
"""

from __future__ import annotations

from typing import Any

from minipar import spans

__all__ = ["ZERO_STAGES", "bytes_formula", "check_hybrid", "micro_rows"]

#: the ZeRO stages over the dp·cp ranks (DeepSpeed refuses 2 and 3 with a pipeline; here
#: ZeRO-2 reduce-scatters after the flush and ZeRO-3 gathers per micro-batch: hybrid.py)
ZERO_STAGES = (0, 1, 2, 3)


def check_hybrid(world: int, spec: Any, dp: int = 1, pp: int = 1, tp: int = 1, cp: int = 1,
                 ep: int = 1, zero: int = 0, schedule: str = "1f1b", micro_batches: int = 1,
                 chunks: int = 1, balance: Any = None, remat: Any = None,
                 cp_kind: str = "ring", sequence_parallel: bool = False) -> None:
    """One ``ValueError`` naming the numbers unless the run can be cut as asked (no MPI:
    the launcher and every rank call it alike; the sentences of ``Grid`` and ``check_tp``)."""
    from minipar.parallel.common import check_world
    from minipar.parallel.pipeline.partition import check_pipeline

    sizes = {"dp": dp, "pp": pp, "cp": cp, "tp": tp, "ep": ep}
    for k, v in sizes.items():
        if isinstance(v, bool) or not isinstance(v, int) or v < 1:
            raise ValueError(f"Grid: {k} must be a positive integer, got {v!r}")
    if dp * pp * cp * tp != world:
        raise ValueError(f"Grid: dp·pp·cp·tp = {dp}·{pp}·{cp}·{tp} = {dp * pp * cp * tp} must "
                         f"equal the number of ranks, {world}; choose sizes whose product is "
                         f"{world}")
    if (dp * cp) % ep:
        raise ValueError(f"Grid: ep = {ep} must divide dp·cp = {dp}·{cp} = {dp * cp} (expert "
                         "parallelism reuses the data-parallel ranks, as in DeepSpeed-MoE)")
    cfg = spec.config()
    for what, n, why in (("heads", cfg.n_head, "each rank takes heads/t whole heads"),
                         ("d_ff", cfg.d_ff, "each rank takes d_ff/t MLP columns"),
                         ("vocab", cfg.vocab_size, "each rank takes vocab/t embedding rows")):
        if n % tp:
            raise ValueError(f"{what} = {n} is not divisible by the tensor-parallel size "
                             f"t = {tp}: {why}")
    if sequence_parallel and tp > 1:
        if spec.seq % tp:
            raise ValueError(f"sequence length {spec.seq} is not divisible by the "
                             f"sequence-parallel size t = {tp}: each rank keeps seq/t positions")
        if spec.experts:
            raise ValueError("sequence parallelism with a mixture of experts is not built: "
                             "use tensor parallelism alone for an MoE GPT")
    check_world(spec.batch, dp)
    check_pipeline(spec.layers, pp, micro_batches, schedule, chunks, balance,
                   spans.counts(spec.batch, dp)[-1], remat)
    if cp > 1:
        from minipar.parallel.context_parallel.layout import check

        if sequence_parallel and tp > 1:
            raise ValueError(f"cp = {cp} with sequence parallelism (tp = {tp}): both cut the "
                             "sequence; use --cp or --sequence-parallel, not both")
        if cp_kind == "ulysses" and tp > 1 and (spec.heads // tp) % cp:
            raise ValueError(f"DeepSpeed-Ulysses under tp: heads/t = {spec.heads}/{tp} = "
                             f"{spec.heads // tp} is not divisible by cp = {cp}: each cp rank "
                             "takes a whole number of its tensor slice's heads")
        check(spec.seq, spec.heads // tp, cp, cp_kind, cp_kind == "ring", spec.experts)
    if ep > 1:
        from minipar.parallel.expert_parallel.layout import check_ep

        check_ep(spec.experts, spec.top_k, spec.capacity_factor, ep, dp * cp)
        if tp > 1:
            raise ValueError(f"ep = {ep} with tp = {tp}: an expert-parallel block runs whole "
                             "attention heads; use tp = 1 with ep (or ep = 1: tp slices experts)")
    if spec.experts and spec.batch % (dp * micro_batches):
        raise ValueError(f"with --experts every micro-batch routes its rows as one group: "
                         f"--batch {spec.batch} must be divisible by dp·m = {dp}·"
                         f"{micro_batches} = {dp * micro_batches} (equal groups, as the serial "
                         "run cuts them)")
    if isinstance(zero, bool) or zero not in ZERO_STAGES:
        raise ValueError(f"--zero {zero!r}: ZeRO stage must be 0, 1, 2 or 3 (over the "
                         "dp·cp ranks of each stage)")
    if zero and ep > 1:
        raise ValueError(f"--zero {zero} with ep = {ep}: the expert gradients reduce over edp, "
                         "not over the data-parallel ranks; use --zero 0 with ep")


def micro_rows(spec: Any, dp: int, replica: int, m: int) -> list[int]:
    """Rows of each of my replica's m micro-batches (the ``array_split`` rule twice)."""
    return spans.counts(spans.counts(spec.batch, dp)[replica], m)


def bytes_formula(spec: Any, lay: Any, coords: dict[str, int], m: int, blocks: int,
                  sends: int, psi_stage: int, itemsize: int, zero: int = 0,
                  cp_kind: str = "ring", gathers: int = 0,
                  sequence_parallel: bool = False, recomputed: int = 0,
                  units: Any = None) -> dict[str, int]:
    """Exact bytes per step rank ``coords`` sends on tp, pp_p2p, dp/edp and cp (module doc).

    ``lay``: the grid's :class:`~minipar.comm.topology.Layout` (sizes dp, pp, cp, tp).

    ``blocks``: transformer blocks of my stage; ``sends``: activations and gradients my
    stage sends per micro-batch; ``psi_stage``: elements of my stage's parameters;
    ``gathers``: receives per micro-batch under PTD-P's scatter/gather (0: off): each send
    then carries b_i·s_c·h/t elements, and each receive costs one all-gather on tp;
    ``sequence_parallel``: each send is my sequence shard, b_i·(s/t)·h, nothing gathered (the
    blocks' all-gathers and reduce-scatters send what f and g's all-reduces would);
    ``recomputed``: blocks whose forward runs again in backward (remat), each again
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
    for b in rows:
        out["tp"] += (4 * blocks + 2 * recomputed) * allreduce_bytes_sent(
            b * (s // P) * h, itemsize, t, coords["tp"], "ring")
        act = b * (s // P) * h
        if sequence_parallel:
            out["pp_p2p"] += sends * act // t * itemsize
        elif gathers:
            out["pp_p2p"] += sends * act // t * itemsize
            out["tp"] += gathers * all_gather_bytes([act // t] * t, itemsize, coords["tp"])[0]
        else:
            out["pp_p2p"] += sends * act * itemsize
        if P > 1 and cp_kind == "ring":
            from minipar.parallel.context_parallel.measure import (
                ring_backward_bytes as backward_bytes,
            )
            from minipar.parallel.context_parallel.measure import (
                ring_forward_bytes as forward_bytes,
            )

            out["cp"] += ((blocks + recomputed) * forward_bytes(b, s, h // t, P, itemsize)
                          + blocks * backward_bytes(b, s, h // t, P, itemsize))
        elif P > 1:
            from minipar.parallel.context_parallel.measure import (
                ulysses_bytes_per_rank as bytes_per_rank,
            )

            out["cp"] += (2 * blocks + recomputed) * bytes_per_rank(
                b, s, h // t, spec.heads // t, P, coords["cp"], itemsize)
    n = lay.dp * lay.cp
    axis = "dp" if lay.cp == 1 else "edp"
    rank = coords["dp"] * lay.cp + coords["cp"]
    if zero == 3:
        shards = [spans.span(psi_stage, n, q) for q in range(n)]
        every, again = units

        def gathered(a: int, b: int) -> int:  # one unit's ring all-gather, uneven pieces
            cut = [max(0, min(b, hi) - max(a, lo)) for lo, hi in shards]
            return all_gather_bytes(cut, itemsize, rank)[0]

        per_mb = (2 * sum(gathered(a, b) for a, b in every) + sum(gathered(a, b) for a, b
                  in again) + reduce_scatter_bytes(psi_stage, itemsize, n, rank)[0])
        out[axis] = m * per_mb
    elif zero:
        out[axis] = (reduce_scatter_bytes(psi_stage, itemsize, n, rank)[0]
                     + all_gather_bytes(chunk_counts(psi_stage, n), itemsize, rank)[0])
    else:
        out[axis] = allreduce_bytes_sent(psi_stage, itemsize, n, rank, "ring")
    return out
