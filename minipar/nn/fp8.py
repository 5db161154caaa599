"""FP8 GEMMs of a linear layer — GEMM в FP8 — FP8 矩阵乘.

A linear layer y = x W runs three GEMMs; under an FP8 recipe each takes FP8
inputs and accumulates in FP32:

    forward       y  = x  · W      reduction over d_in
    input grad    dx = dy · Wᵀ     reduction over d_out
    weight grad   dW = xᵀ · dy     reduction over the tokens

**Block scaling** (``Recipe("block", 128)``; DeepSeek-V3, arXiv 2412.19437, §3.3):
E4M3 everywhere; activations and gradients in 1×128 *tiles* along the reduction
(per token and 128 channels for y and dx; per channel and 128 tokens of a sequence
for dW), weights in 128×128 *blocks*; the tensor-core sums of each 128-element chunk
of the reduction are *promoted*: scaled by the chunk's two scales and added in FP32
(:func:`promoted`).  The weight gradient's tiles run along the tokens of one
sequence — DeepSeek-V3's sequences (4096) are whole tiles, so it is their tiling;
here it also means a batch split over data-parallel ranks or micro-batches cuts no
tile.

**Per-tensor scaling** (``Recipe("tensor")``; Micikevicius et al. 2022, "FP8
Formats for Deep Learning", arXiv 2209.05433): one scale per tensor, E4M3 for the
forward's x and W, E5M2 for the gradient dy; *current* scaling, not delayed — the
scale is the amax of the tensor at hand, not of the last steps' history.

The FP8 policy (:mod:`minipar.precision`) keeps everything else in FP32: the master
weights (the parameters themselves), AdamW's moments, the embedding, the output
head, the LayerNorms, attention's scores and softmax, the MoE router.  Only a
transformer block's linear layers run :func:`gemms` (``block_forward`` enters it).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

from minipar.backend import xp
from minipar.nn.dtypes import down, matmul
from minipar.quantize import quantize

SCALINGS = ("block", "tensor")


@dataclass(frozen=True)
class Recipe:
    """How the GEMMs quantize: ``scaling`` block|tensor, ``block`` the tile length."""

    scaling: str = "block"
    block: int = 128


_ACTIVE: list[Recipe | None] = [None]  # the recipe of the GEMMs running now (None: no FP8)


@contextmanager
def gemms(recipe: Recipe | None) -> Iterator[None]:
    """Run the linear layers' GEMMs under ``recipe`` (None: in the storage dtype)."""
    before, _ACTIVE[0] = _ACTIVE[0], recipe
    try:
        yield
    finally:
        _ACTIVE[0] = before


def active() -> Recipe | None:
    return _ACTIVE[0]


def bound(fn: Callable[..., Any]) -> Callable[..., Any]:
    """``fn`` run later under the recipe active now (a weight gradient deferred to W)."""
    recipe = _ACTIVE[0]
    if recipe is None:
        return fn

    def run(*args: Any) -> Any:
        with gemms(recipe):
            return fn(*args)
    return run


def promoted(qa: Any, sa: Any, qb: Any, sb: Any, bounds: list[tuple[int, int]]) -> Any:
    """Σ over reduction chunks [lo, hi) of (qa[:, lo:hi] · qb[lo:hi]) · sa[:, c] · sb[c]:
    each chunk's exact FP8 products summed, then scaled and added in FP32."""
    acc = xp.zeros((qa.shape[0], qb.shape[1]), dtype=xp.float32)
    sa = xp.broadcast_to(sa, (sa.shape[0], len(bounds)))  # one scale per tensor: (1, 1)
    sb = xp.broadcast_to(sb, (len(bounds), sb.shape[1]))
    for c, (lo, hi) in enumerate(bounds):
        part = qa[:, lo:hi].astype(xp.float32) @ qb[lo:hi].astype(xp.float32)
        acc += part * sa[:, c:c + 1] * sb[c:c + 1]
    return acc


def _chunks(n: int, b: int) -> list[tuple[int, int]]:
    return [(lo, min(lo + b, n)) for lo in range(0, n, b)]


def _weight(w: Any, r: Recipe) -> tuple[Any, Any]:
    """W in E4M3: 128×128 blocks (scales per block), or one scale."""
    if r.scaling == "tensor":
        return quantize(w, "e4m3", w.shape)
    return quantize(w, "e4m3", (r.block, r.block))


def _tiles(a2: Any, fmt: str, r: Recipe) -> tuple[Any, Any]:
    """Rows of ``a2`` (M, K) in 1×b tiles along K: scales (M, ⌈K/b⌉); or one scale."""
    return quantize(a2, fmt, a2.shape if r.scaling == "tensor" else (1, r.block))


def forward(x: Any, w: Any) -> Any:
    """y = x · W: E4M3 1×128 tiles of x, 128×128 blocks of W, promoted every 128."""
    r = _ACTIVE[0]
    if r is None:
        return matmul(x, w)
    x2 = x.reshape(-1, x.shape[-1])
    (qx, sx), (qw, sw) = _tiles(x2, "e4m3", r), _weight(w, r)
    sw = xp.repeat(sw, r.block, axis=1)[:, :w.shape[1]] if r.scaling == "block" else sw
    y = promoted(qx, sx, qw, sw, _chunks(w.shape[0], r.block))
    return down(y.reshape(*x.shape[:-1], w.shape[1]), x.dtype)


def dgrad(dy: Any, w: Any) -> Any:
    """dx = dy · Wᵀ: dy in 1×128 tiles along d_out (E5M2 per tensor), Wᵀ's blocks."""
    r = _ACTIVE[0]
    if r is None:
        return matmul(dy, w.T)
    dy2 = dy.reshape(-1, dy.shape[-1])
    fmt = "e5m2" if r.scaling == "tensor" else "e4m3"
    (qd, sd), (qw, sw) = _tiles(dy2, fmt, r), _weight(w, r)
    swt = xp.repeat(sw.T, r.block, axis=1)[:, :w.shape[0]] if r.scaling == "block" else sw
    dx = promoted(qd, sd, qw.T, swt, _chunks(w.shape[1], r.block))
    return down(dx.reshape(*dy.shape[:-1], w.shape[0]), dy.dtype)


def wgrad(x: Any, dy: Any) -> Any:
    """dW = xᵀ · dy over every token: x and dy in 128×1 tiles along each sequence's
    tokens (x, dy of shape (..., T, d); a 2-D input is one sequence)."""
    r = _ACTIVE[0]
    if r is None or x.size == 0:
        return matmul(x.reshape(-1, x.shape[-1]).T, dy.reshape(-1, dy.shape[-1]))
    t = x.shape[-2]
    x3, dy3 = x.reshape(-1, t, x.shape[-1]), dy.reshape(-1, t, dy.shape[-1])
    blk = (1, r.block, 1)
    qx, sx = quantize(x3, "e4m3", x3.shape if r.scaling == "tensor" else blk)
    fmt = "e5m2" if r.scaling == "tensor" else "e4m3"
    qd, sd = quantize(dy3, fmt, dy3.shape if r.scaling == "tensor" else blk)
    bounds = [(s * t + lo, s * t + hi) for s in range(x3.shape[0])
              for lo, hi in _chunks(t, r.block)]
    sx, sd = sx.reshape(-1, sx.shape[-1]).T, sd.reshape(-1, sd.shape[-1])  # (d, chunks)
    dw = promoted(qx.reshape(-1, x.shape[-1]).T, sx, qd.reshape(-1, dy.shape[-1]), sd,
                  bounds)
    return down(dw, x.dtype)
