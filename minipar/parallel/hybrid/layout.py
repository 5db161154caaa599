"""A hybrid (3D/4D) layout's checks, without MPI — проверки гибридной раскладки —
混合并行布局的检查.

EN 3D parallelism (hybrid layout) · RU трёхмерный (гибридный) параллелизм · ZH 3D 并行（混合布局）

What the hybrid engine (:func:`minipar.parallel.hybrid.engine.build`) can be told, checked in the
launching process before MPI starts (``minipar run hybrid``) and again on every
rank before any message (:func:`check_hybrid`), and the rows of each micro-batch
(:func:`micro_rows`).  N = dp·pp·cp·tp ranks (Narayanan et al. 2021, arXiv
2104.04473: n = p·t·d), ep carved out of the dp·cp ranks (DeepSpeed-MoE).  The
bytes a rank sends per step on each axis: :mod:`minipar.parallel.hybrid.measure`.
"""


from __future__ import annotations

from typing import Any

from minipar import checks, spans
from minipar.plan.tensor import check_tp_sizes

__all__ = ["ZERO_STAGES", "check_hybrid", "micro_rows"]

#: the ZeRO stages over the dp·cp ranks (DeepSpeed refuses 2 and 3 with a pipeline; here
#: ZeRO-2 reduce-scatters after the flush and ZeRO-3 gathers per micro-batch: sync.py)
ZERO_STAGES = (0, 1, 2, 3)


def check_hybrid(world: int, spec: Any, dp: int = 1, pp: int = 1, tp: int = 1, cp: int = 1,
                 ep: int = 1, zero: int = 0, schedule: str = "1f1b", micro_batches: int = 1,
                 chunks: int = 1, balance: Any = None, remat: Any = None,
                 cp_kind: str = "ring", sequence_parallel: bool = False,
                 cp_ulysses: int = 0) -> None:
    """One ``ValueError`` naming the numbers unless the run can be cut as asked (no MPI:
    the launcher and every rank call it alike; the sentences of ``Grid`` and ``check_tp``)."""
    from minipar.parallel.common import check_world
    from minipar.parallel.pipeline.partition import check_pipeline

    sizes = {"dp": dp, "pp": pp, "cp": cp, "tp": tp, "ep": ep}
    for k, v in sizes.items():
        checks.integer(f"Grid: {k}", v, 1)
    if dp * pp * cp * tp != world:
        raise ValueError(f"Grid: dp·pp·cp·tp = {dp}·{pp}·{cp}·{tp} = {dp * pp * cp * tp} must "
                         f"equal the number of ranks, {world}; choose sizes whose product is "
                         f"{world}")
    if (dp * cp) % ep:
        raise ValueError(f"Grid: ep = {ep} must divide dp·cp = {dp}·{cp} = {dp * cp} (expert "
                         "parallelism reuses the data-parallel ranks, as in DeepSpeed-MoE)")
    cfg = spec.config()
    sp = sequence_parallel and tp > 1
    check_tp_sizes(tp, cfg.n_head, cfg.d_ff, cfg.vocab_size, spec.seq if sp else None,
                   sequence_parallel=sp, experts=spec.experts, kv_heads=cfg.n_kv_head)
    check_world(spec.batch, dp)
    check_pipeline(spec.layers, pp, micro_batches, schedule, chunks, balance,
                   spans.counts(spec.batch, dp)[-1], remat)
    if cp > 1:
        from minipar.parallel.context_parallel.options import check

        if sequence_parallel and tp > 1:
            raise ValueError(f"cp = {cp} with sequence parallelism (tp = {tp}): both cut the "
                             "sequence; use --cp or --sequence-parallel, not both")
        if cp_kind == "ulysses" and tp > 1 and (spec.heads // tp) % cp:
            raise ValueError(f"DeepSpeed-Ulysses under tp: heads/t = {spec.heads}/{tp} = "
                             f"{spec.heads // tp} is not divisible by cp = {cp}: each cp rank "
                             "takes a whole number of its tensor slice's heads")
        check(spec.seq, spec.heads // tp, cp, cp_kind, cp_kind != "ulysses", spec.experts,
              max(cfg.n_kv_head // tp, 1), cp_ulysses or None)
    if ep > 1:
        from minipar.parallel.expert_parallel.options import check_ep

        check_ep(spec.experts, spec.top_k, spec.capacity_factor, ep, dp * cp,
                 spec.expert_groups)
        if tp > 1:
            raise ValueError(f"ep = {ep} with tp = {tp}: an expert-parallel block runs whole "
                             "attention heads; use tp = 1 with ep (or ep = 1: tp slices experts)")
    if spec.experts and spec.batch % (dp * micro_batches):
        raise ValueError(f"with --experts every micro-batch routes its rows as one group: "
                         f"--batch {spec.batch} must be divisible by dp·m = {dp}·"
                         f"{micro_batches} = {dp * micro_batches} (equal groups, as the serial "
                         "run cuts them)")
    checks.integer("--zero", zero, min(ZERO_STAGES), max(ZERO_STAGES),
                   why="the ZeRO stage, over the dp·cp ranks of each pipeline stage")
    if zero and ep > 1:
        raise ValueError(f"--zero {zero} with ep = {ep}: the expert gradients reduce over edp, "
                         "not over the data-parallel ranks; use --zero 0 with ep")


def micro_rows(spec: Any, dp: int, replica: int, m: int) -> list[int]:
    """Rows of each of my replica's m micro-batches (the ``array_split`` rule twice)."""
    return spans.counts(spans.counts(spec.batch, dp)[replica], m)
