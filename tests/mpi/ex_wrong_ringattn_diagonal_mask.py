"""Wrong ring_attention_merge: every block masked with the lower triangle, as if it were the diagonal."""

import numpy as np

from minipar.exercises.ring_attention_merge.solution import attention_block


def merge(o, lse, o_blk, lse_blk):
    new = np.logaddexp(lse, lse_blk)
    return np.exp(lse - new)[..., None] * o + np.exp(lse_blk - new)[..., None] * o_blk, new


def ring_attention(comm, x, k, v, causal=True):
    n, r = comm.Get_size(), comm.Get_rank()
    right, left = (r + 1) % n, (r - 1) % n
    o, lse = np.zeros(x.shape), np.full(x.shape[:-1], -np.inf)
    kb, vb = k.copy(), v.copy()
    B = x.shape[-2]
    for s in range(n):
        if not causal:
            o, lse = merge(o, lse, *attention_block(x, kb, vb))
        else:  # wrong: the mask is about global positions, not the position in the block
            o, lse = merge(o, lse, *attention_block(x, kb, vb, np.tri(B, dtype=bool)))
        if s < n - 1:
            k_in, v_in = np.empty_like(kb), np.empty_like(vb)
            comm.Sendrecv(kb, dest=right, recvbuf=k_in, source=left)
            comm.Sendrecv(vb, dest=right, recvbuf=v_in, source=left)
            kb, vb = k_in, v_in
    return o
