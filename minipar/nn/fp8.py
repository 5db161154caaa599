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

**In parallel** the tiles and blocks are those of the global tensor: a rank holding
a slice of a weight (tensor parallelism: :class:`Split` of its columns or rows) or of
each sequence (context parallelism: :func:`tokens`) cuts its tiles and promotion
chunks at the global multiples of 128, and the amax of a tile or block that ranks
share is all-reduced (MAX) over them, so every rank quantizes as the serial run
does.  Per tensor, the amax of a tensor cut over ranks is all-reduced over exactly them:
a weight's slices and the channels it cuts (:class:`Split`, also in :func:`wgrad`),
the batch's rows and each sequence's tokens (data and context parallelism,
:func:`rows`).  The scales are kept per element (one value repeated over its tile or
block), which makes a slice's scales just the slice of the global ones.

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
from minipar.quantize import block_amax, expand, quantize

SCALINGS = ("block", "tensor")


@dataclass(frozen=True)
class Recipe:
    """How the GEMMs quantize: ``scaling`` block|tensor, ``block`` the tile length."""

    scaling: str = "block"
    block: int = 128


#: the recipe of the GEMMs running now (None: no FP8), the tokens' Split (context
#: parallelism), the rows' amax all-reduce (data parallelism, per-tensor scaling)
_ACTIVE: list[Any] = [None, None, None]


@contextmanager
def _set(i: int, value: Any) -> Iterator[None]:
    before, _ACTIVE[i] = _ACTIVE[i], value
    try:
        yield
    finally:
        _ACTIVE[i] = before


def gemms(recipe: Recipe | None) -> Any:
    """Run the linear layers' GEMMs under ``recipe`` (None: in the storage dtype)."""
    return _set(0, recipe)


@dataclass(frozen=True)
class Split:
    """A weight cut over ranks along ``axis`` (0: its rows, the forward's reduction; 1: its
    columns): ``index`` the global positions this rank holds (sorted), ``n`` their global
    count, ``reduce_max`` the all-reduce MAX over the ranks that hold the others."""

    axis: int
    index: Any
    n: int
    reduce_max: Callable[[Any], Any]


def tokens(split: Split | None) -> Any:
    """The weight gradients' tokens are this rank's positions ``split.index`` of each
    sequence (context parallelism): their 128-token tiles are cut where the serial
    run cuts them, and a tile's amax is reduced over the ranks."""
    return _set(1, split)


def rows(reduce_max: Callable[[Any], Any] | None) -> Any:
    """Per-tensor scaling with the batch's rows or tokens over ranks (data, context
    parallelism): an activation's or gradient's amax is all-reduced (MAX) over them, so
    every rank scales by the whole batch's amax, as the serial run does (every rank must
    run the same GEMMs: a dense model, the whole batch in one pass)."""
    return _set(2, reduce_max)


def active() -> Recipe | None:
    return _ACTIVE[0]


def bound(fn: Callable[..., Any]) -> Callable[..., Any]:
    """``fn`` run later under the settings of now (a weight gradient deferred to W)."""
    recipe, split, reduce_max = _ACTIVE
    if recipe is None:
        return fn

    def run(*args: Any) -> Any:
        with gemms(recipe), tokens(split), rows(reduce_max):
            return fn(*args)
    return run


def _amax(a: Any, block: tuple[int, ...], split: Split | None, axis: int) -> Any:
    """Every element's block amax, blocks cut in the global tensor's coordinates; along a
    split ``axis`` a block's maximum is reduced over the ranks holding parts of it, so
    each rank scales as the serial run does."""
    if split is None:
        return expand(block_amax(a, block), block, a.shape)
    fine = tuple(1 if i == axis else b for i, b in enumerate(block))
    part = xp.moveaxis(block_amax(a, fine), axis, 0)  # per position along the split axis
    ids = split.index // block[axis]
    glob = xp.zeros((-(-split.n // block[axis]), *part.shape[1:]), dtype=part.dtype)
    xp.maximum.at(glob, ids, part)
    return expand(xp.moveaxis(split.reduce_max(glob)[ids], 0, axis), fine, a.shape)


def _q(a: Any, fmt: str, r: Recipe, block: tuple[int, ...], split: Split | None = None,
       axis: int = -1, batch: bool = True) -> tuple[Any, Any]:
    """``a`` in ``fmt`` with one scale per element: its block's (per tensor: the whole
    global tensor's, over the batch's ranks too unless ``batch`` is False: a weight)
    amax over the format's largest value."""
    if r.scaling == "tensor":
        block = tuple(split.n if split and i == axis else n for i, n in enumerate(a.shape))
    amax = _amax(a, block, split, axis)
    if batch and r.scaling == "tensor" and _ACTIVE[2] is not None:
        amax = xp.full_like(amax, _ACTIVE[2](xp.asarray([amax.max(initial=0)]))[0])
    return quantize(a, fmt, (1,) * a.ndim, amax)


def promoted(qa: Any, sa: Any, qb: Any, sb: Any, bounds: list[tuple[int, int]]) -> Any:
    """Σ over reduction chunks [lo, hi) of (qa[:, lo:hi] · qb[lo:hi]) · sa[:, lo] · sb[lo]:
    each chunk's exact FP8 products summed, then scaled and added in FP32 (the scales are
    per element, constant over a chunk)."""
    acc = xp.zeros((qa.shape[0], qb.shape[1]), dtype=xp.float32)
    for lo, hi in bounds:
        part = qa[:, lo:hi].astype(xp.float32) @ qb[lo:hi].astype(xp.float32)
        acc += part * sa[:, lo:lo + 1] * sb[lo:lo + 1]
    return acc


def _chunks(n: int, b: int, split: Split | None = None) -> list[tuple[int, int]]:
    """The reduction's chunks of ``b``, cut at global multiples of ``b`` when split."""
    if split is None:
        return [(lo, min(lo + b, n)) for lo in range(0, n, b)]
    ids = split.index // b
    starts = [0] + [i for i in range(1, n) if ids[i] != ids[i - 1]]
    return list(zip(starts, [*starts[1:], n]))


def forward(x: Any, w: Any, split: Split | None = None) -> Any:
    """y = x · W: E4M3 1×128 tiles of x, 128×128 blocks of W, promoted every 128."""
    r = _ACTIVE[0]
    if r is None or x.size == 0:
        return matmul(x, w)
    x2, ks = x.reshape(-1, x.shape[-1]), (split if split and split.axis == 0 else None)
    qx, sx = _q(x2, "e4m3", r, (1, r.block), ks, 1)
    qw, sw = _q(w, "e4m3", r, (r.block, r.block), split, split.axis if split else -1, False)
    y = promoted(qx, sx, qw, sw, _chunks(w.shape[0], r.block, ks))
    return down(y.reshape(*x.shape[:-1], w.shape[1]), x.dtype)


def dgrad(dy: Any, w: Any, split: Split | None = None) -> Any:
    """dx = dy · Wᵀ: dy in 1×128 tiles along d_out (E5M2 per tensor), Wᵀ's blocks."""
    r = _ACTIVE[0]
    if r is None or dy.size == 0:
        return matmul(dy, w.T)
    dy2, ns = dy.reshape(-1, dy.shape[-1]), (split if split and split.axis == 1 else None)
    qd, sd = _q(dy2, "e5m2" if r.scaling == "tensor" else "e4m3", r, (1, r.block), ns, 1)
    qw, sw = _q(w, "e4m3", r, (r.block, r.block), split, split.axis if split else -1, False)
    dx = promoted(qd, sd, qw.T, sw.T, _chunks(w.shape[1], r.block, ns))
    return down(dx.reshape(*dy.shape[:-1], w.shape[0]), dy.dtype)


def wgrad(x: Any, dy: Any, split: Split | None = None) -> Any:
    """dW = xᵀ · dy over every token: x and dy in 128×1 tiles along each sequence's
    tokens (x, dy of shape (..., T, d); a 2-D input is one sequence).  Per tensor, the
    channels a weight's ``split`` cuts (x's for its rows, dy's for its columns) have their
    amax reduced too; the tokens' by :func:`rows`, whose ranks split them (CP too)."""
    r = _ACTIVE[0]
    if r is None or x.size == 0:
        return matmul(x.reshape(-1, x.shape[-1]).T, dy.reshape(-1, dy.shape[-1]))
    t, din, dout = x.shape[-2], x.shape[-1], dy.shape[-1]
    x3, dy3 = x.reshape(-1, t, din), dy.reshape(-1, t, dout)
    ts = _ACTIVE[1] if x.ndim == 3 else None  # the sequence cut over ranks (CP), if any
    xs = ds = (ts, 1)
    if r.scaling == "tensor":
        xs, ds = [(split, 2) if split and split.axis == a else (None, 1) for a in (0, 1)]
    qx, sx = _q(x3, "e4m3", r, (1, r.block, 1), *xs)
    qd, sd = _q(dy3, "e5m2" if r.scaling == "tensor" else "e4m3", r, (1, r.block, 1), *ds)
    bounds = [(s * t + lo, s * t + hi) for s in range(x3.shape[0])
              for lo, hi in _chunks(t, r.block, ts)]
    dw = promoted(qx.reshape(-1, din).T, sx.reshape(-1, din).T, qd.reshape(-1, dout),
                  sd.reshape(-1, dout), bounds)
    return down(dw, x.dtype)
