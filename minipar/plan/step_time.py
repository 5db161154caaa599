"""Step time of a layout: FLOPs over the peak, the 1F1B bubble, α-β cost of each axis.

EN training step-time estimate · RU оценка времени шага обучения · ZH 训练步时间估计

**FLOPs** (Narayanan et al. 2021, arXiv 2104.04473, eq. 3; Korthikanti et al.
2022, arXiv 2205.05198, §6).  One layer's forward on B sequences of s tokens,
width h, MLP width f: 2Bs(4h² + 2hf) + 4Bs²h (= 24Bsh² + 4Bs²h for f = 4h),
the logits 2BshV; training is 3 forwards' worth:

    model FLOPs   72Bslh²(1 + s/(6h) + V/(12lh))         (f = 4h)
    + full remat  one more forward of every layer: 96Bslh²(1 + s/(6h) + V/(16lh)), PTD-P's eq. 3
    + selective   Korthikanti's hardware count 72Bslh²(1 + s/(3h) + V/(12lh)): the
                  attention core (QKᵀ, A·V) counted twice, + 12Bs²h per layer

(the Megatron-LM README's MFU / HFU for Korthikanti's 22B, 175B, 530B and 1T
runs, 41.5/43.7, 51.4/52.8, 56.0/57.0, 56.3/57.0 %, are in exactly the
ratio of the last two lines).

**Time of one micro-batch on one stage**, T_mb = hardware FLOPs / (n·m) /
(peak × efficiency) + the tensor-, context- and pipeline-parallel messages of
that micro-batch; 1F1B runs (m + p − 1) of them (bubble / ideal = (p − 1)/m,
:func:`~minipar.plan.pipeline.bubble_time_ratio`); the data-parallel
reduction follows the flush.  **No overlap is assumed**: every message waits
(real systems hide part of the DP and CP traffic behind compute, so the
estimates are upper bounds on time and lower bounds on MFU).

**Traffic per axis**, bytes one rank sends per step, each message costing
α + S/β (the α-β model, ring collectives): α and β of NVLink when the axis's
group lies in one node; across nodes the network's α, and β = g × the
network bandwidth of one GPU, g the group's ranks per node (a DGX has one
NIC per GPU and NCCL drives them all at once; a group with one rank per
node — tensor parallelism placed across servers — gets one NIC's worth):

- tp: 4 all-reduces (2 forward, 2 backward; with SP the same bytes as RS + AG
  pairs) of b·(s/c)·h per layer per micro-batch, 6 with full remat (the
  recomputed forward's two); each 2(t−1)/t × S in 2(t−1) steps
  (:func:`~minipar.plan.tensor.tp_allreduce_bytes`, arXiv 1909.08053);
- cp: ring attention passes K and V blocks c − 1 times per layer forward,
  (c − 1)·2·b·(s/c)·(h/t) elements (:func:`~minipar.plan.activations.ring_attention_bytes_per_rank`);
  backward the same K, V hops plus their accumulators dK, dV, which travel
  with them and take one hop more to come home: c·2·b·(s/c)·(h/t) elements in
  the compute dtype (fp32 for 16-bit storage), c messages (what
  :func:`minipar.parallel.context_parallel.measure.ring_backward_bytes` counts);
  full remat + 1 forward;
- pp: per micro-batch the activation forward and its gradient backward,
  b·(s/c)·h/t each (PTD-P's scatter/gather: each tensor rank sends its 1/t;
  :func:`~minipar.plan.pipeline.pipeline_p2p_bytes_per_rank`);
- dp: over the N = d·c replicas, S = the stage's parameters × bytes: ZeRO 0
  and 1 one all-reduce (RS + AG, 2(N−1)/N·S: ZeRO's 2Ψ); ZeRO 2 reduce-scatters
  each micro-batch's gradients (no full gradient buffer to accumulate in) and
  all-gathers once, (m + 1)(N−1)/N·S; ZeRO 3 all-gathers the parameters for
  every micro-batch's forward and backward and reduce-scatters its gradients,
  3m(N−1)/N·S — the paper's 1.5 × at m = 1 (arXiv 1910.02054, §7).

MFU = model FLOPs / (step time × n × peak); HFU counts the recomputation.
"""

from __future__ import annotations

from minipar.plan.activations import ring_attention_bytes_per_rank
from minipar.plan.cluster import Cluster
from minipar.plan.collectives import (
    all_gather_volume,
    reduce_scatter_volume,
    ring_allreduce_steps,
    ring_allreduce_volume,
)
from minipar.plan.layouts import (
    Layout,
    ModelSpec,
    check_layout,
    layout_memory,
    stage_param_count,
)
from minipar.plan.pipeline import bubble_time_ratio, pipeline_p2p_bytes_per_rank
from minipar.plan.tensor import tp_allreduce_bytes
from minipar.plan.zero import K_ADAM

AXES = ("tp", "cp", "pp", "dp")


def layer_forward_flops(model: ModelSpec, sequences: float) -> float:
    """FLOPs of one layer's forward: 2Bs(4h² + 2hf) + 4Bs²h (QKV, proj, MLP; QKᵀ and A·V)."""
    s, h, f = model.seq, model.hidden, model.d_ff
    return sequences * (2 * s * (4 * h * h + 2 * h * f) + 4 * s * s * h)


def model_flops(model: ModelSpec, global_batch: float) -> float:
    """Model FLOPs of one step: 3 × (L layers' forward + the logits 2BshV)."""
    B = global_batch
    return 3 * (model.n_layer * layer_forward_flops(model, B)
                + 2 * B * model.seq * model.hidden * model.vocab)


def hardware_flops(model: ModelSpec, global_batch: float, remat: str) -> float:
    """Model FLOPs plus what ``remat`` recomputes: full +1 layer forward, selective +12Bs²h
    per layer (Korthikanti et al. 2022's count)."""
    out = model_flops(model, global_batch)
    if remat == "full":
        out += model.n_layer * layer_forward_flops(model, global_batch)
    elif remat == "selective":
        out += model.n_layer * 12 * global_batch * model.seq ** 2 * model.hidden
    return out


def axis_groups(lay: Layout) -> dict[str, tuple[int, int]]:
    """(stride, size) of each axis's group in the rank numbering of ``lay.placement``.

    ``tp-inner``: tp varies fastest, then cp, dp, pp (Megatron's order);
    ``pp-inner``: pp, dp, cp, tp.  ``dp`` is the d·c replicas of one shard.
    """
    order = ("t", "c", "d", "p") if lay.placement == "tp-inner" else ("p", "d", "c", "t")
    stride, st = 1, {}
    for ax in order:
        st[ax] = stride
        stride *= getattr(lay, ax)
    return {"tp": (st["t"], lay.t), "cp": (st["c"], lay.c), "pp": (st["p"], lay.p),
            "dp": (min(st["d"], st["c"]), lay.d * lay.c)}


def within_node(stride: int, size: int, gpus_per_node: int) -> bool:
    """A group of ``size`` ranks ``stride`` apart lies in one node (every copy of it, aligned)."""
    span = stride * size
    return size == 1 or (span <= gpus_per_node and gpus_per_node % span == 0)


def members_per_node(stride: int, size: int, gpus_per_node: int) -> int:
    """How many ranks of a group ``stride`` apart share a node: min(size, G // stride), ≥ 1."""
    return max(1, min(size, gpus_per_node // stride))


def group_bandwidth(cluster: Cluster, stride: int, size: int) -> float:
    """β of a ring over the group: NVLink inside a node; across nodes, the network links of
    the g members in each node at once (NCCL's channels, one NIC per GPU on a DGX):
    min(g·β_net, β_NVLink)."""
    G = cluster.gpus_per_node
    if within_node(stride, size, G):
        return cluster.intra_bw
    return min(cluster.intra_bw, members_per_node(stride, size, G) * cluster.inter_bw)


def axis_traffic(model: ModelSpec, lay: Layout, cluster: Cluster | None, itemsize: int = 2
                 ) -> dict[str, dict[str, float | int | bool]]:
    """Per axis: ``bytes`` one rank sends per step, ``messages`` and the group ``size``; with a
    cluster also ``seconds`` (α-β, ring), ``within_node``, and for tp/cp/pp
    ``seconds_per_microbatch``.  ``cluster=None``: bytes only (a small run's counters)."""
    b, t, c, m, L_st = lay.b, lay.t, lay.c, lay.m, model.n_layer // lay.p
    s_loc, h, e = model.seq // c, model.hidden, itemsize
    groups = axis_groups(lay)
    out: dict[str, dict[str, float | int | bool]] = {}

    def put(axis: str, nbytes: float, msgs: float, steps_alpha: float, per_mb: bool) -> None:
        out[axis] = {"bytes": nbytes, "messages": msgs, "size": groups[axis][1]}
        if cluster is None:
            return
        inside = within_node(*groups[axis], cluster.gpus_per_node)
        secs = steps_alpha * cluster.latency(inside) + nbytes / group_bandwidth(
            cluster, *groups[axis])
        out[axis].update(seconds=secs, within_node=inside)
        if per_mb:
            out[axis]["seconds_per_microbatch"] = secs / m

    full = lay.remat == "full"
    n_ar = (6 if full else 4) * m * L_st if t > 1 else 0
    vol = ring_allreduce_volume(tp_allreduce_bytes(b, s_loc, h, e), t)
    put("tp", n_ar * vol, n_ar, n_ar * ring_allreduce_steps(t), True)
    layers_mb = m * L_st if c > 1 else 0  # one ring backward per layer and micro-batch
    fwd = (2 if full else 1) * layers_mb  # forwards: the recomputed one too
    ring = ring_attention_bytes_per_rank(model.seq, b, h // t, c, e)
    acc = 4 if e == 2 else e  # dK, dV in the compute dtype: fp32 for 16-bit storage
    grads = 2.0 * b * model.seq * (h // t) * acc  # dK, dV: c hops of b·(s/c)·(h/t) each
    put("cp", (fwd + layers_mb) * ring + layers_mb * grads, fwd + layers_mb,
        fwd * (c - 1) + layers_mb * c, True)
    p2p = 2 * m if lay.p > 1 else 0
    pp_bytes = pipeline_p2p_bytes_per_rank(b, s_loc, h // t, m, 1, e) if lay.p > 1 else 0.0
    put("pp", pp_bytes, p2p, p2p, True)
    N = lay.d * c
    share = max(stage_param_count(model, lay.p, t, i) for i in {0, lay.p - 1}) * e
    # ZeRO-2 as DeepSpeed: a reduce-scatter per micro-batch, the gradients never whole (minipar's
    # hybrid reduce-scatters once after the flush and holds them whole until then)
    n_rs, n_ag = {0: (1, 1), 1: (1, 1), 2: (m, 1), 3: (m, 2 * m)}[lay.zero] if N > 1 else (0, 0)
    dp_bytes = n_rs * reduce_scatter_volume(share, N) + n_ag * all_gather_volume(share, N)
    put("dp", dp_bytes, n_rs + n_ag, (n_rs + n_ag) * (N - 1), False)
    return out


def estimate(model: ModelSpec, lay: Layout, cluster: Cluster, global_batch: int,
             itemsize: int = 2, K: float = K_ADAM, memory: dict[str, float] | None = None
             ) -> dict[str, object]:
    """Memory, traffic per axis, bubble, step time, MFU and HFU of one layout.

    ``memory``: :func:`~minipar.plan.layouts.layout_memory` of ``lay`` if already known.
    """
    check_layout(model, lay, global_batch=global_batch)
    mem = layout_memory(model, lay, itemsize, K) if memory is None else memory
    traffic = axis_traffic(model, lay, cluster, itemsize)
    n = lay.n
    compute_mb = (hardware_flops(model, global_batch, lay.remat) / (n * lay.m)
                  / (cluster.peak_flops * cluster.efficiency))
    t_mb = compute_mb + sum(float(traffic[a]["seconds_per_microbatch"]) for a in ("tp", "cp", "pp"))
    pipeline_s = (lay.m + lay.p - 1) * t_mb
    step = pipeline_s + float(traffic["dp"]["seconds"])
    peak = step * n * cluster.peak_flops
    return {
        "layout": lay.as_dict(), "n": n, "memory": mem,
        "fits": mem["total"] <= cluster.memory_bytes,
        "traffic": traffic,
        "compute_s": compute_mb * lay.m, "microbatch_s": t_mb,
        "bubble_ratio": bubble_time_ratio(lay.p, lay.m), "bubble_s": (lay.p - 1) * t_mb,
        "step_s": step,
        "mfu": model_flops(model, global_batch) / peak,
        "hfu": hardware_flops(model, global_batch, lay.remat) / peak,
        "tokens_per_s": global_batch * model.seq / step,
    }
