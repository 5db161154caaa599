"""Step time of a layout, an estimate: GEMMs by shape, memory-bound kernels, bubble, messages.

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
ratio of the last two lines).  For models not shaped like GPT-3 (grouped-query
attention, SwiGLU, f ≠ 4h) the layer's FLOPs are the sum over its GEMMs
(:func:`layer_gemms`); for GPT-3's shape that sum is the formula above.

**The step: an estimate** (:func:`estimate`), not a bound.  Per micro-batch on one
device of a stage (:func:`microbatch_parts`):

- GEMMs, each from its shape (:func:`layer_gemms`), by a roofline: max(FLOPs/(η·peak),
  bytes/(η_HBM·HBM)) + t₀ per kernel (Williams, Waterman & Patterson 2009, "Roofline",
  CACM 52(4)); the fixed t₀ makes small GEMMs less efficient than big ones.  Backward
  is two GEMMs of each forward shape.  Errs fast for odd shapes (wave quantisation and
  tile padding are not modelled) and slow for flash attention (no causal saving);
- memory-bound kernels from the bytes they move over the HBM bandwidth
  (:func:`memory_bound_bytes`; backward twice the forward), the optimizer step 30
  bytes per parameter of its shard + 4 per held parameter (fp32 master, m, v read and
  written, the gradient read, the 16-bit copy written);
- recomputation: full runs each layer's forward again with its tensor-parallel
  messages; selective the attention core (QKᵀ, softmax, dropout, A·V);
- tensor/sequence parallel: 2 + 2 ring all-reduces (or RS + AG pairs: the same
  bytes) per layer, all exposed (Megatron-LM of 2021 did not overlap them: errs slow
  for systems that do);
- context parallelism: ``ring`` — c − 1 hops of K, V forward (c with dK, dV backward),
  each hidden behind one block of attention (Liu et al. 2023, arXiv 2310.01889);
  ``allgather`` — Llama 3's all-gather of K, V and reduce-scatter of their gradients,
  exposed (Dubey et al. 2024, arXiv 2407.21783, §3.3.2; grouped-query attention keeps
  them small);
- pipeline: 2v point-to-point messages per micro-batch (forward activation, backward
  gradient of each of the v chunks), exposed;
- ZeRO-3: each layer's all-gather forward, all-gather and reduce-scatter backward, one
  collective per weight matrix (4 per layer, as DeepSpeed gathers by module) with α
  per ring step (N − 1 of them each); prefetched one layer ahead, the share
  ``zero3_overlap`` of the layer's compute hides them (default 0: exposed, as DeepSpeed's
  ZeRO-3 behaved in PTD-P's Table 2; still errs fast there, see docs/plan-calibration.md).

Step = m × the slowest stage's micro-batch (the last stage has the logits) + (p − 1)/v
micro-batches at the mean stage time (the interleaved bubble, PTD-P §2.2.2) + the
data-parallel reduction — overlapped with the last micro-batch's backward when
``overlap`` (one layer's bucket always exposed; PyTorch DDP's bucketing, Li et al.
2020, arXiv 2006.15704), whole after the flush otherwise (Megatron's local DDP of
2021) — + the optimizer step.  α-β messages reach ``link_efficiency`` of the links'
bandwidth.  η, t₀ and the link share are fitted on PTD-P's Table 1
(:mod:`minipar.plan.calibration`); HBM at 80 % is an assumption.  Not modelled (each
errs fast): stragglers and jitter, data loading, kernel-launch gaps between
micro-batches, the embedding's all-reduce across the first and last stages.

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
  full remat + 1 forward; with grouped-query attention only the K key/value heads
  travel; the other kinds by :func:`~minipar.plan.activations.cp_bytes_per_layer`
  (all-gather, Ulysses, USP: the closed forms of what the code counts);
- pp: per micro-batch and model chunk (v of them, interleaved) the activation forward
  and its gradient backward, b·(s/c)·h/t each (PTD-P's scatter/gather: each tensor
  rank sends its 1/t;
  :func:`~minipar.plan.pipeline.pipeline_p2p_bytes_per_rank`);
- dp: over the N = d·c replicas, S = the stage's parameters × bytes: ZeRO 0
  and 1 one all-reduce (RS + AG, 2(N−1)/N·S: ZeRO's 2Ψ); ZeRO 2 reduce-scatters
  each micro-batch's gradients (no full gradient buffer to accumulate in) and
  all-gathers once, (m + 1)(N−1)/N·S; ZeRO 3 all-gathers the parameters for
  every micro-batch's forward and backward and reduce-scatters its gradients,
  3m(N−1)/N·S — the paper's 1.5 × at m = 1 (arXiv 1910.02054, §7).  Under
  ``schedule=dualpipe``/``dualpipev`` S is the two stages a rank holds; DualPipe's two
  copies are first summed over ranks s and p − 1 − s (``pp_mirror``: a 2-rank ring
  all-reduce, S bytes), exposed after the flush like the dp reduction.

MFU = model FLOPs / (step time × n × peak); HFU counts the recomputation.
"""

from __future__ import annotations

from dataclasses import replace

from minipar.plan.activations import cp_bytes_per_layer
from minipar.plan.calibration import CONSTANTS
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
    schedule_param_count,
    stage_param_count,
)
from minipar.plan.pipeline import bubble_formula, pipeline_p2p_bytes_per_rank
from minipar.plan.tensor import tp_allreduce_bytes
from minipar.plan.zero import K_ADAM

AXES = ("tp", "cp", "pp", "dp")


def layer_gemms(model: ModelSpec, b: int, t: int = 1, c: int = 1) -> list[tuple[str, float, float,
                                                                              float, float]]:
    """The GEMMs of one layer's forward on one tensor rank: ``(name, batch, M, N, K)``.

    For b sequences of s/c query tokens (T = b·s/c), width h, a heads of d = h/a, g
    key/value heads, MLP width f (Megatron's split: QKV and W_in by columns, the
    projections by rows; Shoeybi et al. 2019, arXiv 1909.08053):

    ==========  =======  =======  ============  ==========
    GEMM        batch    M        N             K
    ==========  =======  =======  ============  ==========
    qkv         1        T        (h + 2g·d)/t  h
    scores QKᵀ  b·a/t    s/c      s             d
    A·V         b·a/t    s/c      d             s
    proj        1        T        h             h/t
    mlp_in      1        T        f/t (2f/t     h
                                  SwiGLU)
    mlp_out     1        T        h             f/t
    ==========  =======  =======  ============  ==========

    Each costs 2·batch·M·N·K FLOPs; the sum for g = a, f = 4h is PTD-P's
    2Bs(4h² + 2hf) + 4Bs²h per layer (eq. 3's derivation; Korthikanti et al. 2022 §6).
    The full s × s score matrix is counted, as PTD-P does (no causal saving).
    """
    s_c, h, a, d = model.seq / c, model.hidden, model.heads, model.head_dim
    T, f = b * s_c, model.d_ff
    return [("qkv", 1, T, (h + 2 * model.groups * d) / t, h),
            ("scores", b * a / t, s_c, model.seq, d),
            ("av", b * a / t, s_c, d, model.seq),
            ("proj", 1, T, h, h / t),
            ("mlp_in", 1, T, (2 if model.gated else 1) * f / t, h),
            ("mlp_out", 1, T, h, f / t)]


def gemm_flops(batch: float, M: float, N: float, K: float) -> float:
    """2·batch·M·N·K: one multiply and one add per term."""
    return 2.0 * batch * M * N * K


def layer_forward_flops(model: ModelSpec, sequences: float) -> float:
    """FLOPs of one layer's forward: the sum of :func:`layer_gemms` (GPT-3 shape:
    2Bs(4h² + 2hf) + 4Bs²h)."""
    return sequences * sum(gemm_flops(*g[1:]) for g in layer_gemms(model, 1))


def logits_flops(model: ModelSpec, sequences: float) -> float:
    """The output layer's forward, 2BshV."""
    return 2.0 * sequences * model.seq * model.hidden * model.vocab


def model_flops(model: ModelSpec, global_batch: float) -> float:
    """Model FLOPs of one step: 3 × (L layers' forward + the logits 2BshV) — for GPT-3's
    shape PTD-P's 72Bslh²(1 + s/(6h) + V/(12lh)) (backward is twice the forward)."""
    B = global_batch
    return 3 * (model.n_layer * layer_forward_flops(model, B) + logits_flops(model, B))


def hardware_flops(model: ModelSpec, global_batch: float, remat: str) -> float:
    """Model FLOPs plus what ``remat`` recomputes: full +1 layer forward (PTD-P eq. 3,
    96Bslh²(1 + s/(6h) + V/(16lh))), selective +12Bs²h per layer (Korthikanti et al.
    2022's count, whose HFU/MFU ratios the Megatron-LM README's figures match)."""
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
    acc = 4 if e == 2 else e  # dK, dV in the compute dtype: fp32 for 16-bit storage
    f_cp, b_cp = cp_bytes_per_layer(lay.cp_kind, b, model.seq, model.heads // t,
                                    max(model.groups // t, 1), model.head_dim, c, lay.ulysses,
                                    e, acc) if c > 1 else (0.0, 0.0)
    put("cp", fwd * f_cp + layers_mb * b_cp, fwd + layers_mb,
        fwd * (c - 1) + layers_mb * c, True)
    p2p = 2 * m * lay.v if lay.p > 1 else 0
    pp_bytes = pipeline_p2p_bytes_per_rank(b, s_loc, h // t, m, lay.v, e) if lay.p > 1 else 0.0
    put("pp", pp_bytes, p2p, p2p, True)
    N = lay.d * c
    # the fuller end's parameters (DualPipe, DualPipe-V: the two stages a rank holds)
    share = max(schedule_param_count(model, lay, i) for i in {0, lay.p - 1}) * e
    # ZeRO-2 as DeepSpeed: a reduce-scatter per micro-batch, the gradients never whole (minipar's
    # hybrid reduce-scatters once after the flush and holds them whole until then)
    n_rs, n_ag = {0: (1, 1), 1: (1, 1), 2: (m, 1), 3: (m, 2 * m)}[lay.zero] if N > 1 else (0, 0)
    dp_bytes = n_rs * reduce_scatter_volume(share, N) + n_ag * all_gather_volume(share, N)
    put("dp", dp_bytes, n_rs + n_ag, (n_rs + n_ag) * (N - 1), False)
    if lay.schedule == "dualpipe":  # the two copies summed: ranks s and p - 1 - s, a ring of 2
        out["pp_mirror"] = {"bytes": share, "messages": 2, "size": 2}
        if cluster is not None:
            inside = within_node(*groups["pp"], cluster.gpus_per_node)
            out["pp_mirror"].update(seconds=2 * cluster.latency(inside) + share / group_bandwidth(
                cluster, *groups["pp"]), within_node=inside)
    return out


def _kernel(flops: float, nbytes: float, cluster: Cluster, k: dict[str, float]) -> float:
    """Roofline time of one kernel: max(FLOPs/(η·peak), bytes/(η_HBM·HBM)) + t₀."""
    return (max(flops / (cluster.peak_flops * cluster.efficiency),
                nbytes / (cluster.hbm_bw * k["hbm_efficiency"]))
            + k["kernel_overhead_us"] * 1e-6)


def _collective(cluster: Cluster, group: tuple[int, int], nbytes: float, steps: float,
                k: dict[str, float]) -> float:
    """α-β time of a ring collective that sends ``nbytes`` per rank in ``steps`` steps."""
    inside = within_node(*group, cluster.gpus_per_node)
    return (steps * cluster.latency(inside)
            + nbytes / (group_bandwidth(cluster, *group) * k["link_efficiency"]))


def microbatch_parts(model: ModelSpec, lay: Layout, cluster: Cluster, last_stage: bool,
                     k: dict[str, float] | None = None, itemsize: int = 2) -> dict[str, float]:
    """Seconds one micro-batch spends on one device of a pipeline stage, by part.

    ``gemm`` the forward and backward GEMMs of its L/p layers (backward = two GEMMs
    of the forward's shape, dgrad and wgrad) and, on the last stage, the logits;
    ``memory`` the memory-bound kernels (:func:`memory_bound_bytes`); ``recompute``
    what the remat mode runs again; ``tp``, ``cp`` the exposed tensor- and context-
    parallel messages; ``pp`` its point-to-point messages; ``zero3`` the exposed part
    of ZeRO-3's per-layer all-gathers and reduce-scatters; ``backward`` the backward's
    compute alone (what a gradient reduction can hide behind).
    """
    k = CONSTANTS if k is None else k
    b, t, c, v = lay.b, lay.t, lay.c, lay.v
    L_st, e = model.n_layer // lay.p, itemsize
    groups = axis_groups(lay)
    gemms = layer_gemms(model, b, t, c)
    attn = ("scores", "av")
    fwd_g = {nm: _kernel(gemm_flops(bt, M, N, K), e * bt * (M * K + K * N + M * N), cluster, k)
             for nm, bt, M, N, K in gemms}
    if lay.flash:  # one fused kernel, compute-bound (Dao et al. 2022, arXiv 2205.14135)
        fl = sum(gemm_flops(*g[1:]) for g in gemms if g[0] in attn)
        fwd_g["scores"], fwd_g["av"] = _kernel(fl, 0.0, cluster, k), 0.0
    mem_f, mem_attn = memory_bound_bytes(model, lay, itemsize)
    hbm = cluster.hbm_bw * k["hbm_efficiency"]
    n_mem_kernels = 7
    t_mem_f = (mem_f + mem_attn) / hbm + n_mem_kernels * k["kernel_overhead_us"] * 1e-6
    layer_f = sum(fwd_g.values()) + t_mem_f
    # tensor parallelism: 2 all-reduces (or RS + AG pairs, the same bytes) forward, 2 backward
    tp_one = 0.0
    if t > 1:
        S = b * model.seq / c * model.hidden * e
        tp_one = _collective(cluster, groups["tp"], ring_allreduce_volume(S, t),
                             ring_allreduce_steps(t), k)
    # context parallelism
    cp_f = cp_b = 0.0
    if c > 1:
        kv = 2.0 * b * model.seq / c * model.groups * model.head_dim / t * e  # K and V chunk
        attn_f = fwd_g["scores"] + fwd_g["av"]
        if lay.cp_kind in ("ring", "usp"):  # hops, each hidden behind one block of attention
            u = lay.ulysses if lay.cp_kind == "usp" else 1
            r, g = c // u, max(model.groups // t, 1)
            kv_r = kv * max(g, u) / g  # USP: the ring's chunk, s/R positions of K'/U heads
            hop = _collective(cluster, groups["cp"], kv_r, 1, k)
            cp_f = (r - 1) * max(0.0, hop - attn_f / r)
            hop_b = _collective(cluster, groups["cp"], kv_r * (1 + (4 if e == 2 else e) / e), 1,
                                k)
            cp_b = r * max(0.0, hop_b - 2 * attn_f / r) if r > 1 else 0.0
            if u > 1:  # USP: the group's all-to-alls, exposed, each way
                a2a = cp_bytes_per_layer("ulysses", b, model.seq // r, model.heads // t, g,
                                         model.head_dim, u, 1, e)[0]
                cp_f += _collective(cluster, groups["cp"], a2a, u - 1, k)
                cp_b += _collective(cluster, groups["cp"], a2a, u - 1, k)
        else:  # Llama 3: all-gather K, V before attention, reduce-scatter dK, dV; exposed
            cp_f = _collective(cluster, groups["cp"], (c - 1) * kv, c - 1, k)
            cp_b = cp_f
    recompute = 0.0
    if lay.remat == "full":
        recompute = layer_f + 2 * tp_one + cp_f
    elif lay.remat == "selective":
        recompute = fwd_g["scores"] + fwd_g["av"] + (0 if lay.flash else mem_attn / hbm)
    # ZeRO-3: all-gather each layer's parameters forward and backward, reduce-scatter its
    # gradients, prefetched one layer ahead: only what the layer's compute cannot hide
    zero3 = 0.0
    N = lay.d * c
    if lay.zero == 3 and N > 1:
        P = stage_param_count(model, lay.p, t, 1 if lay.p > 2 else 0) / L_st * e
        # one collective per weight (qkv, proj, mlp_in, mlp_out: DeepSpeed gathers by module)
        ag = _collective(cluster, groups["dp"], all_gather_volume(P, N), 4 * (N - 1), k)
        fwd_hide = (layer_f + 2 * tp_one) * k.get("zero3_overlap", 0.0)
        zero3 = (max(0.0, ag - fwd_hide) + max(0.0, 2 * ag - 2 * fwd_hide)
                 + (max(0.0, ag - fwd_hide) if lay.remat == "full" else 0.0))
    gemm = 3 * sum(fwd_g.values())
    logits = 0.0
    if last_stage:
        lg = ("logits", 1, b * model.seq / c, model.vocab / t, model.hidden)
        logits = 3 * _kernel(gemm_flops(*lg[1:]), e * (lg[2] * lg[4] + lg[4] * lg[3]
                                                        + lg[2] * lg[3]), cluster, k)
        logits += 16 * b * model.seq / c * model.vocab / t / hbm  # softmax cross-entropy
    pp = 0.0
    if lay.p > 1:
        S = b * model.seq / c * model.hidden / t * e
        pp = 2 * v * _collective(cluster, groups["pp"], S, 1, k)
    out = {"gemm": L_st * gemm + logits, "memory": L_st * 3 * t_mem_f,
           "recompute": L_st * recompute, "tp": L_st * 4 * tp_one, "cp": L_st * (cp_f + cp_b),
           "pp": pp, "zero3": L_st * zero3}
    out["backward"] = L_st * (2 * sum(fwd_g.values()) + 2 * t_mem_f + recompute)
    out["total"] = sum(out[x] for x in ("gemm", "memory", "recompute", "tp", "cp", "pp",
                                        "zero3"))
    return out


def memory_bound_bytes(model: ModelSpec, lay: Layout, itemsize: int = 2) -> tuple[float, float]:
    """HBM bytes the memory-bound kernels of one layer's forward move on one rank:
    (per-token kernels, attention-score kernels).  Backward moves twice as much.

    T = b·s/c tokens, 16-bit activations, each kernel reads its inputs and writes its
    output once (fused as Megatron-LM fuses them): two LayerNorms 4 bytes per element of
    T·h; two bias-dropout-adds 7 (two inputs, one output, a 1-byte mask; Llama's
    residual adds 6); GeLU with its bias 4 per element of T·f/t (SwiGLU 6); rotary
    embeddings (Llama) 4 per element of q and k; without flash attention the scaled,
    masked softmax 4 and its dropout 5 (Llama: no dropout) per score, b·(a/t)·(s/c)·s.
    Without sequence parallelism the LayerNorms and dropouts run on the whole T·h on
    every tensor rank (Korthikanti et al. 2022, §4.2.2: the part SP splits).
    """
    b, t, c = lay.b, lay.t, lay.c
    T, h, f = b * model.seq / c, model.hidden, model.d_ff
    e2 = itemsize / 2
    rep = 1 / t if (lay.sp and t > 1) else 1.0
    llama = model.family == "llama"
    tok = T * h * rep * (2 * 4 + 2 * (6 if llama else 7))
    tok += T * f / t * (6 if model.gated else 4)
    if llama:
        tok += 4 * T * (h + model.groups * model.head_dim) / t
    scores = 0.0 if lay.flash else b * model.heads / t * (model.seq / c) * model.seq * (
        4 if llama else 9)
    return tok * e2, scores * e2


def estimate(model: ModelSpec, lay: Layout, cluster: Cluster, global_batch: int,
             itemsize: int = 2, K: float = K_ADAM, memory: dict[str, float] | None = None,
             constants: dict[str, float] | None = None) -> dict[str, object]:
    """Memory, traffic per axis, step time by part, MFU and HFU of one layout: an estimate.

    ``memory``: :func:`~minipar.plan.layouts.layout_memory` of ``lay`` if already known;
    ``constants``: the step model's constants (default the fitted
    :data:`~minipar.plan.calibration.CONSTANTS`).  The step (interleaved 1F1B, v
    chunks per device; Narayanan et al. 2021): m micro-batches through the slowest
    stage, plus (p − 1)/v micro-batches' worth of bubble at the mean stage time, plus
    the exposed data-parallel reduction and the optimizer step.
    """
    check_layout(model, lay, global_batch=global_batch)
    k = CONSTANTS if constants is None else {**CONSTANTS, **constants}
    if constants is not None and "gemm_efficiency" in constants:
        cluster = replace(cluster, efficiency=constants["gemm_efficiency"])
    mem = layout_memory(model, lay, itemsize, K) if memory is None else memory
    traffic = axis_traffic(model, lay, cluster, itemsize)
    n, m, p, v = lay.n, lay.m, lay.p, lay.v
    first = microbatch_parts(model, lay, cluster, p == 1, k, itemsize)
    last = first if p == 1 else microbatch_parts(model, lay, cluster, True, k, itemsize)
    slow = max(first, last, key=lambda x: x["total"])
    mean = (first["total"] * (p - 1) + last["total"]) / p
    steady = m * slow["total"]
    # the schedule's bubble over its ideal time (1F1B: (p - 1)/(v·m); DualPipe's table with
    # F : B : W = 1 : 2 : 1), times the m micro-batches' mean stage time
    ratio = bubble_formula(lay.schedule, p, m, v)["ratio"]
    bubble = float(ratio) * m * mean
    # data parallelism: the gradient reduction after the last micro-batch's backward,
    # hidden behind that backward when overlapped (buckets: one layer's worth exposed)
    N = lay.d * lay.c
    dp_s = 0.0
    if N > 1 and lay.zero != 3:  # ZeRO-3's collectives are per layer, in zero3 above
        dp_s = _collective(cluster, axis_groups(lay)["dp"], float(traffic["dp"]["bytes"]),
                           float(traffic["dp"]["messages"]) * (N - 1), k)
    if lay.overlap and dp_s:
        L_st = model.n_layer // p
        dp_exposed = max(dp_s / L_st, dp_s - (m if lay.zero == 2 else 1) * slow["backward"])
    else:
        dp_exposed = dp_s
    if "pp_mirror" in traffic:  # DualPipe's copies summed after the flush, before the dp sum
        dp_exposed += float(traffic["pp_mirror"]["seconds"])
    share = max(schedule_param_count(model, lay, i) for i in {0, p - 1})
    shard = share / N if lay.zero >= 1 else share
    optimizer = (30 * shard + 4 * share) / (cluster.hbm_bw * k["hbm_efficiency"])
    step = steady + bubble + dp_exposed + optimizer
    parts = {x: m * slow[x] for x in ("gemm", "memory", "recompute", "tp", "cp", "pp", "zero3")}
    parts.update(bubble=bubble, dp=dp_exposed, optimizer=optimizer)
    peak = step * n * cluster.peak_flops
    hw = hardware_flops(model, global_batch, lay.remat)
    mf = model_flops(model, global_batch)
    return {
        "layout": lay.as_dict(), "n": n, "memory": mem,
        "fits": mem["total"] <= cluster.memory_bytes,
        "traffic": traffic, "parts_s": parts,
        "compute_s": parts["gemm"], "microbatch_s": slow["total"],
        "bubble_ratio": float(ratio), "bubble_s": bubble,
        "step_s": step,
        "mfu": mf / peak, "hfu": hw / peak,
        "tflops_per_gpu": hw / step / n / 1e12,
        "model_tflops_per_gpu": mf / step / n / 1e12,
        "tokens_per_s": global_batch * model.seq / step,
    }
