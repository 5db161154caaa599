"""ZeRO, measured — измерение ZeRO — ZeRO 的测量: what a rank holds and sends, next to the paper.

EN ZeRO measurements · RU измерения ZeRO · ZH ZeRO 测量

:func:`measure_stage` trains ZeRO-K (:class:`minipar.parallel.zero.engine.ZeRO`) on a
grid and returns this rank's measurements: bytes sent per step (the
traced communicator's counters) next to :func:`exact_bytes_sent` (the exact
figure of the algorithms that ran), model-state bytes by category (the ledger
of the arrays) and by tracemalloc, the step's peak, and what stage 3 gathered
(:class:`~minipar.parallel.zero.engine.MeteredZeroHooks`, the engine's hooks).
:func:`formulas` gives the paper's figures for the same run (Rajbhandari et
al. 2019, arXiv 1910.02054; :mod:`minipar.plan.zero`) and, for stage 0, a note
saying which all-reduce ran and why.  ``minipar run zero``, ``minipar bench
zero``, notebook 04 and the tests read these functions.

Exact bytes rank r sends per step, b bytes per element, C_i the shard sizes
(``numpy.array_split`` of Ψ), ring reduce-scatter RS_r = (Ψ - C_r) b and ring
all-gather AG_r = (Ψ - C_{r+1}) b (per unit or whole: the units' parts tile
the shards, so the per-unit figures add up to the whole buffer's):

* stage 0: the all-reduce of Ψ elements by the algorithm that ran,
  ``allreduce_bytes_sent(Ψ, b, N, r, algorithm)`` (ring: RS_r + AG_r);
* stages 1, 2: RS_r + AG_r = (2Ψ - C_r - C_{r+1}) b;
* stage 3: RS_r + 2 AG_r = (3Ψ - C_r - 2C_{r+1}) b;
* plus, under loss scaling, the all-reduce of one float64 ``found_inf`` flag.
"""

from __future__ import annotations

from typing import Any


def measure_stage(grid: Any, spec: Any, stage: int, *, allreduce: str = "auto",
                  **options: Any) -> dict[str, Any]:
    """Train ``spec.steps`` steps of ZeRO-``stage`` on ``grid`` (dp = N); this rank's
    measurements.

    ``allreduce``: the engine's all-reduce (stage 0 and found_inf; see
    :class:`~minipar.parallel.zero.engine.ZeRO`); other keywords are ZeRO's options too
    (``remat``, ``offload``, ``offload_optimizer``, ...).  A first engine steps once
    outside the measured regions (first-use caches: causal masks, layout tables,
    NumPy's dtype caches).  Returns ``engine``, the global ``losses``,
    ``bytes_sent_per_step`` (every operation of the steps but the loss's own sum,
    counted), ``bytes_exact_per_step`` (:func:`exact_bytes_sent` for what ran),
    ``grad_allreduce`` (stage 0's algorithm, None for stages 1-3), ``ledger`` by
    category, ``tracemalloc_bytes`` (net bytes of building the engine),
    ``held_after_steps_bytes`` (net bytes still held after the steps: a full
    gradient buffer left behind by stage 2, or gathered parameters not freed by
    stage 3, would show here), ``step_peak_bytes`` (activations and transients),
    ``peak_gathered_bytes`` (and ``peak_gathered_formula_bytes``:
    :func:`prefetch_peak_elements`), ``gathered_after_steps`` and ``shard``.
    """
    import gc

    from minipar.parallel.zero.engine import ZeRO
    from minipar.parallel.zero.shard import unit_table

    stats = grid.world.stats
    warm = ZeRO(grid, spec, stage=stage, allreduce=allreduce, **options)
    warm.step(spec.batch_at(0))
    warm.close()
    del warm
    gc.collect()
    before = step_bytes(stats)  # not reset: the counters' rows exist, none is made below
    out = traced_engine(grid, spec, stage=stage, allreduce=allreduce, **options)
    eng = out["engine"]
    sizes = [hi - lo for _, lo, hi, _ in unit_table(eng.model.cfg)]
    peak = prefetch_peak_elements(sizes, eng.prefetch, eng.reshard) if stage == 3 else 0
    return {**out, "bytes_sent_per_step": (step_bytes(stats) - before) / spec.steps,
            "bytes_exact_per_step": engine_exact_bytes(eng), "grad_allreduce": eng.grad_allreduce(),
            "peak_gathered_formula_bytes": peak * eng.policy.param_dtype.itemsize,
            "ledger": eng.ledger().bytes_by_category(),
            "peak_gathered_bytes": eng.zero_hooks.peak_gathered_bytes,
            "gathered_after_steps": len(eng.zero_hooks.gathered), "shard": eng.shard}


def traced_engine(grid: Any, spec: Any, **options: Any) -> dict[str, Any]:
    """A ZeRO engine built and trained ``spec.steps`` steps under tracemalloc:
    ``engine``, global ``losses``, ``tracemalloc_bytes`` (net bytes of building it),
    ``step_peak_bytes`` (the highest step's peak) and ``held_after_steps_bytes``.
    Collective (the steps communicate); first-use caches should be warm already."""
    import gc

    from minipar.memory import measure
    from minipar.parallel.zero.engine import ZeRO
    from minipar.precision import get

    _ = get(spec.precision).param_dtype  # a first bfloat16 loads ml_dtypes: not the engine's bytes
    losses, peak = [0.0] * spec.steps, 0
    gc.collect()  # garbage of before is not this engine's
    with measure() as whole:
        with measure() as built:
            eng = ZeRO(grid, spec, **options)
            gc.collect()  # cyclic garbage of building (the random generators of the init)
        for s in range(spec.steps):
            with measure() as step:
                losses[s] = eng.step(spec.batch_at(s)).loss
            peak = max(peak, step.peak_bytes)
        gc.collect()  # cyclic garbage of the steps is not held memory
    return {"engine": eng, "losses": losses, "tracemalloc_bytes": built.current_bytes,
            "held_after_steps_bytes": whole.current_bytes, "step_peak_bytes": peak}


def step_bytes(stats: Any) -> int:
    """Bytes ``stats`` counts, but for the operations that are not ZeRO's own
    communication: the sum of the loss over the ranks (each step, each evaluation) and
    stage 3's gathering of the model for ``full_params``.  The difference over the steps
    is their gradients', parameters' and found_inf's bytes."""
    from minipar.parallel.zero.engine import OP_EVAL, OP_GATHER, OP_LOSS

    return stats.bytes_sent() - sum(stats.bytes_sent(op) for op in (OP_LOSS, OP_EVAL, OP_GATHER))


def engine_exact_bytes(eng: Any) -> int:
    """:func:`exact_bytes_sent` of a :class:`~minipar.parallel.zero.engine.ZeRO` engine (with
    ZeRO++: :func:`zeropp_exact_bytes`, plus found_inf's all-reduce under loss scaling)."""
    if eng.zeropp:
        from minipar.collectives.cost import allreduce_bytes_sent
        from minipar.parallel.zero.shard import unit_table

        spans = [(a, b) for _, a, b, _ in unit_table(eng.model.cfg)]
        inf = (allreduce_bytes_sent(1, 8, eng.comm.size, eng.comm.rank, eng.allreduce)
               if eng.states.scaler is not None else 0)
        hooks, walk = eng.zero_hooks, eng._learned  # (remat's walk: fetches per unit)
        fetches = [walk.count(u.name) for u, *_ in unit_table(eng.model.cfg)] if walk else None
        return inf + zeropp_exact_bytes(spans, eng.comm.size, hooks.node.size, eng.comm.rank,
                                        eng.zeropp, hooks.block,
                                        eng.policy.param_dtype.itemsize,
                                        fetches=fetches)["total"]
    return exact_bytes_sent(eng.layout.size, eng.comm.size, eng.comm.rank, eng.stage,
                            eng.policy.param_dtype.itemsize, eng.allreduce,
                            found_inf=eng.states.scaler is not None, reshard=eng.reshard)


def prefetch_peak_elements(unit_sizes: list[int], prefetch: int, reshard: bool = True) -> int:
    """The most parameters ZeRO-3 holds gathered at once (elements), units of
    ``unit_sizes`` in walk order, ``prefetch`` K units ahead.  The walk fetches the units
    forward, then backward in reverse (2n positions); at position k a rank holds the unit
    it computes and the K all-gathers posted ahead:

        reshard:     max_k  Σ_{q=k}^{min(k+K, 2n-1)} size(order[q])   (K = 0: the largest unit)
        no reshard:  Ψ = Σ sizes (every unit stays gathered until its backward)

    so prefetching costs up to the K largest neighbours' parameters more than blocking."""
    if not reshard:
        return sum(unit_sizes)
    order = list(unit_sizes) + list(unit_sizes)[::-1]
    return max(sum(order[k:k + prefetch + 1]) for k in range(len(order)))


def walk_peak_elements(walk: list[tuple[str, int]], prefetch: int, reshard: bool = True) -> int:
    """:func:`prefetch_peak_elements` along any walk of ``(unit, size)`` fetches (a pipeline
    stage's: every micro-batch's forward and backward, recomputations included): with
    resharding the largest window of K + 1 consecutive fetches (a unit fetched twice in
    one window is held twice: one buffer per fetch posted); without, every unit the walk
    fetches, once (Ψ_p: each stays gathered until its last fetch, and in a pipeline every
    unit's first forward comes before any last backward)."""
    if not reshard:
        return sum(dict(walk).values())
    sizes = [n for _, n in walk]
    return max(sum(sizes[k:k + prefetch + 1]) for k in range(len(sizes)))


def exact_bytes_sent(psi: int, n: int, rank: int, stage: int, itemsize: int,
                     allreduce: str = "auto", found_inf: bool = False,
                     reshard: bool = True) -> int:
    """Bytes rank ``rank`` of ``n`` sends in one ZeRO-``stage`` step, exactly (module doc).

    ``itemsize``: bytes of a parameter/gradient element; ``allreduce``: the engine's
    algorithm (``"auto"`` resolved by Ψ x itemsize and N); ``found_inf``: loss
    scaling on (one more all-reduce, of one float64); ``reshard=False`` (stage 3 without
    resharding after forward): one all-gather of the parameters instead of two.
    Prefetching changes when the bytes move, not how many."""
    from minipar.collectives import chunk_counts
    from minipar.collectives.cost import (
        all_gather_bytes,
        allreduce_bytes_sent,
        reduce_scatter_bytes,
    )

    if stage == 0:
        sent = allreduce_bytes_sent(psi, itemsize, n, rank, allreduce)
    else:
        gathers = 2 if stage == 3 and reshard else 1
        sent = (reduce_scatter_bytes(psi, itemsize, n, rank)[0]
                + gathers * all_gather_bytes(chunk_counts(psi, n), itemsize, rank)[0])
    if found_inf:
        sent += allreduce_bytes_sent(1, 8, n, rank, allreduce)
    return sent


def allreduce_note(psi: int, n: int, itemsize: int, allreduce: str = "auto") -> str:
    """One line for stage 0: which all-reduce ran and why, and where the paper's figure is.

    e.g. ``recursive doubling: S = 40,000 B is below 510,397 B, the size from which the
    alpha-beta-gamma model has the ring faster on 2 ranks; the paper's figure is the
    ring's: --allreduce ring``."""
    from minipar.collectives.auto import ring_threshold

    S = psi * itemsize
    names = {"ring": "ring", "recursive_doubling": "recursive doubling", "tree": "binomial tree"}
    if n == 1:
        return "stage 0's all-reduce: nothing to send on 1 rank"
    if allreduce != "auto":
        why = f"{names[allreduce]} (--allreduce {allreduce})"
    else:
        edge, model = ring_threshold(n), "the alpha-beta-gamma model"
        if edge == float("inf"):
            why = f"recursive doubling: {model} never has the ring faster on {n} ranks, S = {S:,} B"
        elif S >= edge:
            why = (f"ring: S = {S:,} B is at or above {int(edge):,} B, the size from which "
                   f"{model} has the ring faster on {n} ranks")
        else:
            why = (f"recursive doubling: S = {S:,} B is below {int(edge):,} B, the size from "
                   f"which {model} has the ring faster on {n} ranks")
    if why.startswith("ring"):
        return f"stage 0's all-reduce: {why}; the paper's figure is the ring's"
    return f"stage 0's all-reduce: {why}; the paper's figure is the ring's: --allreduce ring"


def formulas(psi: int, n: int, stage: int, precision: str,
             allreduce: str = "auto") -> dict[str, Any]:
    """The paper's per-rank figures for this run: model-state bytes and bytes sent per step.

    Keys: ``model_state``, ``model_state_text``, ``bytes`` (the paper's 2Ψ(N-1)/N or
    3Ψ(N-1)/N, in bytes: the ring's), ``bytes_text`` and, for stage 0, ``allreduce_note``
    (:func:`allreduce_note`; None for stages 1-3)."""
    import numpy as np

    from minipar.plan.zero import STAGE_FORMULAS, zero_comm_bytes_per_rank, zero_model_state_bytes
    from minipar.precision import get

    pol = get(precision)
    p = pol.param_dtype.itemsize
    k = 12 if pol.master_dtype is not None else 2 * np.dtype(pol.state_dtype).itemsize
    held = (f"({p}+{p}+{k})Ψ", f"{2 * p}Ψ + {k}Ψ/N", f"{p}Ψ + ({p}+{k})Ψ/N",
            f"({p}+{p}+{k})Ψ/N")[stage]
    paper = STAGE_FORMULAS[stage].replace("K", "12")
    text = (f"{held}, the paper's {STAGE_FORMULAS[stage]} with K = 12" if (p, k) == (2, 12) else
            f"{held}: {p}-byte params and grads, K = {k} bytes of optimizer state per "
            f"parameter (the paper's mixed precision: {paper})")
    return {"model_state": zero_model_state_bytes(psi, n, stage, k, p, p),
            "model_state_text": text,
            "bytes": zero_comm_bytes_per_rank(psi, n, stage, p),
            "bytes_text": f"{3 if stage == 3 else 2}Ψ(N-1)/N x {p} bytes (ring)",
            "allreduce_note": allreduce_note(psi, n, p, allreduce) if stage == 0 else None}


# -- ZeRO++ (Wang et al. 2023, arXiv 2306.10209) -------------------------------------
#: the operations of a ZeRO++ step (ZeRO-3's, the quantized ones, hpZ's node all-gather)
ZEROPP_OPS = ("all_gather", "reduce_scatter", "qwz_all_gather", "qgz_all_to_all_node",
              "qgz_all_to_all_cross")


def zeropp_exact_bytes(spans: list[tuple[int, int]], n: int, k: int, rank: int,
                       parts: tuple[str, ...], block: int, itemsize: int,
                       micro_batches: int = 1, fetches: list[int] | None = None
                       ) -> dict[str, int]:
    """Bytes rank ``rank`` of ``n`` (nodes of ``k`` consecutive ranks) sends in one ZeRO-3
    step with ZeRO++'s ``parts`` (none: ZeRO-3's own), exactly, and how many of them
    stay inside its node (``intra``) or cross to another (``inter``).  ``spans``: the
    units' [a, b) of the flat buffer; b = ``itemsize``; C_q^u: rank q's part of unit u
    (its span cut at the shard borders), D_j^u: local rank j's part of u in the node's
    secondary partition (the buffer cut into k shards); w8(c), w4(c): the bytes of c
    elements packed in int8 / int4 with one b-byte scale per ``block``
    (:meth:`minipar.parallel.zero.zeropp.BlockCodec.size`).  Per unit, r = mk + j:

    =====================  ====================================  =========================
    collective             ZeRO-3                                ZeRO++
    =====================  ====================================  =========================
    forward all-gather     Σ_{q≠r+1} C_q b  (ring, to r+1)       qwZ: Σ_{q≠r+1} w8(C_q)
    backward all-gather    the same                              hpZ: Σ_{i≠j+1} D_i b, in
                                                                 the node's ring
    reduce-scatter         Σ_{q≠r} C_q b  (ring, to r+1)         qgZ: Σ_{i≠j} Σ_m'
                                                                 w4(C_{m'k+i}) in the
                                                                 node, then
                                                                 Σ_{m'≠m} w4(node sum of
                                                                 C_{m'k+j}) across
    =====================  ====================================  =========================

    The ring's messages go to r+1: inside the node unless r is a node's last rank.
    Summed over the units: ZeRO-3's 3Ψ(N-1)/N b becomes, in the paper's terms,
    Ψ(N-1)/N (1 + b/block) for qwZ's gather, Ψ(k-1)/k b inside the node for hpZ's, and
    Ψ(k-1)/k (1/2 + b/block) inside plus Ψ(M-1)/(Mk) (1/2 + b/block) across nodes for qgZ
    (M = n/k nodes; :func:`zeropp_formula_bytes`).

    With ``micro_batches`` m (a pipeline stage's ZeRO-3, :mod:`minipar.parallel.hybrid.sync`)
    a unit is fetched 2m times a step and reduce-scattered m times: its first fetch is the
    forward all-gather above, the 2m − 1 others the backward's (hpZ: the node's), m times the
    reduce-scatter; ``fetches``: each unit's fetches a step instead of 2m (remat fetches a
    recomputed unit once more: the learnt walk's count).  ``shard``: the bytes on ZeRO's own
    communicator (its global all-gathers and ring reduce-scatters; hpZ's and qgZ's go on
    the node and cross ones)."""
    import numpy as np

    from minipar.parallel.zero.shard import shard_range
    from minipar.parallel.zero.zeropp import BlockCodec

    psi = spans[-1][1]
    shards = [shard_range(psi, n, q) for q in range(n)]
    node_shards = [shard_range(psi, k, i) for i in range(k)]
    m, j = divmod(rank, k)
    same = (rank + 1) % n // k == m  # my ring message stays in the node
    out = {"intra": 0, "inter": 0, "shard": 0}
    mb = micro_batches

    def cut(a: int, b: int, table: list[tuple[int, int]]) -> list[int]:
        return [max(0, min(b, hi) - max(a, lo)) for lo, hi in table]

    def w(c: int, fmt: str) -> int:
        return BlockCodec(fmt, block).size(c, np.dtype(f"u{itemsize}"))

    def ring(nbytes: int) -> None:
        out["intra" if same else "inter"] += nbytes
        out["shard"] += nbytes

    for u, (a, b) in enumerate(spans):
        c, d = cut(a, b, shards), cut(a, b, node_shards)
        later = (2 * mb if fetches is None else fetches[u]) - 1  # fetches after the first
        right = (rank + 1) % n
        fwd = sum(w(x, "int8") if "qwz" in parts else x * itemsize
                  for q, x in enumerate(c) if q != right)
        ring(fwd)
        if "hpz" in parts:
            out["intra"] += later * sum(x for i, x in enumerate(d)
                                        if i != (j + 1) % k) * itemsize
        else:
            ring(later * fwd)
        if "qgz" in parts:
            if k > 1:
                out["intra"] += mb * sum(w(c[mm * k + i], "int4") for i in range(k) if i != j
                                         for mm in range(n // k))
            if n // k > 1:
                out["inter"] += mb * sum(w(c[mm * k + j], "int4") for mm in range(n // k)
                                         if mm != m)
        else:
            ring(mb * sum(x for q, x in enumerate(c) if q != rank) * itemsize)
    return {"total": out["intra"] + out["inter"], **out}


def zeropp_formula_bytes(psi: int, n: int, k: int, parts: tuple[str, ...], block: int,
                         itemsize: int, micro_batches: int = 1) -> dict[str, float]:
    """The paper's per-rank volumes for Ψ parameters on n ranks in nodes of k (M = n/k),
    b = ``itemsize`` (the run's dtype, not the paper's fp16), scales included, by
    collective and in all (``total``) and across nodes (``inter``, what ZeRO++ cuts):
    forward all-gather Ψ(N-1)/N · (b or 1 + b/block with qwZ); backward all-gather the
    same, or Ψ(k-1)/k · b inside the node with hpZ; reduce-scatter Ψ(N-1)/N · b, or with
    qgZ Ψ(k-1)/k · (1/2 + b/block) inside and Ψ(M-1)/(Mk) · (1/2 + b/block) across.
    ``inter`` counts a ring's bytes as the paper does for its slow links: the whole
    volume of a global collective (its ring crosses nodes) and none of a node's.  With
    ``micro_batches`` m (a pipeline stage): the backward all-gather 2m − 1 times, the
    reduce-scatter m times (:func:`zeropp_exact_bytes`)."""
    mm, mb = n // k, micro_batches
    w8, w4 = 1 + itemsize / block, 0.5 + itemsize / block
    fwd = psi * (n - 1) / n * (w8 if "qwz" in parts else itemsize)
    bwd = (2 * mb - 1) * (psi * (k - 1) / k * itemsize if "hpz" in parts else fwd)
    if "qgz" in parts:
        rs_in, rs_out = mb * psi * (k - 1) / k * w4, mb * psi * (mm - 1) / (mm * k) * w4
    else:
        rs_in, rs_out = 0.0, mb * psi * (n - 1) / n * itemsize
    total = fwd + bwd + rs_in + rs_out
    inter = (fwd if mm > 1 else 0.0) + (bwd if mm > 1 and "hpz" not in parts else 0.0) + (
        rs_out if mm > 1 else 0.0)
    return {"forward_all_gather": fwd, "backward_all_gather": bwd,
            "reduce_scatter": rs_in + rs_out, "total": total, "inter": inter}


def zeropp_measured(stats: Any, hosts: list[int], world_ranks: list[int], rank: int,
                    steps: int, comms: tuple[str, ...] = ()) -> dict[str, float]:
    """Bytes per step this rank sent in ZeRO++'s operations (:data:`ZEROPP_OPS`), or on the
    communicators ``comms`` (the hybrid's: its ZeRO communicator, ``zeropp_node``,
    ``zeropp_cross``), in all and to ranks of its own node (``intra``) or of others
    (``inter``), by each peer's host."""
    host = {w: hosts[r] for r, w in enumerate(world_ranks)}
    mine, out = hosts[rank], {"intra": 0, "inter": 0}
    sent = ([stats.peers_sent_on(c) for c in comms] if comms
            else [stats.peers_sent(op) for op in ZEROPP_OPS])
    for peers in sent:
        for peer, b in peers.items():
            out["intra" if host.get(peer, -1) == mine else "inter"] += b
    return {"total": (out["intra"] + out["inter"]) / steps, "intra": out["intra"] / steps,
            "inter": out["inter"] / steps}


def hpz_secondary_elements(psi: int, k: int, local: int) -> int:
    """The elements hpZ's secondary slices hold on local rank ``local`` of a node of ``k``:
    its shard of the buffer cut k ways, C'_local = Ψ/k (array_split rule), kept from a
    unit's forward to its backward — at the end of the forward, every unit's."""
    from minipar.parallel.zero.shard import shard_range

    lo, hi = shard_range(psi, k, local)
    return hi - lo
