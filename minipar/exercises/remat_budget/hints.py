"""Hints for remat_budget, one level at a time (``minipar exercise hint remat_budget``)."""

HINTS = (
    """There are only n + 1 plans: {"every": k} for k = 1 .. n (k = n keeps everything)
and {"selective": True}.  Ask peak_bytes(plan) for each, keep those within the
budget, and among them take the one that recomputes least.  The work is in
"recomputes least": write down what each plan runs twice.""",
    """Segments of k: every segment but the last is recomputed in backward, so the
unit forwards that run twice are n - last, with last = n - (ceil(n/k) - 1)·k
the length of the last segment.  For n = 8: k = 4 recomputes 4, k = 5 recomputes
5, k = 7 recomputes 7 -- not monotone in k.  Selective recomputes no whole unit,
only each block's attention core: cheaper than any segment, dearer than none.""",
    """Step by step:
    def cost(p): 0.5 if p.get("selective") else n - (n - (math.ceil(n / p["every"]) - 1) * p["every"])
    plans = [{"every": k} for k in range(1, n + 1)] + [{"selective": True}]
    fits = [(p, peak_bytes(p)) for p in plans if peak_bytes(p) <= budget]
    return min(fits, key=lambda pb: (cost(pb[0]), pb[1]))[0] if fits else None""",
)
