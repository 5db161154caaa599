"""ZeRO and ZeRO-Offload: model-state bytes per device and bytes moved per step.

EN Zero Redundancy Optimizer · RU оптимизатор без избыточности (ZeRO) · ZH 零冗余优化器

Rajbhandari, Rasley, Ruwase & He 2019, "ZeRO: Memory Optimizations Toward
Training Trillion Parameter Models", arXiv 1910.02054.

Mixed-precision Adam keeps, per parameter, 2 bytes of 16-bit parameters,
2 bytes of 16-bit gradients and K = 12 bytes of optimizer state (fp32
master parameters, momentum and variance, 4 + 4 + 4): 2 + 2 + 12 = 16 bytes.
With Ψ parameters on N data-parallel ranks, each device holds

    stage 0  DP          (2 + 2 + K) Ψ
    stage 1  P_os        4Ψ + KΨ/N
    stage 2  P_os+g      2Ψ + (2 + K)Ψ/N
    stage 3  P_os+g+p    (2 + 2 + K)Ψ/N

(the paper's example, Ψ = 7.5 B, N = 64, GB = 10⁹ bytes: 120, 31.4, 16.6,
1.9 GB).  Communication per step, in elements: 2Ψ for stages 0, 1 and 2
(reduce-scatter Ψ + all-gather Ψ, what a ring all-reduce costs), 3Ψ for
stage 3 (parameters are all-gathered twice, for forward and for backward,
and gradients reduce-scattered once): 1.5×.

ZeRO-Offload (Ren et al. 2021, arXiv 2101.06840): the fp32 master weights,
the Adam moments and the gradients live in host memory and Adam runs on the
CPU; the 16-bit parameters and forward/backward stay on the accelerator.
"""

from __future__ import annotations

from minipar.plan._check import count, non_negative, positive, zero_stage
from minipar.plan.collectives import all_gather_volume, reduce_scatter_volume

K_ADAM = 12  #: fp32 master params + momentum + variance, bytes per parameter

STAGE_NAMES = ("DP", "P_os", "P_os+g", "P_os+g+p")
STAGE_FORMULAS = ("(2+2+K)Ψ", "4Ψ + KΨ/N", "2Ψ + (2+K)Ψ/N", "(2+2+K)Ψ/N")


def mixed_precision_bytes_per_param(
    param_bytes: float = 2, grad_bytes: float = 2, K: float = K_ADAM
) -> dict[str, float]:
    """Bytes per parameter of mixed-precision Adam: 2 + 2 + 12 = 16 (ZeRO §3.1).

    Returns ``params`` (16-bit), ``grads`` (16-bit), ``optimizer`` (K: fp32
    master params, momentum, variance: 4 + 4 + 4) and their ``total``.
    """
    p, g, k = (positive(n, v) for n, v in (("param_bytes", param_bytes),
                                            ("grad_bytes", grad_bytes), ("K", K)))
    return {"params": p, "grads": g, "optimizer": k, "total": p + g + k}


def zero_model_state_breakdown(
    psi: float, N: int, stage: int, K: float = K_ADAM,
    param_bytes: float = 2, grad_bytes: float = 2,
) -> dict[str, float]:
    """Model-state bytes on *each* of N devices under ZeRO stage ``stage`` (0–3).

    Stage 1 partitions the optimizer states (KΨ/N), stage 2 also the
    gradients, stage 3 also the parameters; what is not partitioned is
    replicated on every rank.  Returns ``params``, ``grads``, ``optimizer``
    and ``total`` in bytes.  Rajbhandari et al. 2019, arXiv 1910.02054, Fig. 1.
    """
    psi, N, s = positive("psi", psi), count("N", N), zero_stage(stage)
    b = mixed_precision_bytes_per_param(param_bytes, grad_bytes, K)
    out = {
        "params": b["params"] * psi / (N if s >= 3 else 1),
        "grads": b["grads"] * psi / (N if s >= 2 else 1),
        "optimizer": b["optimizer"] * psi / (N if s >= 1 else 1),
    }
    out["total"] = out["params"] + out["grads"] + out["optimizer"]
    return out


def zero_model_state_bytes(
    psi: float, N: int, stage: int, K: float = K_ADAM,
    param_bytes: float = 2, grad_bytes: float = 2,
) -> float:
    """Model-state bytes per device: (2+2+K)Ψ, 4Ψ + KΨ/N, 2Ψ + (2+K)Ψ/N, (2+2+K)Ψ/N.

    For stages 0, 1, 2, 3 (Rajbhandari et al. 2019, arXiv 1910.02054).
    """
    return zero_model_state_breakdown(psi, N, stage, K, param_bytes, grad_bytes)["total"]


def zero_comm_elements(psi: float, stage: int) -> float:
    """Elements each rank sends per step, as the paper counts them: 2Ψ (stages 0–2), 3Ψ (3).

    The paper's volume ignores the (N−1)/N of a ring; see
    :func:`zero_comm_bytes_per_rank` for the exact ring figure.
    """
    psi, s = positive("psi", psi), zero_stage(stage)
    return (3.0 if s == 3 else 2.0) * psi


def zero_comm_bytes_per_rank(
    psi: float, N: int, stage: int, bytes_per_elem: float = 2
) -> float:
    """Bytes one rank sends per step with ring collectives on 16-bit data.

    Stages 0–2: reduce-scatter + all-gather of Ψ elements, 2(N−1)/N × Ψ × b.
    Stage 3: two all-gathers of the parameters (forward, backward) and one
    reduce-scatter of the gradients, 3(N−1)/N × Ψ × b.
    """
    psi, N, s = positive("psi", psi), count("N", N), zero_stage(stage)
    S = psi * positive("bytes_per_elem", bytes_per_elem)
    gathers = 2 if s == 3 else 1
    return reduce_scatter_volume(S, N) + gathers * all_gather_volume(S, N)


def zero_table(psi: float, N: int, K: float = K_ADAM) -> list[dict[str, object]]:
    """One row per ZeRO stage 0–3 for Ψ parameters on N ranks.

    Keys: ``stage``, ``name`` (DP, P_os, P_os+g, P_os+g+p), ``formula``,
    ``bytes`` per device, ``GB`` (10⁹ bytes, the paper's unit), ``GiB``
    (2³⁰ bytes), ``comm_elements`` (2Ψ or 3Ψ) and ``comm_bytes_per_rank``
    (exact ring, 16-bit).
    """
    rows = []
    for s in range(4):
        b = zero_model_state_bytes(psi, N, s, K)
        rows.append({
            "stage": s, "name": STAGE_NAMES[s], "formula": STAGE_FORMULAS[s],
            "bytes": b, "GB": b / 1e9, "GiB": b / 2**30,
            "comm_elements": zero_comm_elements(psi, s),
            "comm_bytes_per_rank": zero_comm_bytes_per_rank(psi, N, s),
        })
    return rows


def zero_offload_bytes(
    psi: float, N: int = 1, param_bytes: float = 2, grad_bytes: float = 2,
    K: float = K_ADAM, host_grad_bytes: float | None = None,
) -> dict[str, float]:
    """Where ZeRO-Offload puts the model states (Ren et al. 2021, arXiv 2101.06840).

    Device: the 16-bit parameters, ``device_params`` = 2Ψ, and the 16-bit
    gradients only *transiently* (``device_grads_transient`` ≤ 2Ψ: each
    gradient bucket is copied to the host as soon as backward produces it).
    Host, per rank, partitioned over N data-parallel ranks as in ZeRO-2:
    ``host_optimizer`` = KΨ/N (fp32 master, momentum, variance) and
    ``host_grads`` = g_hΨ/N (g_h = ``host_grad_bytes``, default the 16-bit
    gradient size; 4 if the host keeps them in fp32).  ``device_total``
    counts the resident bytes only; ``host_total`` = optimizer + grads.
    """
    psi, N = positive("psi", psi), count("N", N)
    b = mixed_precision_bytes_per_param(param_bytes, grad_bytes, K)
    gh = b["grads"] if host_grad_bytes is None else positive("host_grad_bytes", host_grad_bytes)
    out = {
        "device_params": b["params"] * psi,
        "device_grads_transient": b["grads"] * psi,
        "host_optimizer": b["optimizer"] * psi / N,
        "host_grads": gh * psi / N,
    }
    out["device_total"] = out["device_params"]
    out["host_total"] = out["host_optimizer"] + out["host_grads"]
    return out


def offload_pcie_bytes_per_step(psi: float, N: int = 1, bytes_per_elem: float = 2) -> dict[str, float]:
    """Host↔device traffic of ZeRO-Offload per step and rank: 16-bit grads down, params up.

    ``to_host`` = bΨ/N gradients (the rank's partition), ``to_device`` = bΨ/N
    updated parameters (then all-gathered between ranks on the accelerator).
    """
    psi, N = positive("psi", psi), count("N", N)
    b = non_negative("bytes_per_elem", bytes_per_elem)
    return {"to_host": b * psi / N, "to_device": b * psi / N}
