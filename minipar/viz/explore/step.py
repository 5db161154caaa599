"""The planner's step time of a layout, by part: compute, bubble, messages per axis; MFU.

EN step-time explorer · RU время шага · ZH 步时间估计

:func:`step` is :func:`minipar.plan.step_time.estimate` (``minipar plan --cluster``'s
model, fitted on PTD-P's Table 1: docs/plan-calibration.md) for one layout of a preset
on a cluster preset: the step split into its parts, the bubble, the bytes one rank sends
per axis, MFU, and whether the memory fits.  A cluster is one entry of
:data:`minipar.plan.cluster.PRESETS`.
"""

from __future__ import annotations

from typing import Any

from matplotlib.figure import Figure

from minipar.plan.cluster import PRESETS, load_cluster
from minipar.plan.layouts import REMATS, Layout
from minipar.plan.step_time import AXES, estimate
from minipar.viz.explore.memory import MODELS
from minipar.viz.explore.view import View

DENSE = tuple(k for k, (_, moe) in MODELS.items() if moe is None and "minipar" not in k)
CONTROLS: dict[str, Any] = {"model": DENSE, "cluster": tuple(PRESETS), "dp": (1, 2, 4, 8, 16,
                            32, 64), "tp": (1, 2, 4, 8), "pp": (1, 2, 4, 8, 16), "vp": (1, 2, 4),
                            "zero": (0, 1, 2, 3), "remat": REMATS, "global_batch": (64, 256,
                            512, 1024, 1536)}
PARTS = ("gemm", "memory", "recompute", "tp", "cp", "pp", "zero3", "bubble", "dp", "optimizer")


def step(model: str = "GPT-3 175B", cluster: str = "dgx-a100", dp: int = 8, tp: int = 8,
         pp: int = 16, vp: int = 1, zero: int = 1, remat: str = "full",
         global_batch: int = 1536, mb: int = 1) -> View:
    """``estimate`` of d·t·p GPUs: ``numbers`` is its dict (``step_s``, ``parts_s``,
    ``mfu``, ``traffic``, ``memory``, ``fits``, ``bubble_ratio``) plus ``n``."""
    spec, _ = MODELS[model]
    if global_batch % (dp * mb):
        raise ValueError(f"dp·mb = {dp * mb} must divide the global batch {global_batch}")
    lay = Layout(dp, tp, pp, 1, zero, remat, mb, global_batch // (dp * mb), v=vp)
    est = estimate(spec, lay, load_cluster(cluster), global_batch)
    parts = est["parts_s"]
    lines = [f"{model} on {lay.n} GPUs of {cluster}: dp {dp} · tp {tp} · pp {pp}"
             + (f" · vp {vp}" if vp > 1 else "") + f", ZeRO-{zero}, remat {remat}, "
             f"B = {global_batch}, m = {lay.m}",
             f"step {est['step_s']:.2f} s, MFU {est['mfu']:.1%}, bubble / ideal "
             f"{est['bubble_ratio']:.3f}, memory {est['memory']['total'] / 1e9:.1f} GB per GPU "
             + ("(fits)" if est["fits"] else "(does NOT fit)"),
             "parts: " + ", ".join(f"{k} {parts[k]:.3f} s" for k in PARTS if parts.get(k)),
             "bytes per rank per step: " + ", ".join(
                 f"{a} {est['traffic'][a]['bytes'] / 1e9:.2f} GB" for a in AXES
                 if est["traffic"][a]["bytes"])]
    return View({**est, "n": lay.n}, lines, lambda: _figure(est))


def _figure(est: dict[str, Any]) -> Figure:
    fig = Figure(figsize=(9, 3))
    ax, bx = fig.subplots(1, 2, gridspec_kw={"width_ratios": (1.6, 1)})
    left = 0.0
    for k in PARTS:
        x = est["parts_s"].get(k, 0.0)
        if x:
            ax.barh([0], [x], left=left, label=k)
            left += x
    ax.set_yticks([])
    ax.set_xlabel("seconds per step (estimate)")
    ax.set_title(f"step {est['step_s']:.2f} s, MFU {est['mfu']:.1%}", fontsize=9)
    ax.legend(ncol=5, fontsize=7, loc="upper center", bbox_to_anchor=(0.5, -0.35))
    bx.bar(list(AXES), [est["traffic"][a]["bytes"] / 1e9 for a in AXES])
    bx.set_ylabel("GB sent per rank per step")
    fig.tight_layout()
    return fig
