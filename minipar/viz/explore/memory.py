"""Memory per device by kind, for every axis minipar builds: the memory explorer.

EN memory explorer · RU память на устройство · ZH 每设备内存

:func:`memory` answers "what does one GPU hold?" for a model (a preset or minipar's own
small GPT) laid out as dp · tp · pp · cp (· ep for a mixture of experts) with a ZeRO
stage, sequence parallelism, recomputation, optimizer offload and a precision, by kind:
parameters, gradients, optimizer states (ZeRO, Rajbhandari et al. 2019, arXiv 1910.02054),
activations (Korthikanti et al. 2022, arXiv 2205.05198, times the micro-batches the
schedule keeps in flight on the stage, counted by the package's own schedules),
communication buffers, and what was offloaded to the host (ZeRO-Offload, Ren et al. 2021,
arXiv 2101.06840).  Every number is :mod:`minipar.plan`'s: with the 1F1B schedule and no
offload, buffers or experts the total is :func:`minipar.plan.layouts.layout_memory`'s, and
for minipar's own GPT in float64 the model states are what ``minipar run zero`` measures
(:func:`minipar.viz.explore.predict.measure_model_states`).

A new option is one entry: :data:`MODELS` (a preset), :data:`PRECISIONS`, :data:`DEVICES`,
:data:`CP_KINDS`, and the schedules are :data:`minipar.parallel.pipeline.schedule.KINDS`.
Assumptions the planner does not make, named where they enter: a data-parallel
gradient bucket of 25 MB (PyTorch DDP's ``bucket_cap_mb``) as the communication buffer
of ZeRO 0–2, two layers of gathered parameters (the current and the prefetched) for
ZeRO-3; the experts of a mixture split over ep ranks and their states over the d·c/ep
replicas of each expert; context parallelism's key/value buffers of one layer's attention
(:data:`CP_KINDS`: ``ring`` the block received beside the one held, 2 × 2·b·(s/c)·g·d_h/t
elements; ``allgather``, Llama 3's, the whole sequence's K and V gathered,
2·b·s·g·d_h/t; g the key/value heads, d_h the head width); embeddings' and workspace
buffers are not counted.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

from matplotlib.figure import Figure

from minipar.parallel.pipeline.measure import in_flight
from minipar.parallel.pipeline.schedule import KINDS, stage_schedule
from minipar.plan.cluster import PRESETS as CLUSTERS
from minipar.plan.layouts import (
    REMATS,
    Layout,
    ModelSpec,
    activation_bytes_layer,
    check_layout,
    gpt_model,
    llama_model,
    stage_param_count,
)
from minipar.plan.presets import load_model
from minipar.plan.zero import zero_model_state_breakdown
from minipar.viz.explore.view import View

GB = 1e9


@dataclass(frozen=True)
class Experts:
    """A mixture of experts on top of a dense backbone (whose FFN is one expert's)."""

    n_experts: int
    top_k: int
    expert_ffn: int
    shared: int = 0
    dense_layers: int = 0  # the first layers keep a dense FFN (DeepSeek-V3: 3)


#: name -> (the dense backbone, the experts or None); dense models from minipar.plan's presets
MODELS: dict[str, tuple[ModelSpec, Experts | None]] = {
    "minipar run's GPT (2 × 16, float64)": (gpt_model(2, 16, 10, 8, heads=2), None),
    "GPT-3 175B": (load_model("gpt3-175b"), None),
    "Llama 3 8B": (load_model("llama3-8b"), None),
    "Llama 3 70B": (load_model("llama3-70b"), None),
    "Llama 3 405B": (load_model("llama3-405b"), None),
    # Mixtral of experts (Jiang et al. 2024, arXiv 2401.04088, Table 1): 32 layers, 4096,
    # 32 heads, 8 KV heads, 8 experts of FFN 14336, top 2, vocabulary 32000
    "Mixtral 8x7B": (llama_model(32, 4096, 32, 8, 14336, 32000, 4096, name="mixtral-8x7b"),
                     Experts(8, 2, 14336)),
    # DeepSeek-V3 (arXiv 2412.19437, §4.2): 61 layers, 7168, 128 heads (MLA counted as
    # multi-head attention here), the first 3 layers dense (FFN 18432), then 1 shared +
    # 256 routed experts of FFN 2048, top 8, vocabulary 129280, sequence 4096
    "DeepSeek-V3": (llama_model(61, 7168, 128, 128, 18432, 129280, 4096, name="deepseek-v3"),
                    Experts(256, 8, 2048, shared=1, dense_layers=3)),
}
#: name -> (bytes of a parameter, gradient and activation element, K optimizer bytes), or
#: (parameter bytes, K, gradient bytes, activation bytes) where those differ
PRECISIONS: dict[str, tuple[float, ...]] = {
    "bf16 mixed": (2, 12),  # 16-bit params and grads; fp32 master, m, v (ZeRO §3.1)
    "fp32": (4, 8),  # fp32 params and grads; Adam's m and v
    "float64": (8, 16),  # minipar's parity runs: float64 params, grads, m, v
    # DeepSeek-V3 (arXiv 2412.19437 §3.3), the Ultra-Scale Playbook's FP8 table: FP8
    # weights 1; gradients BF16 2 + FP32 accumulated 4; K = FP32 master 4 + BF16 m, v 2 + 2:
    # 15 bytes a parameter (minipar.precision); activations as bf16 (its FP8-cached linear
    # inputs not split out: an upper bound)
    "fp8 (DeepSeek-V3)": (1, 8, 6, 2),
}
#: device line: name -> bytes (minipar.plan.cluster's presets)
DEVICES: dict[str, float] = {"H100 80 GB": CLUSTERS["h100"]["memory_gb"] * GB,
                             "H200 141 GB": CLUSTERS["h200"]["memory_gb"] * GB,
                             "A100 80 GB": CLUSTERS["a100-80gb"]["memory_gb"] * GB,
                             "A100 40 GB": CLUSTERS["a100-40gb"]["memory_gb"] * GB}
#: context-parallel kinds the planner knows
CP_KINDS: dict[str, Any] = {  # kind -> K, V elements one layer's attention gathers
    "ring": lambda b, s, c, kv: 2 * 2 * b * (s // c) * kv,
    "allgather": lambda b, s, c, kv: 2 * b * s * kv,
}
#: the chunks per rank a schedule needs (None: the vp control decides)
SCHEDULE_V = {"zb-v": 2, "interleaved": None, "dualpipe": 2, "dualpipev": 2}
#: where a schedule puts each rank's layers: "dual" (DualPipe: stages s and p − 1 − s of p,
#: two pipelines, one each way: twice the parameters), "v" (ZB-V, DualPipe-V: virtual
#: stages s and 2p − 1 − s of 2p), else stage s of p (v chunks of it when interleaved)
PLACEMENT = {"dualpipe": "dual", "zb-v": "v", "dualpipev": "v"}
DDP_BUCKET = 25e6  # PyTorch DDP's bucket_cap_mb = 25
KINDS_SHOWN = ("params", "grads", "optimizer", "activations", "buffers", "offloaded")

CONTROLS: dict[str, Any] = {
    "model": tuple(MODELS), "dp": range(1, 65), "tp": (1, 2, 4, 8, 16), "pp": range(1, 33),
    "vp": (1, 2, 3, 4), "cp": (1, 2, 4, 8, 16), "ep": (1, 2, 4, 8, 16, 32, 64),
    "zero": (0, 1, 2, 3), "sp": True, "remat": REMATS, "offload": False,
    "precision": tuple(PRECISIONS), "micro_batches": range(1, 65), "mb": (1, 2, 4, 8),
    "schedule": tuple(k for k in KINDS if k != "naive"), "cp_kind": tuple(CP_KINDS),
    "device": tuple(DEVICES),
}


def _stage_params(model: ModelSpec, moe: Experts | None, p: int, t: int, ep: int,
                  stage: int) -> tuple[float, float]:
    """(dense parameters, expert parameters) one rank of ``stage`` holds (elements)."""
    dense = stage_param_count(model, p, t, stage)
    if moe is None:
        return dense, 0.0
    per = model.n_layer // p
    first = stage * per
    moe_layers = sum(1 for i in range(first, first + per) if i >= moe.dense_layers)
    ffn = (3 if model.gated else 2) * model.hidden
    dense -= moe_layers * ffn * model.d_ff / t  # the backbone's FFN becomes the experts
    experts = moe_layers * (moe.n_experts / ep + moe.shared) * ffn * moe.expert_ffn / t
    return dense, experts


def total_params(name: str) -> float:
    """Ψ of a preset, experts included (elements)."""
    model, moe = MODELS[name]
    return sum(_stage_params(model, moe, 1, 1, 1, 0))


def memory(model: str = "Llama 3 70B", dp: int = 8, tp: int = 8, pp: int = 4, vp: int = 1,
           cp: int = 1, ep: int = 1, zero: int = 1, sp: bool = True, remat: str = "selective",
           offload: bool = False, precision: str = "bf16 mixed", micro_batches: int = 16,
           mb: int = 1, schedule: str = "1f1b", cp_kind: str = "ring",
           device: str = "H100 80 GB") -> View:
    """Bytes per device by kind on the fuller of the first and last pipeline stage.

    ``numbers``: each kind of :data:`KINDS_SHOWN` (bytes), ``device_total`` (all but the
    offloaded), ``in_flight`` (the schedule's activations held on the stage, in chunks of
    L/(p·v) layers), ``stage``, ``psi``, ``fits``.  ValueError (one line) when the
    layout does not divide the model.
    """
    if model not in MODELS:
        raise ValueError(f"model: one of {', '.join(MODELS)}, got {model!r}")
    spec, moe = MODELS[model]
    item, K, *split = PRECISIONS[precision]
    grad_item, act_item = split or (item, item)
    v = SCHEDULE_V.get(schedule, 1) or vp
    if vp > 1 and v != vp:
        raise ValueError(f"vp = {vp} needs the interleaved schedule (or zb-v, v = 2)")
    if moe is None and ep > 1:
        raise ValueError(f"ep = {ep}: {model} has no experts (try Mixtral 8x7B)")
    if moe is not None and moe.n_experts % ep:
        raise ValueError(f"ep = {ep} must divide the {moe.n_experts} experts")
    if moe is not None and (dp * cp) % ep:
        raise ValueError(f"ep = {ep} must divide dp·cp = {dp * cp} (experts split the replicas)")
    lay = Layout(dp, tp, pp, cp, zero, remat, mb, micro_batches, v=v, sp=sp, cp_kind=cp_kind)
    check_layout(spec, lay)
    seq_par = sp and tp > 1
    layer = activation_bytes_layer(spec, lay, act_item, "paper", seq_par, cp_kind)
    if remat == "full":  # one layer recomputed whole during its backward
        recomputed = activation_bytes_layer(spec, replace(lay, remat="none"), act_item,
                                            "paper", seq_par, cp_kind)
    per_chunk = spec.n_layer // pp / v
    kv = spec.groups * spec.head_dim / tp if spec.groups >= tp else spec.head_dim
    cp_buffer = CP_KINDS[cp_kind](mb, spec.seq, cp, kv) * act_item if cp > 1 else 0.0
    N = dp * cp
    best: dict[str, Any] = {}
    for stage in sorted({0, pp - 1}):
        place = PLACEMENT.get(schedule) if pp > 1 else None
        if place == "v" and spec.n_layer % (2 * pp):
            raise ValueError(f"{schedule} cuts the {spec.n_layer} layers into 2·pp = {2 * pp} "
                             "stages: they must divide")
        if place is None:
            dense, experts = _stage_params(spec, moe, pp, tp, ep, stage)
        else:
            pv = 2 * pp if place == "v" else pp
            a = _stage_params(spec, moe, pv, tp, ep, stage)
            b = _stage_params(spec, moe, pv, tp, ep, pv - 1 - stage)
            dense, experts = a[0] + b[0], a[1] + b[1]
        kinds = zero_model_state_breakdown(dense, N, zero, K, item, grad_item)
        if experts:
            ek = zero_model_state_breakdown(experts, max(1, N // ep), zero, K, item, grad_item)
            kinds = {k: kinds[k] + ek[k] for k in kinds}
        held = in_flight(stage_schedule(schedule, stage, pp, micro_batches, v)) if pp > 1 else 1
        acts = held * per_chunk * layer + (recomputed if remat == "full" else 0.0)
        if zero == 3:  # the layer in use and the prefetched one, gathered whole
            buffers = 2 * (dense + experts) / max(1, spec.n_layer // pp) * item
        else:
            buffers = min(DDP_BUCKET, (dense + experts) * grad_item) if N > 1 else 0.0
        row = {"params": kinds["params"], "grads": kinds["grads"],
               "optimizer": 0.0 if offload else kinds["optimizer"], "activations": acts,
               "buffers": buffers + cp_buffer, "offloaded": kinds["optimizer"] if offload else 0.0,
               "in_flight": held, "stage": stage, "params_per_rank": dense + experts}
        row["device_total"] = sum(row[k] for k in KINDS_SHOWN if k != "offloaded")
        if row["device_total"] > best.get("device_total", -1.0):
            best = row
    limit = DEVICES[device]
    best.update(psi=total_params(model), fits=best["device_total"] <= limit,
                device_bytes=limit, n=dp * tp * pp * cp)
    psi = f"{best['psi'] / 1e9:.2f} B" if best["psi"] >= 1e8 else f"{best['psi']:,.0f}"
    lines = [f"{model}: Ψ = {psi} parameters on "
             f"{best['n']} GPUs (dp {dp} · tp {tp} · pp {pp} · cp {cp}"
             + (f", ep {ep}" if moe else "") + f"), ZeRO-{zero}, remat {remat}, {precision}",
             f"stage {best['stage']} holds {best['in_flight']} "
             + ("chunks" if v > 1 else "micro-batches") + f" in flight ({schedule})"]
    lines += [f"  {k:<12}{_human(best[k]):>12}" for k in KINDS_SHOWN]
    verdict = "fits" if best["fits"] else "does NOT fit"
    lines.append(f"  {'on device':<12}{_human(best['device_total']):>12}  {verdict} on "
                 f"{device}")
    return View(best, lines, lambda: _figure(best, model, device))


def _human(x: float) -> str:
    return f"{x / GB:,.2f} GB" if x >= 1e8 else f"{x:,.0f} B"


def _figure(row: dict[str, Any], model: str, device: str) -> Figure:
    fig = Figure(figsize=(7, 3.2))
    ax = fig.subplots()
    left = 0.0
    colours = ("#4c72b0", "#dd8452", "#55a868", "#c44e52", "#8172b3", "#cccccc")
    big = row["device_total"] + row["offloaded"] >= 1e8
    unit, name = (GB, "GB") if big else (1.0, "bytes")
    for kind, colour in zip(KINDS_SHOWN, colours):
        width = row[kind] / unit
        ax.barh([0], [width], left=left, color=colour, label=kind,
                hatch="//" if kind == "offloaded" else None)
        left += width
    if big:
        ax.axvline(row["device_bytes"] / unit, color="k", ls="--")
        ax.text(row["device_bytes"] / unit, 0.45, f" {device}", va="bottom")
    ax.set_yticks([])
    ax.set_xlabel(f"{name} per device (stage {row['stage']}; offloaded = on the host)")
    ax.set_title(f"{model}: {row['device_total'] / unit:,.1f} {name} on device")
    ax.legend(ncol=3, fontsize=8, loc="upper center", bbox_to_anchor=(0.5, -0.3))
    fig.tight_layout()
    return fig
