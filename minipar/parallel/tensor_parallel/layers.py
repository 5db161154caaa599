"""Tensor parallelism (Megatron): slicing by columns and rows — тензорный параллелизм
(разрезание по столбцам и строкам) — 张量并行（按列与按行切分）.

EN tensor parallelism, column / row parallelism · RU тензорный параллелизм, разрезание по
столбцам / строкам · ZH 张量并行，列并行 / 行并行

Shoeybi, Patwary, Puri, LeGresley, Casper & Catanzaro 2019, "Megatron-LM: Training
Multi-Billion Parameter Language Models Using Model Parallelism", arXiv 1909.08053, §3.
t ranks share every layer; rank r holds a slice of each weight, cut from the full,
partition-independent initialisation (``GPT(cfg).init(seed)`` then :func:`shard_params`):

* ``ColumnParallelLinear``: W = [W_0 | … | W_{t-1}] by columns, Y_r = X W_r.  The input X
  is replicated, so it enters through **f** (identity forward, all-reduce backward:
  every rank's dX_r = dY_r W_rᵀ is a partial sum).  ``gather_output`` all-gathers the
  columns; Megatron leaves them split when a row-parallel layer follows.
* ``RowParallelLinear``: W = [W_0; …; W_{t-1}] by rows, Y = Σ_r X_r W_r.  The partial
  products leave through **g** (all-reduce forward, identity backward); the bias is added
  once, *after* the sum.  ``input_is_parallel=False`` cuts a replicated X first.
* ``VocabParallelEmbedding``: rank r holds the rows of vocabulary ids
  [r·V/t, (r+1)·V/t); ids outside give zero rows, and g sums the ranks' rows.
* vocab-parallel cross-entropy on column-parallel logits z_r (N, V/t): no rank ever
  holds the full (N, V) logits (the last section of this file).

Sequence parallelism (Korthikanti et al. 2022, :mod:`minipar.parallel.tensor_parallel.model`)
is an option of the same layers (``sequence_parallel=True``): f becomes an all-gather
along the sequence (the input arrives as a sequence shard) and g a reduce-scatter along
it; the column-parallel layer then saves only its sequence shard of X and all-gathers it
again in backward (op ``"sp_regather"``), as Megatron does, so the saved activations are
1/t of TP's; :func:`split_sequence` cuts a rank's positions.

Every communication is one of the conjugate pairs (:mod:`minipar.parallel.mappings`), counted
under the pair's name (``tp_f``, ``tp_g``, ``sp_f``, ``sp_g``) or the ``op`` a layer is
given (the embedding and head use their own names, so that a block's count stays
"2 all-reduces forward + 2 backward").  Tests: tests/test_tensor_parallel.py (each layer
against the serial one, float64; the vocab-parallel loss against the serial loss).
"""

from __future__ import annotations

from typing import Any

from minipar import checks, spans
from minipar.backend import xp
from minipar.collectives import allreduce
from minipar.collectives.ring import all_gather
from minipar.comm.traced import traced
from minipar.nn.dtypes import down, matmul, up
from minipar.nn.gpt import param_shapes
from minipar.nn.gpt_config import GPTConfig
from minipar.nn.layers import bias_backward, bias_forward, embedding_backward
from minipar.nn.weight_grad import weight_grad
from minipar.parallel.engine import Piece, Shard
from minipar.parallel.mappings import (
    copy_to_parallel,
    gather_from_sequence,
    reduce_from_parallel,
    scatter_to_sequence,
)
from minipar.plan.tensor import check_tp_sizes

__all__ = ["ColumnParallelLinear", "RowParallelLinear", "VocabParallelEmbedding",
           "check_tp", "gather_params", "kind_of", "placements", "shard_params", "split_columns",
           "split_rows", "split_sequence", "unshard_params",
           "vocab_parallel_cross_entropy_backward", "vocab_parallel_cross_entropy_forward"]


# ---------------------------------------------------------------------------- checks, slicing
def check_tp(cfg: GPTConfig, t: int, sequence_parallel: bool = False,
             seq: int | None = None) -> None:
    """ValueError naming the numbers unless ``cfg`` can be sliced ``t`` ways (local check:
    every rank raises alike, before any message).  SP also needs ``seq`` % t == 0."""
    checks.integer("the tensor-parallel size", t, 1)
    check_tp_sizes(t, cfg.n_head, cfg.d_ff, cfg.vocab_size, seq if sequence_parallel else None,
                   sequence_parallel=sequence_parallel, experts=cfg.n_experts)


def split_columns(a: Any, t: int, r: int, parts: int = 1) -> Any:
    """Rank r's columns (last axis) of ``a``: each of ``parts`` equal groups cut t ways and
    rank r's pieces concatenated (``parts=3``: the q, k and v columns of its heads)."""
    groups = xp.split(a, parts, axis=-1)
    return xp.ascontiguousarray(xp.concatenate([xp.split(g, t, axis=-1)[r] for g in groups],
                                               axis=-1))


def split_rows(a: Any, t: int, r: int) -> Any:
    """Rank r's rows (first axis) of ``a``, cut in t equal blocks."""
    return xp.ascontiguousarray(xp.split(a, t, axis=0)[r])


def split_sequence(x: Any, t: int, r: int, axis: int = 1) -> Any:
    """Rank r's positions of ``x`` along ``axis`` (the ``numpy.array_split`` rule)."""
    lo, hi = spans.span(x.shape[axis], t, r)
    return xp.ascontiguousarray(x[(slice(None),) * (axis % x.ndim) + (slice(lo, hi),)])


def kind_of(name: str) -> str:
    """How a GPT parameter is sliced: ``"rows"``, ``"columns"``, ``"qkv"`` (columns per
    head), or ``"replicated"`` (every rank holds all of it)."""
    leaf = name.rsplit(".", 1)[-1]
    if name == "tok_emb":
        return "rows"  # vocabulary rows
    if name == "lm_head":
        return "columns"  # vocabulary columns
    if leaf in ("w_qkv", "b_qkv"):
        return "qkv"
    if leaf in ("w_in", "b_in"):
        return "columns"
    if leaf == "w_out":
        return "rows"
    return "replicated"  # embeddings of positions, LayerNorms, router, b_out


def _slice(name: str, a: Any, t: int, r: int) -> Any:
    k = kind_of(name)
    if k == "rows":
        return split_rows(a, t, r)
    if k in ("columns", "qkv"):
        return split_columns(a, t, r, 3 if k == "qkv" else 1)
    return xp.array(a, copy=True)


def shard_params(full: dict[str, Any], cfg: GPTConfig, t: int, r: int) -> dict[str, Any]:
    """Rank r's shard of the full parameters, same names and order (:func:`kind_of`)."""
    check_tp(cfg, t)
    return {n: _slice(n, full[n], t, r) for n in param_shapes(cfg)}


def _placement(name: str, shape: tuple[int, ...], t: int, r: int) -> Shard:
    """Where rank r's slice of ``name`` (global ``shape``) sits: the pieces of :func:`_slice`."""
    full = tuple(slice(0, n) for n in shape)
    k = kind_of(name)
    if k == "replicated":
        return Shard(name, shape, (Piece(full, full),))
    axis = 0 if k == "rows" else len(shape) - 1
    parts = 3 if k == "qkv" else 1  # q, k, v: three column groups, each cut t ways
    group = shape[axis] // parts
    n = group // t
    pieces = []
    for j in range(parts):
        local = full[:axis] + (slice(j * n, (j + 1) * n),) + full[axis + 1:]
        lo = j * group + r * n
        pieces.append(Piece(local, full[:axis] + (slice(lo, lo + n),) + full[axis + 1:]))
    return Shard(name, shape, tuple(pieces))


def placements(cfg: GPTConfig, t: int, r: int) -> dict[str, Shard]:
    """Where each tensor of rank r's shard (:func:`shard_params`) sits in the global one:
    rows and columns one piece each, ``w_qkv`` / ``b_qkv`` three (its q, k and v columns),
    replicated tensors whole.  E.g. t = 2, d = 4, rank 1's ``w_qkv`` (4, 6) holds global
    columns 2:4, 6:8 and 10:12 (the ``Shard`` example of :mod:`minipar.parallel.engine`)."""
    check_tp(cfg, t)
    return {n: _placement(n, tuple(s), t, r) for n, s in param_shapes(cfg).items()}


def unshard_params(shards: list[dict[str, Any]], cfg: GPTConfig) -> dict[str, Any]:
    """The full parameters from every rank's shard (rank order); replicated ones from rank 0."""
    t, out = len(shards), {}
    for n in param_shapes(cfg):
        k, ps = kind_of(n), [s[n] for s in shards]
        if k == "rows":
            out[n] = xp.concatenate(ps, axis=0)
        elif k == "columns":
            out[n] = xp.concatenate(ps, axis=-1)
        elif k == "qkv":
            thirds = [xp.split(p, 3, axis=-1) for p in ps]
            out[n] = xp.concatenate([xp.concatenate([th[j] for th in thirds], axis=-1)
                                     for j in range(3)], axis=-1)
        else:
            out[n] = ps[0]
    assert t >= 1
    return out


def gather_params(comm: Any, shard: dict[str, Any], cfg: GPTConfig,
                  op: str = "tp_full_params") -> dict[str, Any]:
    """The full parameters (or gradients) on every rank of ``comm``: every rank's shard,
    flattened in the serial order (the same shapes on every rank), ring all-gathered —
    counted under ``op`` — and put back together by :func:`unshard_params`."""
    names = list(param_shapes(cfg))
    flat = xp.concatenate([xp.ravel(shard[n]) for n in names])
    c = traced(comm)
    with c.operation(op):
        every = all_gather(c, flat).reshape(c.size, flat.size)
    shards = []
    for row in every:
        out, at = {}, 0
        for n in names:
            k = shard[n].size
            out[n] = row[at:at + k].reshape(shard[n].shape)
            at += k
        shards.append(out)
    return unshard_params(shards, cfg)


# --------------------------------------------------------------------------- helpers
def _gather_last(comm: Any, x: Any, op: str) -> Any:
    """All-gather along the last axis (rank order): the columns of every rank."""
    c = traced(comm)
    with c.operation(op):
        full = all_gather(c, xp.moveaxis(x, -1, 0))
    return xp.ascontiguousarray(xp.moveaxis(full, 0, -1))


def _mine_last(x: Any, t: int, r: int) -> Any:
    """This rank's equal share of the last axis (no message)."""
    return xp.ascontiguousarray(xp.split(x, t, axis=-1)[r])


def _dw(x: Any, dy: Any) -> Any:
    return matmul(x.reshape(-1, x.shape[-1]).T, dy.reshape(-1, dy.shape[-1]))


def _regathered_dw(comm: Any, x: Any, dy: Any) -> Any:
    """Sequence parallelism's dW: the input's sequence shards all-gathered again (op
    ``sp_regather``), then xᵀ dy.  Split into B and W (:mod:`minipar.nn.weight_grad`)
    this all-gather is part of W: the stage keeps only its shard of x until then."""
    x_in = gather_from_sequence.forward(comm, x, op="sp_regather")
    return _dw(x_in, dy)


# ---------------------------------------------------------------------------- layers
class ColumnParallelLinear:
    """Y_r = f(X) W_r (+ b_r); p = {"w": (d_in, d_out/t), "b": (d_out/t,) optional}.

    ``sequence_parallel``: X is this rank's sequence shard (axis 1) and f is the
    all-gather along the sequence; ``op``: count the input's pair under this name."""

    def __init__(self, comm: Any, gather_output: bool = False,
                 sequence_parallel: bool = False, op: str | None = None) -> None:
        self.comm, self.gather_output, self.sp, self.op = comm, gather_output, sequence_parallel, op

    def forward(self, p: dict[str, Any], x: Any) -> tuple[Any, tuple]:
        if self.sp:
            x_in = gather_from_sequence.forward(self.comm, x, op=self.op)
        else:
            x_in = copy_to_parallel.forward(self.comm, x, op=self.op)
        y = matmul(x_in, p["w"])
        if p.get("b") is not None:
            y = bias_forward(y, p["b"])
        if self.gather_output:
            y = _gather_last(self.comm, y, "tp_gather")
        return y, (x,)  # SP: only the shard is kept, gathered again in backward

    def backward(self, p: dict[str, Any], saved: tuple, dy: Any) -> tuple[Any, dict[str, Any]]:
        (x,) = saved
        c = self.comm
        if self.gather_output:
            dy = _mine_last(dy, c.Get_size(), c.Get_rank())
        grads = {} if p.get("b") is None else {"b": bias_backward(dy)}
        grads["w"] = weight_grad(_regathered_dw, c, x, dy) if self.sp else \
            weight_grad(_dw, x, dy)
        dx = matmul(dy, p["w"].T)
        if self.sp:
            return gather_from_sequence.backward(c, dx, op=self.op), grads
        return copy_to_parallel.backward(c, dx, op=self.op), grads


class RowParallelLinear:
    """Y = g(Σ_r X_r W_r) + b; p = {"w": (d_in/t, d_out), "b": (d_out,) optional, replicated}.

    ``input_is_parallel=False``: X is replicated and each rank takes its columns first
    (backward all-gathers dX); ``sequence_parallel``: g is the reduce-scatter along the
    sequence, and Y (and b's gradient) is this rank's sequence shard."""

    def __init__(self, comm: Any, input_is_parallel: bool = True,
                 sequence_parallel: bool = False, op: str | None = None) -> None:
        self.comm, self.input_is_parallel = comm, input_is_parallel
        self.sp, self.op = sequence_parallel, op

    def forward(self, p: dict[str, Any], x: Any) -> tuple[Any, tuple]:
        c = self.comm
        if not self.input_is_parallel:
            x = _mine_last(x, c.Get_size(), c.Get_rank())
        partial = matmul(x, p["w"])
        if self.sp:
            y = scatter_to_sequence.forward(c, partial, op=self.op)
        else:
            y = reduce_from_parallel.forward(c, partial, op=self.op)
        del partial
        if p.get("b") is not None:
            y = bias_forward(y, p["b"])  # once, after the sum
        return y, (x,)

    def backward(self, p: dict[str, Any], saved: tuple, dy: Any) -> tuple[Any, dict[str, Any]]:
        (x,) = saved
        c = self.comm
        grads = {} if p.get("b") is None else {"b": bias_backward(dy)}
        if self.sp:
            dy = scatter_to_sequence.backward(c, dy, op=self.op)
        else:
            dy = reduce_from_parallel.backward(c, dy, op=self.op)
        grads["w"] = weight_grad(_dw, x, dy)
        dx = matmul(dy, p["w"].T)
        if not self.input_is_parallel:
            dx = _gather_last(c, dx, "tp_gather")
        return dx, grads


class VocabParallelEmbedding:
    """Rows [r·V/t, (r+1)·V/t) of the token table on rank r; p = {"table": (V/t, d)}.

    y = g(E_r[ids − lo] where lo <= id < hi, else 0); SP: the reduce-scatter along the
    sequence (y is this rank's sequence shard).  Backward scatters dy into the rows
    this rank owns."""

    def __init__(self, comm: Any, vocab_size: int, sequence_parallel: bool = False,
                 op: str | None = None) -> None:
        self.comm, self.vocab_size, self.sp, self.op = comm, vocab_size, sequence_parallel, op

    def forward(self, p: dict[str, Any], ids: Any) -> tuple[Any, tuple]:
        table = p["table"]
        lo = traced(self.comm).rank * table.shape[0]
        local = ids - lo
        outside = (local < 0) | (local >= table.shape[0])
        local[outside] = 0
        y = table[local]
        y[outside] = 0
        if self.sp:
            y = scatter_to_sequence.forward(self.comm, y, op=self.op)
        else:
            y = reduce_from_parallel.forward(self.comm, y, op=self.op)
        return y, (local, outside, table.shape, table.dtype)

    def backward(self, p: dict[str, Any], saved: tuple, dy: Any) -> tuple[None, dict[str, Any]]:
        local, outside, shape, dtype = saved
        if self.sp:
            dy = scatter_to_sequence.backward(self.comm, dy, op=self.op)
        else:
            dy = xp.array(reduce_from_parallel.backward(self.comm, dy, op=self.op), copy=True)
        dy[outside] = 0
        return None, {"table": embedding_backward((local, shape, dtype), dy)}


# ------------------------------------------------------------ vocab-parallel cross-entropy
# Megatron-LM (Shoeybi et al. 2019, §3: "fuse the output embedding GEMM with the
# cross-entropy loss", ``vocab_parallel_cross_entropy``).  Rank r of t holds the
# column-parallel logits z_r (N, V/t) of vocabulary ids [r·V/t, (r+1)·V/t).  With
# m = max over ranks of max_j z (all-reduce max), then one all-reduce sum of
# (S_r, z_target,r) -- S = Σ_r Σ_j e^{z−m}, z_target from the one rank that owns the id:
#
#     loss = mean_n [ log S_n − (z_{n,target} − m_n) ],   dz_r = (e^{z_r−m}/S − onehot_r)/N,
#
# the serial minipar.nn.loss exactly.  Messages: N + 2N numbers, counted under ``tp_ce``.
def vocab_parallel_cross_entropy_forward(comm: Any, logits: Any, targets: Any,
                                         op: str = "tp_ce") -> tuple[float, tuple]:
    """Mean cross-entropy from this rank's vocabulary columns ``logits`` (..., V/t) and the
    full ``targets`` (...); two all-reduces of N and 2N numbers (N = targets.size)."""
    c = traced(comm)
    vl = logits.shape[-1]
    lo = c.rank * vl
    z = up(logits).reshape(-1, vl)
    t = targets.reshape(-1)
    n = z.shape[0]
    with c.operation(op):
        m = allreduce(c, z.max(axis=-1), "max", "ring")
    e = z - m[:, None]
    xp.exp(e, out=e)
    mine = (t >= lo) & (t < lo + vl)
    rows = xp.arange(n)
    zt = xp.where(mine, z[rows, xp.where(mine, t - lo, 0)] - m, 0.0)
    with c.operation(op):
        s_zt = allreduce(c, xp.stack([e.sum(axis=-1), zt]), "sum", "ring")
    s, zt = s_zt[0], s_zt[1]
    loss = float((xp.log(s) - zt).mean())
    e /= s[:, None]  # this rank's columns of the softmax
    return loss, (e, t - lo, mine, logits.shape, logits.dtype)


def vocab_parallel_cross_entropy_backward(saved: tuple, dloss: float = 1.0) -> Any:
    """dL/dz on this rank's columns: dloss · (softmax_r − onehot_r) / N (no message)."""
    p, local, mine, shape, dtype = saved
    n = p.shape[0]
    g = p.copy()
    rows = xp.nonzero(mine)[0]
    g[rows, local[rows]] -= 1.0
    g *= float(dloss) / n
    return down(g.reshape(shape), dtype)
