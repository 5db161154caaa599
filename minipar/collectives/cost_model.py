"""The α–β–γ cost model of an all-reduce — модель стоимости α–β–γ — α–β–γ 代价模型.

EN alpha-beta-gamma model · RU модель α–β–γ (задержка, пропускная способность, сложение) ·
ZH α–β–γ 模型（延迟、带宽、归约）

Thakur, Rabenseifner & Gropp, "Optimization of collective communication
operations in MPICH", IJHPCA 19(1), 2005, §2: a message of n bytes costs
``α + n β`` (α: the fixed cost of a message, β: seconds per byte, 1 /
bandwidth) and reducing n bytes costs ``n γ``.  For an all-reduce of S
bytes on N ranks (p = the largest power of two <= N):

=====================  ==================================================================
algorithm              time
=====================  ==================================================================
ring                   2(N-1) α + 2 (N-1)/N S β + (N-1)/N S γ
recursive doubling     log2 p (α + S β + S γ), + 2 α + 2 S β + S γ when N != p (the fold)
=====================  ==================================================================

On 2 ranks both send S bytes, but the ring reduces S/2 (each rank adds one
half) where recursive doubling reduces all of S: the ring costs one α more
and S γ / 2 less, so it wins from ``S = 2 α / γ`` up.  The α–β model alone
(γ = 0) says the ring never wins on 2 ranks; the additions are what decide.

The constants come from :data:`CALIBRATION` (``calibration.json`` beside this
file, committed), measured on 2 ranks by ``minipar bench collectives
--calibrate FILE`` (:func:`measure_costs`): α from an 8-byte exchange through
:class:`~minipar.comm.traced.TracedComm` (Python and the wait included:
that is what a step of our collectives pays), β from a 4 MiB exchange, γ
from a float32 ``numpy.add`` of 4 MiB.  A choice made from them depends on
the file only, so every rank that reads the same file agrees; data
parallelism still decides on rank 0 and broadcasts the decision
(:func:`minipar.parallel.data_parallel.engine.bucket_algorithm`).
"""

from __future__ import annotations

import functools
import json
import math
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from minipar import checks

#: the committed constants of this machine (``minipar bench collectives --calibrate``)
CALIBRATION = Path(__file__).with_name("calibration.json")
#: the algorithms the model compares
MODELLED = ("recursive_doubling", "ring")
_FIELDS = ("alpha_s", "beta_s_per_byte", "gamma_s_per_byte")


@dataclass(frozen=True)
class LinkCosts:
    """α (seconds per message), β (seconds per byte sent), γ (seconds per byte reduced)."""

    alpha_s: float
    beta_s_per_byte: float
    gamma_s_per_byte: float
    measured: str = ""  # when, where and how (free text)

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def _check_costs(d: Any, where: str) -> LinkCosts:
    vals = []
    for k in _FIELDS:
        v = d.get(k) if isinstance(d, dict) else None
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) or v <= 0:
            raise ValueError(f"{where}: {k} must be a positive number of seconds, got {v!r}")
        vals.append(float(v))
    return LinkCosts(*vals, measured=str(d.get("measured", "")))


def load_costs(path: str | Path | None = None) -> LinkCosts:
    """The constants of ``path`` (default :data:`CALIBRATION`); ValueError on a bad file."""
    return _load(_COMMITTED if path is None else str(path))


_COMMITTED = str(CALIBRATION)


@functools.lru_cache(maxsize=8)
def _load(path: str) -> LinkCosts:
    try:
        with open(path, encoding="utf-8") as f:
            data = json.load(f)
    except OSError as e:
        raise ValueError(f"cannot read the calibration file {path}: {e.strerror or e}") from None
    except json.JSONDecodeError as e:
        raise ValueError(f"calibration file {path} is not JSON: {e}") from None
    return _check_costs(data, f"calibration file {path}")


def allreduce_time(algorithm: str, nbytes: int, world: int, costs: LinkCosts) -> float:
    """The model's seconds for an all-reduce of ``nbytes`` on ``world`` ranks (table above)."""
    checks.one_of("the modelled algorithm", algorithm, MODELLED)
    checks.integer("nbytes", nbytes, 0)
    checks.integer("world size", world, 1)
    a, b, g, s, n = costs.alpha_s, costs.beta_s_per_byte, costs.gamma_s_per_byte, nbytes, world
    if n == 1:
        return 0.0
    if algorithm == "ring":
        return 2 * (n - 1) * a + 2 * (n - 1) / n * s * b + (n - 1) / n * s * g
    p = 1 << (n.bit_length() - 1)
    t = math.log2(p) * (a + s * b + s * g)
    return t + (2 * a + 2 * s * b + s * g if n != p else 0.0)


def choose_by_model(nbytes: int, world: int, costs: LinkCosts | None = None) -> str:
    """The algorithm of :data:`MODELLED` the model says is fastest; recursive doubling on
    a tie (fewer messages)."""
    c = load_costs() if costs is None else costs
    t = {a: allreduce_time(a, nbytes, world, c) for a in MODELLED}
    return "ring" if t["ring"] < t["recursive_doubling"] else "recursive_doubling"


def measure_costs(comm: Any, repeat: int = 50, big: int = 4 << 20) -> LinkCosts | None:
    """Measure α, β, γ between ranks 0 and 1 of ``comm`` (a TracedComm; other ranks
    wait at the barriers); rank 0 returns them, the others None.

    α = median time of an 8-byte ``Sendrecv``; β = (median time of a ``big``-byte
    ``Sendrecv`` − α) / big; γ = median time of ``numpy.add(x, y, out=x)`` on ``big``
    bytes of float32, per byte.  Medians of ``repeat`` (α) and ``repeat // 5`` (β, γ)."""
    import platform
    import statistics

    import numpy as np

    if comm.size < 2:
        raise ValueError("measuring α and β needs 2 ranks or more")
    r = comm.rank
    peer = 1 - r if r < 2 else None

    def exchange(nbytes: int, times: int) -> float:
        x, y = np.ones(nbytes // 4, np.float32), np.empty(nbytes // 4, np.float32)
        ts = []
        for i in range(times + 2):
            comm.Barrier()
            t0 = time.perf_counter()
            if peer is not None:
                comm.Sendrecv(x, peer, 7, y, peer, 7)
            if i >= 2:  # two untimed first
                ts.append(time.perf_counter() - t0)
        return statistics.median(ts)

    alpha = exchange(8, repeat)
    t_big = exchange(big, max(repeat // 5, 3))
    x, y = np.ones(big // 4, np.float32), np.ones(big // 4, np.float32)
    ts = []
    for _ in range(max(repeat // 5, 3)):
        t0 = time.perf_counter()
        np.add(x, y, out=x)
        ts.append(time.perf_counter() - t0)
    gamma = statistics.median(ts) / big
    comm.Barrier()
    if r != 0:
        return None
    beta = max(t_big - alpha, 1e-12) / big
    return LinkCosts(alpha, beta, gamma, measured=(
        f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}, {platform.node() or 'host'}, "
        f"{comm.size} ranks, load {_load_average()}: minipar bench collectives --calibrate"))


def _load_average() -> str:
    try:
        import os

        return " ".join(f"{v:.2f}" for v in os.getloadavg())
    except OSError:
        return "unknown"
