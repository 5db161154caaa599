"""Activation checkpointing: memory with a checkpoint every k of n layers.

EN activation checkpointing · RU контрольные точки активаций (пересчёт) · ZH 激活检查点（重计算）

Chen, Xu, Zhang & Guestrin 2016, "Training Deep Nets with Sublinear Memory
Cost", arXiv 1604.06174.  A chain of n layers cut into segments of k
layers: forward stores only each segment's input (⌈n/k⌉ checkpoints);
backward recomputes one segment at a time, holding its k layers'
activations.  In units of one layer's stored activations

    memory(n, k) = ⌈n/k⌉ + k,        minimal near k = √n:  ≈ 2√n

for the price of one extra forward pass: every layer outside the last
segment (still in memory when backward starts) is computed twice.
"""

from __future__ import annotations

import math

from minipar.plan._check import count, non_negative


def checkpoint_memory(n: int, k: int, layer_bytes: float = 1.0) -> float:
    """Peak activation memory: (⌈n/k⌉ + k) × ``layer_bytes`` (Chen et al. 2016, §4).

    k = 1 stores every input and recomputes single layers: n + 1; k = n keeps
    one input and recomputes everything: 1 + n.  Units follow ``layer_bytes``
    (default 1: counts of layers' activations).
    """
    n, k = count("n", n), count("k", k)
    if k > n:
        raise ValueError(f"segment length k={k} exceeds the number of layers n={n}")
    return (math.ceil(n / k) + k) * non_negative("layer_bytes", layer_bytes)


def optimal_checkpoint_interval(n: int) -> int:
    """The k in 1..n minimising :func:`checkpoint_memory` (the smallest such); ≈ √n."""
    n = count("n", n)
    return min(range(1, n + 1), key=lambda k: (checkpoint_memory(n, k), k))


def recompute_forward_layers(n: int, k: int) -> int:
    """Layers whose forward runs twice: n minus the last segment's length (≈ one extra forward).

    The last segment's activations are still live when backward starts, so
    it is not recomputed; every other segment is.
    """
    n, k = count("n", n), count("k", k)
    if k > n:
        raise ValueError(f"segment length k={k} exceeds the number of layers n={n}")
    last = n - (math.ceil(n / k) - 1) * k
    return n - last
