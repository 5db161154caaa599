"""Wrong on purpose: the reduce-scatter assigns (``=``) what it receives instead of adding (``+=``).

Each step overwrites the partial sum with the neighbour's chunk, so the chunk a rank ends
with holds one rank's own values, and the (correct) all-gather passes those around: the
same symptom as an all-gather whose indices are off by one, so the grader names both."""

from __future__ import annotations

from typing import Any

import numpy as np


def ring_allreduce(comm: Any, x: np.ndarray) -> np.ndarray:
    n, r = comm.Get_size(), comm.Get_rank()
    y = x.copy()
    chunks = np.array_split(y, n)
    right, left = (r + 1) % n, (r - 1) % n
    for s in range(n - 1):
        send, recv = chunks[(r - s) % n], chunks[(r - s - 1) % n]
        buf = np.empty_like(recv)
        comm.Sendrecv(send, dest=right, recvbuf=buf, source=left)
        recv[:] = buf  # the mistake: recv += buf
    for s in range(n - 1):
        send, recv = chunks[(r + 1 - s) % n], chunks[(r - s) % n]
        comm.Sendrecv(send, dest=right, recvbuf=recv, source=left)
    return y
