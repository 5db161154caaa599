"""Exercise: the load-balanced causal mask of all-gather context parallelism (notebook 07).

EN all-gather context parallelism · RU контекстный параллелизм со сбором K и V ·
ZH 全收集上下文并行

Grade it (1 rank is enough: the mask is arithmetic, no message is sent, so comm.Send
and its friends are not needed here):

    minipar exercise check allgather_mask allgather_mask.py -n 1

THE SETTING
    Llama 3 (arXiv 2407.21783, §3.3.2) trains long sequences with all-gather context
    parallelism over P ranks: the s positions are cut into 2P chunks of c = s/(2P), and
    rank r holds TWO of them, chunks r and 2P-1-r, stored one after the other (its t = s/P
    queries, in that order).  Before attention every rank all-gathers the keys and values
    of the whole sequence, so each of its queries can be compared with all s keys -- but
    under the causal mask a query at position p may only see the keys at positions
    0, 1, ..., p (itself included), never one after it.

    Why those two chunks?  With contiguous chunks (rank r holds positions r·t ... r·t+t-1)
    rank P-1 has P times the causal work of rank 0; the short chunk r and the long
    chunk 2P-1-r balance: every rank computes the same number of scores.

THE GOAL
    causal_mask(s, P, r) returns a boolean numpy array of shape (s // P, s): row i is
    rank r's i-th query (chunk r's c positions first, then chunk 2P-1-r's), column k
    the key at position k; True where that query may see that key.

WHAT THE GRADER MEASURES
    Your mask for every rank r of P = 2, 3, 4 and a few sequence lengths, compared with
    the one minipar's all-gather attention uses (minipar/parallel/context_parallel/
    allgather_attention.py: each query chunk [a, a + c) against keys 0 ... a + c - 1,
    causal inside).  A wrong mask is named: a chunk off by one, an unbalanced
    (contiguous) split, a query that sees the future.
    Stuck?  minipar exercise hint allgather_mask   (level 1, 2, 3)
"""

from __future__ import annotations

import numpy as np


def causal_mask(s: int, P: int, r: int) -> np.ndarray:
    """(s // P, s) bool: may rank r's i-th query see the key at position k?"""
    # TODO 1: the positions rank r holds: chunk r, then chunk 2P-1-r (c = s // (2P) each)
    # TODO 2: for each of them, the keys it may see (causal: none after its own position)
    raise NotImplementedError("TODO: which keys may each of rank r's queries see?")


# -- the grader calls this on every rank: leave it as it is -----------------------------------
def mask_step(comm, x, **case):
    """Your mask for this case, as the grader reads it."""
    from minipar.exercises.allgather_mask.grader import mask_step as grade

    return grade(causal_mask, comm, x, **case)
