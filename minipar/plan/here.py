"""minipar on this machine: the overlap its own runs reach here, apart from the published
systems' — перекрытие обменов у minipar на этой машине — minipar 在本机上的通信重叠.

EN communication overlap on this machine (planner term) · RU перекрытие обменов на этой
машине (член планировщика) · ZH 本机通信重叠（规划器参数）

The step model's ``zero3_overlap`` (:mod:`minipar.plan.calibration`) belongs to the
published systems: at 0 the held-out ZeRO-3 rows of PTD-P's Table 2 are already 1.13-2.01x
optimistic (1.37-3.8x at 1; docs/plan-calibration.md), so it stays 0.  What minipar's own
overlapped forms hide *here* — single-threaded NumPy ranks on this machine's cores, a
message moving only while its rank calls MPI — is a different number, measured by the
benchmarks and recorded in :data:`HERE_OVERLAP`:

=========  =======================================================================
term       what hides what
=========  =======================================================================
``zero3``  ZeRO-3 prefetching K = 1 unit ahead: the all-gathers and reduce-scatters
           behind the units' forward and backward (``minipar bench zero``)
``tp``     ``--tp-overlap``: f's backward all-reduce behind the weight gradient's GEMM
           (``minipar bench tp``)
``tp_sp``  ``--tp-overlap`` with sequence parallelism: the decomposed all-gather and
           reduce-scatter behind their chunks' GEMMs (``minipar bench tp --sp``)
=========  =======================================================================

The planner has no model of this CPU's FLOP rate, so a minipar run here is predicted
from the blocking form measured in the same launch: its step ``T_block`` and the seconds
its rank spent in the messages ``C`` (waits included).  The overlapped form moves the
same bytes (counted, tested) and hides the share h of them:

    T_overlap = T_block − h · C                                  (:func:`overlapped_step`)

``minipar bench zero`` and ``minipar bench tp`` print this plan beside the step they
measure.  Where the two differ, the difference is what the term leaves out: the
overlapped form's own costs (smaller GEMMs of the decomposed chunks, the progress calls,
the posting of each ring step), and a rank's waiting for a slower peer, which no overlap
removes.
"""

from __future__ import annotations

#: the share of communication hidden, as measured here (the benchmarks' ``hidden_fraction``)
HERE_OVERLAP: dict[str, float] = {"zero3": 0.94, "tp": 0.95, "tp_sp": 0.73}

#: where each term was measured (docs/PERFORMANCE.md, "Hiding the communication")
MEASURED: dict[str, str] = {
    "zero3": "minipar bench zero (d 256, 2 ranks, ZeRO-3 K=1), 2026-12-06 18:44-18:46 UTC, "
             "load average 1.0-1.3",
    "tp": "minipar bench tp --sp (d 1024, one block, 2 ranks; TP overlap), "
          "2026-12-06 18:44-18:46 UTC, load average 1.0-1.3",
    "tp_sp": "minipar bench tp --sp (d 1024, one block, 2 ranks; TP+SP overlap), "
             "2026-12-06 18:44-18:46 UTC, load average 1.0-1.3",
}


def overlap_term(kind: str) -> float:
    """The recorded share of ``kind`` (``zero3``, ``tp``, ``tp_sp``); ValueError otherwise."""
    if kind not in HERE_OVERLAP:
        raise ValueError(f"no overlap term {kind!r} measured here; the terms are "
                         f"{', '.join(HERE_OVERLAP)}")
    return HERE_OVERLAP[kind]


def overlapped_step(blocking_s: float, comm_s: float, kind: str,
                    hidden: float | None = None) -> float:
    """The planned step of the overlapped form: ``blocking_s`` − h × ``comm_s`` (module doc);
    h = :func:`overlap_term` of ``kind`` unless ``hidden`` is given.  Seconds must be
    ≥ 0 and the communication no longer than the step (ValueError naming the number)."""
    h = overlap_term(kind) if hidden is None else hidden
    if not 0.0 <= h <= 1.0:
        raise ValueError(f"hidden share must be from 0 to 1, got {h}")
    if blocking_s < 0 or comm_s < 0:
        raise ValueError(f"seconds must be >= 0, got step {blocking_s}, messages {comm_s}")
    if comm_s > blocking_s:
        raise ValueError(f"the messages' {comm_s} s cannot exceed the step's {blocking_s} s")
    return blocking_s - h * comm_s
