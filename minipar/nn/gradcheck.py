"""Gradient checking by finite differences — проверка градиентов конечными разностями — 有限差分梯度检验.

Central differences:  ∂f/∂θ_j ≈ (f(θ + ε e_j) − f(θ − ε e_j)) / (2ε),
error O(ε²) from truncation plus O(u·|f|/ε) from rounding (u = 2⁻⁵³ in
float64); ε = 1e-6 balances the two.  Agreement is measured as the relative
error of whole arrays,

    rel_error(a, b) = ‖a − b‖₂ / max(‖a‖₂, ‖b‖₂),

which stays meaningful where single entries are 0.  Used by the float64
tests of every layer and model (tests/test_nn_*.py), and available to the
parallel modules' own tests.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from minipar.backend import xp


def rel_error(a: Any, b: Any) -> float:
    """‖a − b‖₂ / max(‖a‖₂, ‖b‖₂), and 0.0 when both are zero."""
    a, b = xp.asarray(a, dtype=xp.float64), xp.asarray(b, dtype=xp.float64)
    scale = max(float(xp.linalg.norm(a)), float(xp.linalg.norm(b)))
    return 0.0 if scale == 0.0 else float(xp.linalg.norm(a - b)) / scale


def numerical_grad(f: Callable[[], float], x: Any, eps: float = 1e-6) -> Any:
    """∂f/∂x by central differences; ``x`` (float64) is perturbed in place and restored."""
    g = xp.zeros(x.shape, dtype=xp.float64)
    flat, gflat = x.reshape(-1), g.reshape(-1)
    if flat.base is None and x.size and not xp.shares_memory(flat, x):
        raise ValueError("x must be contiguous so that it can be perturbed in place")
    for j in range(flat.size):
        old = float(flat[j])
        flat[j] = old + eps
        fp = f()
        flat[j] = old - eps
        fm = f()
        flat[j] = old
        gflat[j] = (fp - fm) / (2.0 * eps)
    return g
