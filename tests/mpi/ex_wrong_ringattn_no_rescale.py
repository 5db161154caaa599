"""Wrong ring_attention_merge: the running output is not rescaled by exp(lse_old - lse_new)."""

import numpy as np

from minipar.exercises.ring_attention_merge.solution import attention_block


def merge(o, lse, o_blk, lse_blk):
    new = np.logaddexp(lse, lse_blk)
    return o + np.exp(lse_blk - new)[..., None] * o_blk, new  # wrong: old o not rescaled


def ring_attention(comm, x, k, v, causal=True):
    n, r = comm.Get_size(), comm.Get_rank()
    right, left = (r + 1) % n, (r - 1) % n
    o, lse = np.zeros(x.shape), np.full(x.shape[:-1], -np.inf)
    kb, vb = k.copy(), v.copy()
    B = x.shape[-2]
    for s in range(n):
        src = (r - s) % n
        if not causal or src < r:
            o, lse = merge(o, lse, *attention_block(x, kb, vb))
        elif src == r:
            o, lse = merge(o, lse, *attention_block(x, kb, vb, np.tri(B, dtype=bool)))
        if s < n - 1:
            k_in, v_in = np.empty_like(kb), np.empty_like(vb)
            comm.Sendrecv(kb, dest=right, recvbuf=k_in, source=left)
            comm.Sendrecv(vb, dest=right, recvbuf=v_in, source=left)
            kb, vb = k_in, v_in
    return o
