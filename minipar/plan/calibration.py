"""The step model's fitted constants and the published runs they were fitted on.

EN step-model calibration · RU калибровка модели шага · ZH 步时间模型校准

Three constants, fitted by :mod:`minipar.plan.fit` on the ten runs of PTD-P's
Table 1 (Narayanan et al. 2021, arXiv 2104.04473) and nowhere else
(docs/plan-calibration.md has the data, the fit and its leave-one-out residuals):

- ``gemm_efficiency`` η: the share of the tensor-core peak a large GEMM reaches;
- ``kernel_overhead_us`` t₀: a fixed cost of every kernel (launch, tail wave), which
  makes small GEMMs and small memory-bound kernels less efficient than big ones;
- ``link_efficiency``: the share of a link's nominal bandwidth a collective reaches
  (NCCL's bus bandwidth is below the datasheet's).

Not fitted (datasheet or stated assumptions): ``hbm_efficiency`` (the share of HBM
bandwidth memory-bound kernels reach, 0.8 — STREAM-like copies on A100 reach about
that), the latencies α of :mod:`minipar.plan.cluster`, and ``zero3_overlap``, the share
of a layer's forward compute that hides ZeRO-3's gathers of the next layer: 0, the
gathers exposed (DeepSpeed's ZeRO-3 as PTD-P's Table 2 measured it; chosen after
seeing those rows, see docs/plan-calibration.md; 1 models an FSDP-style prefetch).

The runs: PTD-P Table 1 as published (h, a, l, t, p, n, B, achieved TFLOP/s per
GPU counted by the paper's eq. 3, s = 2048, V = 51200), with the micro-batch size
and the layers per virtual stage of each from Megatron-LM's
``examples/sc21/run_table_1.sh`` (MBS, ``--num-layers-per-virtual-pipeline-stage``:
v = layers per stage / that; ``--recompute-method uniform``: full recomputation;
``DDP=torch``, PyTorch DDP, overlaps the gradient all-reduce with backward, Megatron's
``DDP=local`` of 2021 does not).
"""

from __future__ import annotations

#: the fitted constants (values from ``python -m minipar.plan.fit``)
CONSTANTS: dict[str, float] = {
    "gemm_efficiency": 0.6883,
    "kernel_overhead_us": 10.0,
    "link_efficiency": 0.748,
    "hbm_efficiency": 0.8,
    "zero3_overlap": 0.0,
}

#: PTD-P Table 1: name, params (B, as published), heads a, hidden h, layers l, t, p, n GPUs,
#: global batch B, achieved TFLOP/s per GPU; + run_table_1.sh: micro-batch b, v, DDP overlap
PTDP_TABLE_1: tuple[dict[str, object], ...] = tuple(
    {"name": nm, "params_b": ps, "a": a, "h": h, "l": L, "t": t, "p": p, "n": n, "B": B,
     "tflops": tf, "b": b, "v": v, "overlap": ov}
    for nm, ps, a, h, L, t, p, n, B, tf, b, v, ov in (
        ("1.7B", 1.7, 24, 2304, 24, 1, 1, 32, 512, 137, 16, 1, True),
        ("3.6B", 3.6, 32, 3072, 30, 2, 1, 64, 512, 138, 16, 1, True),
        ("7.5B", 7.5, 32, 4096, 36, 4, 1, 128, 512, 142, 16, 1, True),
        ("18B", 18.4, 48, 6144, 40, 8, 1, 256, 1024, 135, 8, 1, True),
        ("39B", 39.1, 64, 8192, 48, 8, 2, 512, 1536, 138, 4, 1, False),
        ("76B", 76.1, 80, 10240, 60, 8, 4, 1024, 1792, 140, 2, 3, False),
        ("145B", 145.6, 96, 12288, 80, 8, 8, 1536, 2304, 148, 2, 2, False),
        ("310B", 310.1, 128, 16384, 96, 8, 16, 1920, 2160, 155, 1, 2, False),
        ("530B", 529.6, 128, 20480, 105, 8, 35, 2520, 2520, 163, 1, 3, False),
        ("1T", 1008.0, 160, 25600, 128, 8, 64, 3072, 3072, 163, 1, 1, False),
    ))
