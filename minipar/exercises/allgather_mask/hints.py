"""Hints for allgather_mask, one level at a time (``minipar exercise hint allgather_mask``)."""

HINTS = (
    """Two steps: first the s/P positions rank r holds, in the order it stores them (its
first chunk, then its second); then one row per position: which key positions are at
most that position.  A picture for s = 8, P = 2 (chunks of 2): rank 0 holds 0, 1, 6, 7;
rank 1 holds 2, 3, 4, 5.""",
    """With c = s // (2P): chunk j is positions j·c ... j·c + c - 1.  Rank r's chunks are j = r
and j = 2P - 1 - r (not 2P - r, not 2P - 2 - r: for r = 0 the second chunk is the LAST one,
2P - 1).  The causal rule is per position, not per chunk: a query at the start of a chunk
must not see the rest of its own chunk.""",
    """Step by step:
    c = s // (2 * P)
    first, second = np.arange(r * c, (r + 1) * c), np.arange((2 * P - 1 - r) * c, (2 * P - r) * c)
    mine = np.concatenate([first, second])
    return np.arange(s)[None, :] <= mine[:, None]""",
)
