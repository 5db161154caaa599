"""Which experts each rank holds, and its capacity — размещение экспертов и ёмкость — 专家的分布与容量.

EN expert placement and capacity · RU размещение экспертов и ёмкость · ZH 专家的分布与容量

Everything here follows from the configuration, so every rank knows it before
any message (GShard, Lepikhin et al. 2020, arXiv 2006.16668; Switch
Transformer, Fedus et al. 2021, arXiv 2101.03961, §2.2):

* :func:`expert_ids`: rank c of an ep group holds experts c·E/ep … (c+1)·E/ep − 1
  (blocked, so the dispatch sends rank c one contiguous block of the buffers);
* :func:`capacities`: C_j = ⌈k·n_j/E × capacity_factor⌉ per source j, its own n_j
  tokens routed top-k (GShard's local groups): the rows of the (E, C_j, d) buffer
  source j sends, and so the shape of every message of the layer;
* :data:`OPS`: the five all-to-alls of a step
  (:mod:`~minipar.parallel.expert_parallel.layer`), by the names the traced
  communicator counts them under.

E = 4, ep = 2, two sources of n = 8 tokens, top-1, capacity factor 1.25::

    rank 0: experts 0 1, C_0 = ⌈8/4 × 1.25⌉ = 3     rank 1: experts 2 3, C_1 = 3
"""

from __future__ import annotations

from minipar.nn.moe_steps import expert_capacity

__all__ = ["OPS", "capacities", "expert_ids"]

#: names under which the traced communicator counts each all-to-all's bytes, in the
#: order they run in a step: forward counts, dispatch, combine; backward d(out), d(buffers)
OPS = ("ep_counts", "ep_dispatch", "ep_combine", "ep_combine_grad", "ep_dispatch_grad")


def expert_ids(n_experts: int, ep: int, coord: int) -> list[int]:
    """The experts rank ``coord`` of an expert-parallel group of ``ep`` ranks holds."""
    per = n_experts // ep
    return list(range(coord * per, (coord + 1) * per))


def capacities(n_experts: int, capacity_factor: float | None, tokens: list[int],
               top_k: int) -> list[int | None]:
    """C_j = ⌈k·n_j / E × capacity_factor⌉ for each source's ``tokens`` n_j (its group) routed
    top-k, rounded as :func:`minipar.nn.moe_steps.expert_capacity` does (None: dropless)."""
    return [None if capacity_factor is None else
            expert_capacity(n * top_k, n_experts, capacity_factor) for n in tokens]
