"""Hints for dualpipev_schedule, one level at a time (``minipar exercise hint dualpipev_schedule``)."""

HINTS = (
    """Count with two counters per chunk, the next forward and the next backward
(nf[c], nb[c]), so that F(c) and B(c) hand out micro-batches in order.  A
micro-batch goes Forward(i, 0) down the V, Forward(i, 1) back up, then
Backward(i, 1) and Backward(i, 0).  DeepSeek writes the rank's list in eight
steps whose lengths depend on n = p and r = stage: nF0, nF0F1, nB1W1F1,
nF0B1F1B0, nB1F1B0, nB1B0, nWB0, nW ("n" = some number of times).""",
    """The step lengths (n = p ranks, r = stage):
1 nF0        2(n - r - 1) times F(0)
2 nF0F1      r + 1 times F(0), F(1)
3 nB1W1F1    n - r - 1 times B(1) split, its W at once, F(1)
4 nF0B1F1B0  m - 2n + r + 1 times the pair F(0) & B(1), then the pair F(1) & B(0)
5 nB1F1B0    n - r - 1 times B(1), then the pair F(1) & B(0)
6 nB1B0      r + 1 times B(1), B(0)
7 nWB0       n - r - 1 times a waiting W, then B(0) split
8 nW         every W still waiting
A W waits in a first-in-first-out list from its split B until a step takes it.""",
    """Two details of DeepSeek's dualpipev.py.  In step 4 the last rank (r = n - 1) runs
its first F(0), B(1) apart, not as a pair: its F(0)'s output turns the V and is
what its own B(1) needs soonest.  In step 6 zero bubble is switched on half-way:
from i = (r + 1) // 2 on the B's are split (BackwardInput, their W's wait) — for
odd r before that B(1), for even r after it, before that B(0).""",
)
