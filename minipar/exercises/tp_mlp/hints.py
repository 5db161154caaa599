"""Hints for tp_mlp, one level at a time (``minipar exercise hint tp_mlp``)."""

HINTS = (
    """Nothing is summed until the second linear.  Your slice of W1 gives you k whole
hidden features (x W1 + b1 restricted to your columns): apply GELU to them as
they are.  Your slice of W2 then gives you one share of y; the N shares are
summed with ONE all-reduce, and b2 is added after it, once.  The backward
mirrors it: one all-reduce, of dx.""",
    """Forward:  a = x @ w1 + b1;  y = allreduce(comm, gelu(a) @ w2) + b2.
Backward: dy is already the full gradient on every rank (g's backward is the
identity), so db2 = dy summed over tokens and dw2 = gelu(a)ᵀ dy need no
message.  Reshape (b, s, ·) arrays to (b·s, ·) before the transposed
products.  Then da = (dy @ w2.T) * gelu_grad(a), and dx needs the sum over
ranks of da @ w1.T.""",
    """Backward, step by step (h = d_model, k = your d_ff / N):
    a = x @ w1 + b1
    dy2 = dy.reshape(-1, h)
    db2 = dy2.sum(axis=0);  dw2 = gelu(a).reshape(-1, k).T @ dy2
    da = (dy @ w2.T) * gelu_grad(a);  da2 = da.reshape(-1, k)
    dw1 = x.reshape(-1, h).T @ da2;  db1 = da2.sum(axis=0)
    dx = allreduce(comm, da @ w1.T)
    return dx, dw1, db1, dw2, db2
Do not all-reduce dw1, db1 or dw2: each rank owns a different slice.""",
)
