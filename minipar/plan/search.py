"""The layout planner: every layout of the space, those that fit, ranked by step time.

EN layout planner · RU планировщик раскладки · ZH 布局规划器

Enumerates :func:`~minipar.plan.layouts.layout_space` (exhaustive over the
space named there), drops the layouts whose memory per GPU
(:func:`~minipar.plan.layouts.layout_memory`) exceeds the cluster's, estimates
the rest (:func:`~minipar.plan.step_time.estimate`) and sorts them by
estimated step time (then memory).  When nothing fits, one ``ValueError``
says the smallest memory any layout needs and which layout that is.

PTD-P's takeaways (Narayanan et al. 2021, arXiv 2104.04473, §3.3) fall out
of the estimate rather than being coded in: tensor parallelism beyond a
server pays the network's β on 4–6 all-reduces per layer per micro-batch;
pipeline parallelism pays (p − 1)/m of bubble, so it goes across servers
where its few point-to-point messages are cheap; data parallelism takes the
rest.  :func:`compare_placements` shows the same (t, p) with TP inside and
across servers.
"""

from __future__ import annotations

from minipar.plan._check import count
from minipar.plan.cluster import Cluster
from minipar.plan.human import human_bytes
from minipar.plan.layouts import Layout, ModelSpec, layout_memory, layout_space
from minipar.plan.step_time import estimate
from minipar.plan.zero import K_ADAM


def _gb(x: float) -> str:
    """80 GB, 351.7 GB; below 1 GB in the unit that reads: 22.0 kB."""
    return f"{x / 1e9:.1f} GB".replace(".0 GB", " GB") if x >= 1e9 else human_bytes(x)


def _describe(lay: Layout) -> str:
    return (f"d={lay.d} t={lay.t} p={lay.p} c={lay.c} zero={lay.zero} remat={lay.remat} "
            f"b={lay.b} m={lay.m}")


def search(model: ModelSpec, n: int, cluster: Cluster, global_batch: int, top: int | None = None,
           max_b: int = 8, itemsize: int = 2, K: float = K_ADAM, max_c: int | None = None
           ) -> dict[str, object]:
    """Rank the layouts of ``n`` GPUs that fit.

    Returns ``ranked`` (estimates, fastest first, at most ``top``), ``considered``
    (layouts in the space), ``fitting`` (how many fit), ``smallest`` (the least
    memory any layout needs, bytes, and that layout).  ValueError when the space
    is empty or no layout fits.
    """
    n, B = count("n", n), count("global_batch", global_batch)
    space = layout_space(model, n, B, max_b, max_c)
    if not space:
        raise ValueError(f"no layout of {n} GPUs: none of d·t·p·c = {n} has t dividing the "
                         f"{model.heads} heads, p the {model.n_layer} layers, c the sequence "
                         f"{model.seq} and d the global batch {B}")
    mem_cache: dict[tuple, dict[str, float]] = {}
    fitting: list[tuple[Layout, dict[str, float]]] = []
    smallest = None
    for lay in space:
        key = (lay.d, lay.t, lay.p, lay.c, lay.zero, lay.remat, lay.b)
        if key not in mem_cache:
            mem_cache[key] = layout_memory(model, lay, itemsize, K)
        total = mem_cache[key]["total"]
        if smallest is None or total < smallest[0]:
            smallest = (total, lay)
        if total <= cluster.memory_bytes:
            fitting.append((lay, mem_cache[key]))
    assert smallest is not None
    if not fitting:
        raise ValueError(
            f"no layout of {n} GPUs fits in {_gb(cluster.memory_bytes)} per GPU: the "
            f"smallest needs {_gb(smallest[0])} per GPU ({_describe(smallest[1])}); "
            "use more GPUs, GPUs with more memory, or a smaller model or batch")
    ests = [estimate(model, lay, cluster, B, itemsize, K, mem) for lay, mem in fitting]
    ests.sort(key=lambda e: (e["step_s"], e["memory"]["total"]))  # type: ignore[index]
    return {"ranked": ests if top is None else ests[: count("top", top)],
            "considered": len(space), "fitting": len(fitting),
            "smallest": {"bytes": smallest[0], "layout": smallest[1].as_dict()}}


def compare_placements(model: ModelSpec, lay: Layout, cluster: Cluster, global_batch: int
                       ) -> dict[str, dict[str, object]]:
    """The same layout with tensor groups inside servers (``tp-inner``) and across (``pp-inner``)."""
    return {pl: estimate(model, Layout(**{**lay.as_dict(), "placement": pl}), cluster,
                         global_batch) for pl in ("tp-inner", "pp-inner")}
