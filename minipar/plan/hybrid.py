"""3D parallelism: n = p·t·d, and model-state memory per rank for a layout.

EN 3D parallelism · RU трёхмерный (3D) параллелизм · ZH 3D 并行

Narayanan et al. 2021, "Efficient Large-Scale Language Model Training on
GPU Clusters Using Megatron-LM", arXiv 2104.04473: n GPUs = p (pipeline)
× t (tensor) × d (data); tensor parallelism inside a server, pipeline
across servers, data parallelism for the rest.  Each rank holds Ψ/(p·t) of
the parameters (an even split; replicated LayerNorm and bias pieces of
tensor parallelism are ignored), and ZeRO (arXiv 1910.02054) may partition
that share's model states further over the d data-parallel replicas.
"""

from __future__ import annotations

from minipar.plan._check import count, positive
from minipar.plan.zero import K_ADAM, zero_model_state_breakdown


def check_3d_layout(n: int, p: int, t: int, d: int) -> None:
    """ValueError unless n = p·t·d (all ≥ 1)."""
    n, p, t, d = count("n", n), count("p", p), count("t", t), count("d", d)
    if p * t * d != n:
        raise ValueError(f"p·t·d = {p}·{t}·{d} = {p * t * d} does not equal n = {n} ranks")


def model_state_bytes_3d(
    psi: float, p: int, t: int, d: int, zero_stage: int = 0,
    n: int | None = None, K: float = K_ADAM,
) -> dict[str, float]:
    """Model-state bytes on one rank of a (p, t, d) layout with ZeRO ``zero_stage`` over d.

    The rank's share Ψ/(p·t) is held as in :func:`zero_model_state_breakdown`
    with N = d.  Returns ``params``, ``grads``, ``optimizer``, ``total``
    (bytes) and ``psi_per_rank`` (elements).  ``n``, if given, is checked
    against p·t·d.
    """
    p, t, d = count("p", p), count("t", t), count("d", d)
    if n is not None:
        check_3d_layout(n, p, t, d)
    share = positive("psi", psi) / (p * t)
    out = zero_model_state_breakdown(share, d, zero_stage, K)
    out["psi_per_rank"] = share
    return out
