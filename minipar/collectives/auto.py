"""Choosing an all-reduce algorithm by the α–β–γ cost model, as MPICH does.

EN algorithm selection (auto all-reduce) · RU выбор алгоритма (автоматический all-reduce) ·
ZH 算法选择（自动全归约）

No one all-reduce is best at every size.  Thakur, Rabenseifner & Gropp,
"Optimization of collective communication operations in MPICH", IJHPCA
19(1), 2005, price a message of n bytes at ``α + n β`` (α: the fixed cost
of a message, β: seconds per byte) and reducing n bytes at ``n γ``; MPICH
runs recursive doubling for short messages and a bandwidth-optimal
algorithm for long ones.  With N ranks (p the largest power of two <= N),
:mod:`minipar.collectives.cost_model` has the times:

================== ====================================== =========================
algorithm          messages on the critical path          bytes sent / reduced
================== ====================================== =========================
ring               2(N-1)                                 2(N-1)/N S / (N-1)/N S
recursive doubling log2 p, + 2 when N is not a power of 2  S per round / S per round
binomial tree      2 ceil(log2 N)                         as many bytes, more messages
================== ====================================== =========================

In the model the tree never beats recursive doubling (as many bytes, more
messages; measured with more ranks than cores it sometimes does), so auto
chooses between the other two: **the one the model says is faster**
(:func:`choose_allreduce`; recursive doubling on a tie).  The difference of
the two times is linear in S, so there is one crossover size
(:func:`ring_threshold`): recursive doubling below it (fewer messages, α
wins), the ring from it up (fewer bytes, β and γ win).  On 2 ranks both send
S bytes, but the ring adds S/2 where recursive doubling adds S: the ring wins
from ``S = 2α/γ`` up.  Without γ (the α–β model alone) the ring would never
win on 2 ranks; the additions decide.

The constants are this machine's, measured by ``minipar bench collectives
--calibrate`` and committed as ``calibration.json``; the choice depends only
on that file, the bytes and N, so the ranks of one installation agree
without a message.  (Data parallelism decides once per run on rank 0 and
broadcasts its per-bucket choice: :mod:`minipar.parallel.data_parallel.engine`.)
With the committed constants (α 6.5 us, 1/β 18.6 GB/s, 1/γ 39 GB/s, measured
on 2 ranks, 2026-12-04) the crossovers are about 510 KB on N = 2, 52 KB on
3, 440 KB on 4 and 590 KB on 8.

**Checked against measurement** (``minipar bench collectives -n N
--collectives allreduce --algorithms ring recursive_doubling``, 2 cores,
quiet, 2026-12-04; time of the ring / time of recursive doubling, RD):

==  ===============================================  =================
N   measured                                         the model's choice
==  ===============================================  =================
2   64 KiB 1.28-1.37, 1 MiB 0.76-0.88                RD, ring
3   64 KiB 1.57, 256 KiB 0.78, 1 MiB 0.79            ring, ring, ring
4   64 KiB 2.10, 256 KiB 1.06, 1 MiB 0.86            RD, RD, ring
8   256 KiB 1.82, 1 MiB 1.84, 4 MiB 0.96             RD, ring, ring
==  ===============================================  =================

Every choice is the faster one but two, both with more ranks than cores: 3
ranks at 64 KiB (recursive doubling 1.57x faster than the ring the model
picks) and 8 ranks at 1 MiB (1.84x).  There each of the ring's 2(N-1)
messages also waits for its receiver to be scheduled, an α (and a β) the
2-rank calibration does not see, so the measured crossover moves up (about
4 MiB on 8 ranks on 2 cores); on 4 ranks the model's crossover, 440 KB,
happens to fall where the measured one does.  A calibration per world size
was tried and not adopted: α and β of an exchange among all N ranks at once
(25, 65, 185 us and 5.4-6.5, 6.1, 1.4 GB/s on 3, 4, 8 ranks here) move the
crossovers to 79 KB, 2.3 MB and 2.1 MB: right on 3 and 8 ranks, wrong on 4
(the ring, measured 0.86-1.0x recursive doubling's time at 1 MiB, would no
longer run there).  With one rank per core, the 2-rank constants are the
ones that matter.  An earlier
rule, a fixed 8 MiB for N >= 3 and never the ring on 2 ranks, was measured
before the traced communicator's per-message cost fell from ~30 us to
~7 us; it left ``auto`` at half of MPI's bus bandwidth at 1 MiB.

**Where the small-message floor comes from.**  An 8-byte all-reduce is all
α, and α here is Python per message plus the wait.  On 2 ranks (a core
each) an 8-byte ``Sendrecv`` through :class:`~minipar.comm.traced.TracedComm`
costs ~7 us (the calibration's α) against 2.6-4.1 us for mpi4py's own; a
collective adds its tag and size checks (:mod:`minipar.collectives._base`)
and a NumPy ufunc per step: recursive doubling takes 14-21 us against MPI's
10-14 us.  With more ranks than cores a rank that waits hands its core away
(:mod:`minipar.comm.waiting`) and the partner it waits for may not run again
for a scheduler time slice, while MPI's own Allreduce spins in C.
"""

from __future__ import annotations

import functools
import math
from typing import Any

import numpy as np

from minipar import checks
from minipar.collectives import _base as B
from minipar.collectives.cost_model import LinkCosts, allreduce_time, choose_by_model, load_costs
from minipar.collectives.ring import ring_allreduce
from minipar.collectives.tree import recursive_doubling_allreduce

#: the algorithms ``auto`` chooses between
AUTO_CHOICES = ("recursive_doubling", "ring")
_NEVER_BYTES = 1 << 60  # a crossover beyond this many bytes is "never"


def ring_threshold(world: int, costs: LinkCosts | None = None) -> float:
    """The fewest bytes from which auto runs the ring on ``world`` ranks, by the model
    (``costs``, default the committed calibration); ``math.inf``: never (N = 1, or a model
    in which the ring's time never drops below recursive doubling's)."""
    checks.integer("world size", world, 1)
    c = load_costs() if costs is None else costs
    if world == 1:
        return math.inf

    def gap(s: int) -> float:  # ring time - recursive doubling time: linear in s
        ring, rd = (allreduce_time(a, s, world, c) for a in ("ring", "recursive_doubling"))
        return ring - rd

    def ring(s: int) -> bool:
        return choose_by_model(s, world, c) == "ring"

    slope = (gap(1 << 30) - gap(0)) / (1 << 30)
    if slope >= 0 or -gap(0) / slope > _NEVER_BYTES:
        return 0.0 if ring(0) else math.inf
    guess = max(0, math.floor(-gap(0) / slope))  # the edge up to rounding: bisect near it
    lo, hi = max(0, guess - 2), guess + 2
    while lo > 0 and ring(lo):
        lo //= 2
    while not ring(hi):
        hi *= 2
    if ring(lo):
        return float(lo)
    while hi - lo > 1:  # ring(hi) and not ring(lo)
        mid = (lo + hi) // 2
        lo, hi = (lo, mid) if ring(mid) else (mid, hi)
    return float(hi)


def choose_allreduce(nbytes: int, world: int, costs: LinkCosts | None = None) -> str:
    """``"ring"`` or ``"recursive_doubling"``: the faster by the α–β–γ model
    (:func:`~minipar.collectives.cost_model.choose_by_model`, ``costs`` or the committed
    calibration), read off the crossover :func:`ring_threshold` (computed once per world
    size and constants: a blocking all-reduce of 8 bytes must not pay for the model).

    Depends only on the buffer's bytes, the world size and the constants, so every rank
    that passes the same array makes the same choice.
    """
    checks.integer("nbytes", nbytes, 0)
    checks.integer("world size", world, 1)
    return "ring" if nbytes >= _edge(world, load_costs() if costs is None else costs) else (
        "recursive_doubling")


@functools.lru_cache(maxsize=256)
def _edge(world: int, costs: LinkCosts) -> float:
    return ring_threshold(world, costs)


def auto_allreduce(comm: Any, x: Any, op: str = "sum") -> np.ndarray:
    """All-reduce by the algorithm :func:`choose_allreduce` picks for ``x.nbytes`` and N.

    Counted under the chosen algorithm's name (``"ring_allreduce"`` or
    ``"recursive_doubling_allreduce"``); its bytes:
    :func:`minipar.collectives.cost.allreduce_bytes`.
    """
    B.check_op(op)
    c, a = B.prepare(comm, x)
    if a.nbytes >= _edge(c.size, load_costs()):  # choose_allreduce, its arguments known good
        return ring_allreduce(c, a, op)
    return recursive_doubling_allreduce(c, a, op)
