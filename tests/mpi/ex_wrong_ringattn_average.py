"""Wrong ring_attention_merge: the plain average of the blocks' partial outputs."""

import numpy as np

from minipar.exercises.ring_attention_merge.solution import attention_block


def ring_attention(comm, x, k, v, causal=True):
    n, r = comm.Get_size(), comm.Get_rank()
    right, left = (r + 1) % n, (r - 1) % n
    outputs = []
    kb, vb = k.copy(), v.copy()
    B = x.shape[-2]
    for s in range(n):
        src = (r - s) % n
        if not causal or src < r:
            outputs.append(attention_block(x, kb, vb)[0])
        elif src == r:
            outputs.append(attention_block(x, kb, vb, np.tri(B, dtype=bool))[0])
        if s < n - 1:
            k_in, v_in = np.empty_like(kb), np.empty_like(vb)
            comm.Sendrecv(kb, dest=right, recvbuf=k_in, source=left)
            comm.Sendrecv(vb, dest=right, recvbuf=v_in, source=left)
            kb, vb = k_in, v_in
    return sum(outputs) / len(outputs)  # wrong: each block's o is normalised over its own keys
