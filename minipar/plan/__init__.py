"""The papers' formulas as plain functions of sizes — memory, bytes moved, bubble.

EN parallelism planning (memory and communication model) ·
RU планирование параллелизма (модель памяти и обмена данными) ·
ZH 并行规划（内存与通信模型）

Every number a paper predicts lives here, as a pure function of sizes, so
a test or a notebook can put a *measured* number next to the formula, and
the very same function scales the claim up to real model sizes
(``minipar plan --params 1T -n 1024``).  Pure Python, no NumPy: importing
this package is cheap.  Units: bytes unless a name or docstring says
elements; GB = 10⁹ bytes, GiB = 2³⁰.  Bad sizes raise ``ValueError``.

One file per family, every formula importable from here:

- :mod:`~minipar.plan.collectives` — the ``*_volume(S, N)`` formulas: ring all-reduce 2(N−1)/N·S,
  reduce-scatter / all-gather (N−1)/N·S, parameter server N·S,
  nccl-tests bus bandwidth (Patarasuk & Yuan 2009; Horovod, arXiv
  1802.05799); the seed figure: 10¹² parameters × 2 bytes = 2 TB per sync.
- :mod:`~minipar.plan.zero` — ZeRO stages 0–3 and ZeRO-Offload
  (Rajbhandari et al. 2019, arXiv 1910.02054; Ren et al. 2021, arXiv
  2101.06840): (2+2+K)Ψ, 4Ψ + KΨ/N, 2Ψ + (2+K)Ψ/N, (2+2+K)Ψ/N.
- :mod:`~minipar.plan.model` — parameter count of minipar's GPT, dense or MoE.
- :mod:`~minipar.plan.tensor` — Megatron tensor parallelism (Shoeybi et
  al. 2019, arXiv 1909.08053): 2 + 2 all-reduces of b·s·h per layer.
- :mod:`~minipar.plan.activations` — activation memory per layer
  (Korthikanti et al. 2022, arXiv 2205.05198), Ulysses 4Nh/P (arXiv
  2309.14509), ring attention (arXiv 2310.01889).
- :mod:`~minipar.plan.pipeline` — GPipe bubble (K−1)/(M+K−1) and
  re-materialisation (Huang et al. 2018, arXiv 1811.06965); 1F1B and
  interleaved (1/v)(p−1)/m (Narayanan et al. 2021, arXiv 2104.04473).
- :mod:`~minipar.plan.checkpointing` — ⌈n/k⌉ + k, optimum near √n (Chen
  et al. 2016, arXiv 1604.06174).
- :mod:`~minipar.plan.moe` — expert capacity, load-balancing loss, all-to-all
  bytes (Switch, arXiv 2101.03961; GShard, arXiv 2006.16668).
- :mod:`~minipar.plan.hybrid` — 3D layouts n = p·t·d (arXiv 2104.04473).
- the layout planner (``minipar plan --cluster``), imported from its modules:
  :mod:`~minipar.plan.cluster` (GPUs per node, memory, links, peak),
  :mod:`~minipar.plan.layouts` (the space of d·t·p·c layouts, memory per GPU,
  ZeRO Table 2's largest models), :mod:`~minipar.plan.step_time` (the step
  estimate: GEMMs by shape on a roofline, memory-bound kernels, the interleaved
  bubble, exposed messages per axis), :mod:`~minipar.plan.search` (fit, rank: its
  ``search`` is imported from that module, ``from minipar.plan.search import search``),
  :mod:`~minipar.plan.presets` (GPT-3, PTD-P Table 1 and Llama 3 models; layouts as
  ``dp=16,tp=8,...`` text), :mod:`~minipar.plan.calibration` (the step model's three
  fitted constants and PTD-P Table 1) and :mod:`~minipar.plan.fit` (the fit and its
  leave-one-out residuals, docs/plan-calibration.md); :mod:`~minipar.plan.here` (minipar on
  this machine: the overlap its ZeRO-3 prefetch and ``--tp-overlap`` reach here, recorded
  from ``bench zero`` / ``bench tp``, apart from the published systems' constants).
- :mod:`~minipar.plan.human` — sizes as people read them (15.0 GB, 7.50 B).

The ``minipar plan`` verb is the front end :mod:`minipar.cli.plan`; this
package parses no options and imports no command line.
"""

from minipar.plan.activations import (
    ACTIVATION_MODES,
    activation_bytes,
    activation_bytes_per_layer,
    activation_table,
    megatron_sp_elements_per_link,
    minipar_activation_formula,
    ring_attention_bytes_per_rank,
    ulysses_alltoall_elements_per_link,
)
from minipar.plan.checkpointing import (
    checkpoint_memory,
    optimal_checkpoint_interval,
    recompute_forward_layers,
)
from minipar.plan.cluster import load_cluster
from minipar.plan.collectives import (
    BUSBW_OPS,
    algbw,
    all_gather_volume,
    all_to_all_volume,
    busbw,
    busbw_factor,
    gradient_sync,
    parameter_server_bytes_at_server,
    parameter_server_bytes_per_worker,
    reduce_scatter_volume,
    ring_allreduce_steps,
    ring_allreduce_volume,
)
from minipar.plan.hybrid import check_3d_layout, model_state_bytes_3d
from minipar.plan.layouts import (
    gpt_model,
    layout_memory,
    layout_space,
    model_from_params,
    zero_max_params,
)
from minipar.plan.model import (
    gpt_active_param_count,
    gpt_param_breakdown,
    gpt_param_count,
    moe_block_indices,
)
from minipar.plan.moe import (expert_capacity, load_balancing_loss, moe_alltoall_bytes_per_rank,
                              node_limited_dispatch_bytes)
from minipar.plan.pipeline import (
    bubble_fraction,
    bubble_time_ratio,
    gpipe_activation_bytes,
    gpipe_bubble_fraction,
    peak_microbatches_in_flight,
    pipeline_p2p_bytes_per_rank,
)
from minipar.plan.step_time import axis_traffic, estimate
from minipar.plan.tensor import (
    TP_ALLREDUCES_BACKWARD,
    TP_ALLREDUCES_FORWARD,
    tp_allreduce_bytes,
    tp_allreduces_per_layer,
    tp_bytes_per_rank,
    tp_bytes_per_rank_per_layer,
)
from minipar.plan.zero import (
    K_ADAM,
    STAGE_FORMULAS,
    STAGE_NAMES,
    mixed_precision_bytes_per_param,
    offload_pcie_bytes_per_step,
    zero_comm_bytes_per_rank,
    zero_comm_elements,
    zero_model_state_breakdown,
    zero_model_state_bytes,
    zero_offload_bytes,
    zero_table,
)

__all__ = [
    "ACTIVATION_MODES", "BUSBW_OPS", "K_ADAM", "STAGE_FORMULAS", "STAGE_NAMES",
    "TP_ALLREDUCES_BACKWARD", "TP_ALLREDUCES_FORWARD", "activation_bytes",
    "activation_bytes_per_layer", "activation_table", "algbw", "all_gather_volume",
    "all_to_all_volume", "axis_traffic", "bubble_fraction", "bubble_time_ratio", "busbw",
    "busbw_factor", "check_3d_layout", "checkpoint_memory", "estimate", "expert_capacity",
    "gpipe_activation_bytes", "gpipe_bubble_fraction", "gpt_active_param_count", "gpt_model",
    "gpt_param_breakdown", "gpt_param_count", "gradient_sync", "layout_memory", "layout_space",
    "load_balancing_loss", "load_cluster", "node_limited_dispatch_bytes",
    "megatron_sp_elements_per_link",
    "minipar_activation_formula", "mixed_precision_bytes_per_param", "model_from_params",
    "model_state_bytes_3d", "moe_alltoall_bytes_per_rank", "moe_block_indices",
    "offload_pcie_bytes_per_step", "optimal_checkpoint_interval",
    "parameter_server_bytes_at_server", "parameter_server_bytes_per_worker",
    "peak_microbatches_in_flight", "pipeline_p2p_bytes_per_rank", "recompute_forward_layers",
    "reduce_scatter_volume", "ring_allreduce_steps", "ring_allreduce_volume",
    "ring_attention_bytes_per_rank", "tp_allreduce_bytes", "tp_allreduces_per_layer",
    "tp_bytes_per_rank", "tp_bytes_per_rank_per_layer", "ulysses_alltoall_elements_per_link",
    "zero_comm_bytes_per_rank", "zero_comm_elements", "zero_max_params",
    "zero_model_state_breakdown", "zero_model_state_bytes", "zero_offload_bytes", "zero_table",
]
