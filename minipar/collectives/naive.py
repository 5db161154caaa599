"""Naive all-reduce: gather to one rank, reduce there, send the result back.

EN parameter server (naive all-reduce) · RU сервер параметров (наивный all-reduce) ·
ZH 参数服务器 (朴素全归约)

The pattern of the parameter server (Li et al., "Scaling distributed machine
learning with the parameter server", OSDI 2014): every worker sends its whole
buffer of S bytes to one place, which reduces and sends the result to every
worker.  Here the "server" is a rank (``root``) that also contributes its own
buffer, so with N ranks, exactly:

* the root receives (N-1) x S bytes and sends (N-1) x S bytes;
* every other rank sends S bytes and receives S bytes, only to/from the root.

(With a separate server process and N workers the textbook figure is N x S
in and N x S out.)  The root's link carries N-1 times what any link carries in
a ring all-reduce (2(N-1)/N x S per rank, see :mod:`minipar.collectives.ring`):
that bottleneck is what the ring removes.  The root reduces in rank order
0, 1, ..., N-1, in the input dtype.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from minipar import backend
from minipar.collectives import _base as B


def naive_allreduce(comm: Any, x: Any, op: str = "sum", root: int = 0) -> np.ndarray:
    """Element-wise ``op`` of every rank's ``x`` on every rank, through ``root``.

    Counted under ``"naive_allreduce"``.
    """
    B.check_op(op)
    c, a = B.prepare(comm, x)
    ufunc, am = B.check_op(op, a), backend.array_module(a)
    B.check_root(root, c.size)
    tag = B.tag_for("naive_allreduce", a.dtype, op)
    out = am.empty_like(a)
    flat = out.reshape(-1)
    with c.operation("naive_allreduce"):
        if c.rank != root:
            c.Send(a.reshape(-1), root, tag)
            B.recv(c, flat, root, tag)
            return out
        scratch = am.empty_like(flat)
        for i in range(c.size):  # reduce in rank order: x_0 op x_1 op ... op x_{N-1}
            if i == root:
                got = a.reshape(-1)
            else:
                B.recv(c, scratch, i, tag)
                got = scratch
            if i == 0:
                flat[...] = got
            else:
                ufunc(flat, got, out=flat)
        reqs = [c.Isend(flat, i, tag) for i in range(c.size) if i != root]
        c.waitall(reqs)
    return out
