"""Which experts each rank holds, its capacity, the checks — размещение экспертов — 专家的分布.

EN expert placement, capacity, checks · RU размещение экспертов, ёмкость, проверки ·
ZH 专家分布、容量与检查

What a run of expert parallelism (:mod:`minipar.parallel.expert_parallel.engine`)
can be told, and what follows from it, with no MPI (``minipar run ep``
checks its options with :func:`check_ep` in the launching process, before
MPI starts; this module imports no MPI for that reason):

* :func:`check_ep`: experts >= 1, E divisible by ep, top-k in 1..min(2, E),
  capacity factor > 0, ep dividing the data-parallel ranks — one line naming
  the numbers, the same on every rank;
* :func:`expert_ids`: rank c of an ep group holds experts c·E/ep … (c+1)·E/ep − 1;
* :func:`capacities`: C_j = ⌈k·n_j/E × capacity_factor⌉ per source j, its own
  n_j tokens routed top-k (Switch Transformer's expert capacity, Fedus et al. 2021, arXiv
  2101.03961, §2.2, over GShard's local groups, arXiv 2006.16668): the rows of
  the (E, C_j, d) buffer source j sends, known to every rank before any message;
* :data:`OPS`: the five all-to-alls those buffers travel by in a step
  (:mod:`~minipar.parallel.expert_parallel.layer`), by the names they are counted under.

The exact bytes of the all-to-alls these sizes fix are in
:func:`minipar.parallel.expert_parallel.measure.alltoall_bytes`.
"""

from __future__ import annotations

from typing import Any

from minipar import checks
from minipar.nn.moe_steps import expert_capacity

__all__ = ["OPS", "capacities", "check_ep", "expert_ids"]

#: names under which the traced communicator counts each all-to-all's bytes, in the
#: order they run in a step: forward counts, dispatch, combine; backward d(out), d(buffers)
OPS = ("ep_counts", "ep_dispatch", "ep_combine", "ep_combine_grad", "ep_dispatch_grad")


def check_ep(experts: Any, top_k: Any, capacity_factor: Any, ep: Any, world: int) -> None:
    """ValueError (one line, naming the numbers) unless expert parallelism can run with
    ``experts`` E per MoE layer, ``top_k``, ``capacity_factor``, ``ep`` ranks per
    expert-parallel group and ``world`` data-parallel ranks."""
    checks.integer("--experts", experts, 1, why="expert parallelism needs a mixture of experts")
    if not checks.is_integer(top_k) or not 1 <= top_k <= min(2, experts):
        raise ValueError(f"--top-k must be 1 (Switch){' or 2 (GShard)' if experts > 1 else ''} "
                         f"and at most --experts {experts}, got {top_k!r}")
    checks.real("--capacity-factor", capacity_factor, greater_than=0)
    if not checks.is_integer(ep) or ep < 1 or world % ep:
        raise ValueError(f"--ep {ep!r} must divide the {world} data-parallel ranks "
                         "(expert parallelism cuts them into blocks of ep ranks)")
    checks.divides("--ep", ep, "--experts", experts, "each expert-parallel rank holds E/ep experts")


def expert_ids(n_experts: int, ep: int, coord: int) -> list[int]:
    """The experts rank ``coord`` of an expert-parallel group of ``ep`` ranks holds."""
    per = n_experts // ep
    return list(range(coord * per, (coord + 1) * per))


def capacities(n_experts: int, capacity_factor: float, tokens: list[int],
               top_k: int) -> list[int]:
    """C_j = ⌈k·n_j / E × capacity_factor⌉ for each source's ``tokens`` n_j (its group) routed
    top-k, rounded as :func:`minipar.nn.moe_steps.expert_capacity` does."""
    return [expert_capacity(n * top_k, n_experts, capacity_factor) for n in tokens]

