"""Hints for layernorm_backward, one level at a time (``minipar exercise hint layernorm_backward``)."""

HINTS = (
    """Start from y = γ x̂ + β: dβ is dy summed over rows, dγ is dy ⊙ x̂ summed over
rows, and the gradient reaching x̂ is dx̂ = dy ⊙ γ.  The hard part is dx: x̂
depends on x directly AND through the row's mean μ and its σ, so dx has
three terms.  Only dγ and dβ need the other ranks' rows.""",
    """Per row (d entries, means over the last axis):
    x̂ = (x - μ) · rstd,  rstd = 1 / sqrt(var + ε)
    dx = rstd · (dx̂ - mean(dx̂) - x̂ · mean(dx̂ ⊙ x̂))
The mean(dx̂) term is μ's path, the x̂ · mean(dx̂ ⊙ x̂) term is σ's.  Check it
numerically on one row: (f(x + h·e_i) - f(x - h·e_i)) / 2h.""",
    """Step by step (keepdims=True on every mean over axis -1):
    mu = x.mean(-1);  xm = x - mu;  rstd = 1 / sqrt((xm*xm).mean(-1) + EPS)
    xhat = xm * rstd;  dxhat = dy * gamma
    dx = rstd * (dxhat - dxhat.mean(-1) - xhat * (dxhat * xhat).mean(-1))
    local = concatenate([(dy * xhat).reshape(-1, d).sum(0), dy.reshape(-1, d).sum(0)])
    both = allreduce(comm, local)
    return pack(dx, both[:d], both[d:])""",
)
