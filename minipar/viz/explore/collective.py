"""An all-reduce step by step: which chunk each rank sends and holds, and its α–β–γ time.

EN collective explorer · RU all-reduce по шагам · ZH 全归约逐步演示

:func:`collective` replays one all-reduce algorithm on N ranks and shows, after step k,
how many ranks' contributions each rank holds of each chunk (the ring cuts the buffer
into N chunks; the others move the whole buffer, one chunk) and the messages of that
step; beside it the α–β–γ time of every algorithm against the size (Thakur, Rabenseifner
& Gropp 2005, §2, with the constants :mod:`minipar.collectives.cost_model` measured on
this machine).  Ring and recursive doubling: the cost model's own formulas; binomial
tree (reduce to rank 0, then broadcast) 2⌈log₂N⌉(α + Sβ) + ⌈log₂N⌉Sγ; naive (every rank
sends to rank 0, which adds and sends the sum back) 2(N−1)(α + Sβ) + (N−1)Sγ.  A new
algorithm is one entry of :data:`ALGORITHMS`: its steps and its time.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import numpy as np
from matplotlib.figure import Figure

from minipar.collectives.cost_model import allreduce_time, load_costs
from minipar.plan.collectives import ring_allreduce_volume
from minipar.viz.explore.view import View
from minipar.viz.ring import ring_steps

#: one message: (sender, receiver, chunk, "add" or "copy")
Message = tuple[int, int, int, str]


def _ring(n: int) -> list[list[Message]]:
    return [[(m.sender, m.receiver, m.chunk, "add" if m.phase == "reduce-scatter" else "copy")
             for m in step] for step in ring_steps(n)]


def _recursive_doubling(n: int) -> list[list[Message]]:
    if n & (n - 1):
        raise ValueError(f"recursive doubling here needs N a power of two, got {n} (minipar "
                         "folds the extra ranks first; try 2, 4, 8)")
    return [[(r, r ^ (1 << k), 0, "add") for r in range(n)] for k in range(n.bit_length() - 1)]


def _tree(n: int) -> list[list[Message]]:
    rounds = math.ceil(math.log2(n)) if n > 1 else 0
    up = [[(r, r - (1 << k), 0, "add") for r in range(n) if r % (2 << k) == 1 << k]
          for k in range(rounds)]
    down = [[(r, r + (1 << k), 0, "copy") for r in range(0, n, 2 << k) if r + (1 << k) < n]
            for k in reversed(range(rounds))]
    return up + down


def _naive(n: int) -> list[list[Message]]:
    return [[(r, 0, 0, "add") for r in range(1, n)], [(0, r, 0, "copy") for r in range(1, n)]]


def _tree_time(S: float, n: int, a: float, b: float, g: float) -> float:
    k = math.ceil(math.log2(n)) if n > 1 else 0
    return 2 * k * (a + S * b) + k * S * g


def _naive_time(S: float, n: int, a: float, b: float, g: float) -> float:
    return 2 * (n - 1) * (a + S * b) + (n - 1) * S * g


def _model(name: str) -> Callable[..., float]:
    def t(S: float, n: int, a: float, b: float, g: float) -> float:
        from minipar.collectives.cost_model import LinkCosts

        return allreduce_time(name, int(S), n, LinkCosts(a, b, g))
    return t


#: name -> (chunks the buffer is cut into for N ranks, the steps, the α–β–γ time)
ALGORITHMS: dict[str, tuple[Callable[[int], int], Callable[[int], list[list[Message]]],
                            Callable[..., float]]] = {
    "ring": (lambda n: n, _ring, _model("ring")),
    "recursive_doubling": (lambda n: 1, _recursive_doubling, _model("recursive_doubling")),
    "tree": (lambda n: 1, _tree, _tree_time),
    "naive": (lambda n: 1, _naive, _naive_time),
}
CONTROLS: dict[str, Any] = {"algorithm": tuple(ALGORITHMS), "n": range(2, 9),
                            "size": (1 << 10, 1 << 14, 1 << 17, 1 << 20, 1 << 24, 1 << 27),
                            "step": range(0, 15)}


def holdings(algorithm: str, n: int) -> tuple[list[np.ndarray], list[list[Message]]]:
    """Contribution counts ``[rank, chunk]`` before the first step and after each, and the
    steps.  The last state is all n: every rank holds the whole sum."""
    chunks_of, steps_of, _ = ALGORITHMS[algorithm]
    c, steps = chunks_of(n), steps_of(n)
    have = [[{r} for _ in range(c)] for r in range(n)]
    states = [np.array([[len(s) for s in row] for row in have])]
    for step in steps:
        moved = [(dst, ch, set(have[src][ch]), how) for src, dst, ch, how in step]
        for dst, ch, got, how in moved:
            have[dst][ch] = have[dst][ch] | got if how == "add" else got
        states.append(np.array([[len(s) for s in row] for row in have]))
    return states, steps


def collective(algorithm: str = "ring", n: int = 4, size: int = 1 << 20, step: int = 3) -> View:
    """After ``step`` of ``algorithm`` on ``n`` ranks: the holdings, that step's messages,
    bytes each rank sent so far, and the α–β–γ time of every algorithm at ``size``.

    ``numbers``: ``steps`` (how many), ``step`` (clipped to them), ``messages``,
    ``bytes_sent_per_rank`` (so far), ``complete`` (every rank holds the sum),
    ``time_s`` (algorithm -> seconds), ``ring_formula_bytes`` 2(N−1)/N·S.
    """
    if algorithm not in ALGORITHMS:
        raise ValueError(f"algorithm: one of {', '.join(ALGORITHMS)}, got {algorithm!r}")
    if n < 2:
        raise ValueError(f"an all-reduce needs N ≥ 2 ranks, got {n}")
    states, steps = holdings(algorithm, n)
    k = max(0, min(step, len(steps)))
    chunk = size / ALGORITHMS[algorithm][0](n)
    sent = [0.0] * n
    for st in steps[:k]:
        for src, _dst, _ch, _how in st:
            sent[src] += chunk
    c = load_costs()
    times = {a: f[2](size, n, c.alpha_s, c.beta_s_per_byte, c.gamma_s_per_byte)
             for a, f in ALGORITHMS.items() if a != "recursive_doubling" or not n & (n - 1)}
    now = steps[k - 1] if k else []
    numbers = {"algorithm": algorithm, "n": n, "size": size, "steps": len(steps), "step": k,
               "messages": now, "bytes_sent_per_rank": sent,
               "complete": bool((states[k] == n).all()), "time_s": times,
               "ring_formula_bytes": ring_allreduce_volume(size, n)}
    lines = [f"{algorithm} all-reduce of {size:,} B on N = {n}: {len(steps)} steps; after step "
             f"{k}: " + ("every rank holds the whole sum" if numbers["complete"] else
                         "not every rank holds the whole sum yet"),
             "this step: " + (", ".join(f"{s}→{d} chunk {ch} ({how})" for s, d, ch, how in now)
                              or "nothing sent yet"),
             "sent so far per rank: " + ", ".join(f"{x:,.0f}" for x in sent) + " B"
             + (f" (the ring's total 2(N−1)/N·S = {numbers['ring_formula_bytes']:,.0f} B)"
                if algorithm == "ring" else ""),
             "α–β–γ time at this size: " + ", ".join(f"{a} {t * 1e3:.3f} ms"
                                                      for a, t in times.items())]
    return View(numbers, lines, lambda: _figure(states[k], now, n, size, algorithm, c, k))


def _figure(state: np.ndarray, now: list[Message], n: int, size: int, algorithm: str,
            c: Any, k: int) -> Figure:
    fig = Figure(figsize=(9, 3.4))
    ax, bx = fig.subplots(1, 2, gridspec_kw={"width_ratios": (1, 1.4)})
    ax.imshow(state, vmin=1, vmax=n, cmap="Blues", aspect="auto")
    for r in range(state.shape[0]):
        for ch in range(state.shape[1]):
            ax.text(ch, r, str(state[r, ch]), ha="center", va="center", fontsize=8,
                    color="white" if state[r, ch] > (n + 1) / 2 else "black")
    for _src, dst, ch, _how in now:
        ax.add_patch(_rect(ch, dst))
    ax.set_xlabel("chunk")
    ax.set_ylabel("rank")
    ax.set_xticks(range(state.shape[1]))
    ax.set_yticks(range(n))
    ax.set_title(f"{algorithm}, after step {k}: contributions held\n(red: just received)",
                 fontsize=9)
    sizes = np.logspace(8, 28, 41, base=2)
    for a, f in ALGORITHMS.items():
        if a == "recursive_doubling" and n & (n - 1):
            continue
        t = [f[2](s, n, c.alpha_s, c.beta_s_per_byte, c.gamma_s_per_byte) for s in sizes]
        bx.loglog(sizes, t, lw=2.5 if a == algorithm else 1, label=a)
    bx.axvline(size, color="grey", ls=":")
    bx.set_xlabel("bytes S")
    bx.set_ylabel("seconds (α–β–γ model)")
    bx.set_title(f"N = {n}, this machine's α, β, γ", fontsize=9)
    bx.legend(fontsize=8)
    fig.tight_layout()
    return fig


def _rect(ch: int, r: int) -> Any:
    from matplotlib.patches import Rectangle

    return Rectangle((ch - 0.5, r - 0.5), 1, 1, fill=False, edgecolor="crimson", linewidth=2)
