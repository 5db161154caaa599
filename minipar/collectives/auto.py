"""Choosing an all-reduce algorithm by message size and world size, as MPICH does.

EN algorithm selection (auto all-reduce) · RU выбор алгоритма (автоматический all-reduce) ·
ZH 算法选择（自动全归约）

No one all-reduce is best at every size.  Thakur, Rabenseifner & Gropp,
"Optimization of collective communication operations in MPICH", IJHPCA
19(1), 2005, model a message of S bytes as costing ``alpha + S / beta``
(alpha: the fixed cost of one message, beta: bandwidth; Hockney's model) and
MPICH picks recursive doubling below a size threshold and a bandwidth-optimal
algorithm above it.  With N ranks (p the largest power of two <= N):

================== ====================================== ==============================
algorithm          sequential messages (critical path)    bytes on the critical path
================== ====================================== ==============================
ring               2(N-1)                                 2(N-1)/N x S
recursive doubling log2 p, + 2 when N is not a power of 2  (log2 p + 2 if N != p) x S
binomial tree      2 ceil(log2 N)                         2 ceil(log2 N) x S
================== ====================================== ==============================

The tree never has fewer messages than recursive doubling and moves as many
bytes, so it never wins in this model; recursive doubling takes the small
messages, the ring the large ones.  Setting the two times equal gives the
size from which the ring wins::

    S*(N) = alpha·beta x (2(N-1) - L) / (L - 2(N-1)/N),   L = messages of recursive doubling

For N = 2 the denominator is 0 (one message of S against two of S/2, the
same bytes): the ring never wins, and auto never picks it.  For N >= 3 the
model's S*(N) moves with N (0.6, 8, 2.6, 8.8 x alpha·beta at N = 3, 4, 6, 8),
but on this machine the measured crossovers did not: they sit near 8 MiB for
every N measured and move more with the machine's load than with N.  So the
rule is the measurement: **the ring from 8 MiB up when N >= 3, recursive
doubling below it and always for N <= 2** (``RING_MIN_BYTES``).  MPICH's
default is the same shape with its own numbers (recursive doubling up to
2 KiB, then Rabenseifner's reduce-scatter + all-gather).

**How it was measured (this machine: 2 shared cores, other engineers' tests
running).**  ``minipar bench collectives -n N --collectives allreduce
--algorithms mpi ring recursive_doubling``, 10 timed calls per size up to
1 MiB (3 above), 2-3 runs per N; the crossover is where the ring's median
time drops below recursive doubling's.  Two sweeps, the second on a busier
machine (MPI's own times 1.7-3.5x those of the first at 1 MiB); ring time /
recursive doubling time (first: of the median times of 3 runs; second: the
range over its runs):

==  =============================================  ==============================================
N   first sweep (64 B .. 16 MiB, x4 steps)          busier (256 KiB .. 16 MiB, x2 steps)
==  =============================================  ==============================================
2   4 MiB 1.20, 16 MiB 0.98                         --
3   1 MiB 0.88, 4 MiB 0.96, 16 MiB 0.47             1 MiB 1.26-1.53, 4 MiB 0.88-1.40, 8 MiB 0.77-0.94
4   4 MiB 1.19, 16 MiB 0.77                         4 MiB 1.30-1.36, 8 MiB 0.75-1.01, 16 MiB 0.45-0.76
6   --                                              4 MiB 1.71-1.77, 8 MiB 1.07-1.08, 16 MiB 0.45-0.67
8   4 MiB 1.85, 16 MiB 0.69                         4 MiB 1.27-1.59, 8 MiB 0.51-1.26, 16 MiB 0.76
==  =============================================  ==============================================

The crossover is this large because alpha is large: with more ranks than
cores every message also waits for its receiver to be scheduled (a
recursive-doubling round of 64 B costs ~20 us at 2 ranks, 100-250 us at 4).

**Where the small-message floor comes from.**  An 8-byte all-reduce is all
alpha, and alpha here is Python per message plus the polling wait.  On 2
ranks (a core each, 3 runs): an 8-byte exchange takes 2.6-4.1 us with
mpi4py's own blocking ``Sendrecv`` and 30-33 us (155 in one busy run)
through :class:`~minipar.comm.traced.TracedComm` (two request objects, the
counters, then the *polling wait*: ``Test()`` with ``sched_yield`` for
500 us, then sleeps from 20 us doubling to 1 ms); a collective adds the tag
and size checks of :mod:`minipar.collectives._base` and a NumPy ufunc per
step.  MPI's Allreduce took 9-26 us, recursive doubling 33-70 us.  With 4 ranks on 2 cores a rank that polls politely hands its core
away and the partner it waits for may not run again for a scheduler time
slice, while MPI's own Allreduce spins in C: on a quiet machine auto takes
about 2x MPI's time at 8 B.  On a busy machine the spinning costs MPI more
than politeness costs us, and the ratio can drop below 1 (``minipar bench
collectives`` prints it on every run).
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from minipar import checks

#: the ring from this many bytes up (N >= 3), measured as above
RING_MIN_BYTES = 8 << 20

#: the algorithms ``auto`` chooses between
AUTO_CHOICES = ("recursive_doubling", "ring")


def ring_threshold(world: int) -> float:
    """Bytes from which auto runs the ring on ``world`` ranks (``math.inf``: never, N <= 2)."""
    checks.integer("world size", world, 1)
    return math.inf if world <= 2 else float(RING_MIN_BYTES)


def choose_allreduce(nbytes: int, world: int) -> str:
    """``"ring"`` from :func:`ring_threshold` bytes up, else ``"recursive_doubling"``.

    Depends only on the buffer's bytes and the world size, so every rank
    that passes the same array makes the same choice.
    """
    checks.integer("nbytes", nbytes, 0)
    return "ring" if nbytes >= ring_threshold(world) else "recursive_doubling"


def auto_allreduce(comm: Any, x: Any, op: str = "sum") -> np.ndarray:
    """All-reduce by the algorithm :func:`choose_allreduce` picks for ``x.nbytes`` and N.

    Counted under the chosen algorithm's name (``"ring_allreduce"`` or
    ``"recursive_doubling_allreduce"``); its bytes:
    :func:`minipar.collectives.cost.allreduce_bytes`.
    """
    from minipar.collectives import _base as B
    from minipar.collectives.ring import ring_allreduce
    from minipar.collectives.tree import recursive_doubling_allreduce

    B.check_op(op)
    c, a = B.prepare(comm, x)
    if choose_allreduce(a.nbytes, c.size) == "ring":
        return ring_allreduce(c, a, op)
    return recursive_doubling_allreduce(c, a, op)
