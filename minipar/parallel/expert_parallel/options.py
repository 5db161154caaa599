"""What an expert-parallel run can be told, checked — параметры параллелизма экспертов — 专家并行的选项.

EN expert-parallel options and their checks · RU параметры параллелизма экспертов и их
проверки · ZH 专家并行的选项及其检查

The shell's launch-side half: :func:`check_ep` refuses a run that cannot be laid
out as asked (no experts, E not divisible by ep, top-k outside 1..E, a
capacity factor <= 0, ep not dividing the data-parallel ranks, expert groups that are
not the experts of whole ranks) in one line naming
the numbers, the same on every rank.  It imports no MPI, so ``minipar run ep``,
``minipar bench ep`` and the hybrid's checks call it in the launching process
before MPI starts; the engine calls it again on every rank before any message.
"""

from __future__ import annotations

from typing import Any

from minipar import checks

__all__ = ["check_ep"]


def check_ep(experts: Any, top_k: Any, capacity_factor: Any, ep: Any, world: int,
             groups: Any = 1) -> None:
    """ValueError (one line, naming the numbers) unless expert parallelism can run with
    ``experts`` E per MoE layer, ``top_k``, ``capacity_factor`` (None: dropless), ``ep``
    ranks per expert-parallel group, ``world`` data-parallel ranks and ``groups`` G of
    node-limited routing (a group = the experts of ep/G ranks, or G/ep groups a rank)."""
    checks.integer("--experts", experts, 1, why="expert parallelism needs a mixture of experts")
    if not checks.is_integer(top_k) or not 1 <= top_k <= experts:
        raise ValueError(f"--top-k must be between 1 and --experts {experts}, got {top_k!r}")
    if capacity_factor is not None:
        checks.real("--capacity-factor", capacity_factor, greater_than=0)
    if not checks.is_integer(ep) or ep < 1 or world % ep:
        raise ValueError(f"--ep {ep!r} must divide the {world} data-parallel ranks "
                         "(expert parallelism cuts them into blocks of ep ranks)")
    checks.divides("--ep", ep, "--experts", experts, "each expert-parallel rank holds E/ep experts")
    if ep % groups and groups % ep:
        raise ValueError(f"--expert-groups {groups} and --ep {ep}: node-limited routing maps "
                         "each group onto whole ranks, so one must divide the other (a group "
                         "= the experts of ep/G ranks, or a rank's = G/ep whole groups)")
