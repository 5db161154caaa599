"""Hints for ring_attention_merge, one level at a time (``minipar exercise hint ...``)."""

HINTS = (
    """A partial result (o, lse) is "softmax over the keys seen so far": o is already
divided by its own denominator exp(lse).  When a block arrives, the new
denominator is the sum of both, exp(lse) + exp(lse_blk): each old output
must be re-weighed by (its denominator) / (the new one).  The causal mask is
about global positions: compare the block's rank src with your own r.""",
    """merge: new = np.logaddexp(lse, lse_blk) (never exp() the lse directly: it can
overflow).  The weights exp(lse - new) and exp(lse_blk - new) add up to 1,
one per query row: multiply o by w[..., None].  In the loop:
    if not causal or src < r: all keys of the block are visible (mask None)
    elif src == r:            the lower triangle np.tri(B, dtype=bool)
    else:                     skip the block (but still pass it on!)""",
    """    def merge(o, lse, o_blk, lse_blk):
        new = np.logaddexp(lse, lse_blk)
        return (np.exp(lse - new)[..., None] * o
                + np.exp(lse_blk - new)[..., None] * o_blk), new
and in the loop, instead of the one merge line:
        if not causal or src < r:
            o, lse = merge(o, lse, *attention_block(x, kb, vb))
        elif src == r:
            o, lse = merge(o, lse, *attention_block(x, kb, vb, np.tri(B, dtype=bool)))""",
)
