"""Tensor parallelism (Megatron): the layers, f and g at the call site — тензорный параллелизм
(слои, f и g в месте вызова) — 张量并行（各层，f 与 g 在调用处）.

EN tensor parallelism, column / row parallelism · RU тензорный параллелизм, разрезание по
столбцам / строкам · ZH 张量并行，列并行 / 行并行

Shoeybi, Patwary, Puri, LeGresley, Casper & Catanzaro 2019, "Megatron-LM: Training
Multi-Billion Parameter Language Models Using Model Parallelism", arXiv 1909.08053, §3.
t ranks share every layer; rank r holds a slice of each weight, cut from the full,
partition-independent initialisation (:func:`~.shards.shard_params`).  Every message is
one of Megatron's conjugate pairs (:mod:`minipar.parallel.mappings`), called by name:

* :class:`ColumnParallelLinear`: W = [W_0 | … | W_{t-1}] by columns, Y_r = f(X) W_r.
  The input X is replicated, so it enters through **f**
  (``copy_to_tensor_model_parallel_region``: identity forward, all-reduce backward, for
  every rank's dX_r = dY_r W_rᵀ is a partial sum).  ``gather_output`` all-gathers the
  columns; Megatron leaves them split when a row-parallel layer follows.
* :class:`RowParallelLinear`: W = [W_0; …; W_{t-1}] by rows, Y = g(Σ_r X_r W_r) + b.  The
  partial products leave through **g** (``reduce_from_tensor_model_parallel_region``:
  all-reduce forward, identity backward); the bias is added once, *after* the sum.
  ``input_is_parallel=False`` cuts a replicated X first.
* :class:`VocabParallelEmbedding`: rank r holds the rows of vocabulary ids
  [r·V/t, (r+1)·V/t); ids outside give zero rows, and g sums the ranks' rows.
* the vocab-parallel cross-entropy on column-parallel logits z_r (N, V/t): no rank ever
  holds the full (N, V) logits (the last section).

**Sequence parallelism** (Korthikanti et al. 2022, arXiv 2205.05198, §4.2.2) is the same
layers with ``sequence_parallel=True``: g split in two.  g becomes the reduce-scatter
along the sequence (``reduce_scatter_to_sequence_parallel_region``: each rank keeps its
s/t positions of the sum) and f its adjoint, the all-gather
(``gather_from_sequence_parallel_region``: the input arrives as a sequence shard).  The
column-parallel layer then keeps only its sequence shard of X for backward and
all-gathers it again there (op ``"sp_regather"``), as Megatron does, so the saved
activations are 1/t of TP's.  One more sum belongs to SP (§4.2.2): the parameters every
rank holds whole but applies to its own positions only — the layer norms' γ and β, the
row-parallel bias, the position table — get gradients from s/t positions, summed over
the t ranks after backward (``sum_sequence_grads`` in :mod:`.model`).

Each layer is ``forward(p, x) -> (y, saved)`` and ``backward(p, saved, dy) -> (dx,
grads)``, ``p = {"w": …, "b": …}`` this rank's slices, ``saved = (x,)`` its input; ``op``
counts the layer's pair under another name (the embedding's and the head's, so that a
block's count stays "2 all-reduces forward + 2 backward").  Tests:
tests/test_tensor_parallel.py (each layer against the serial one, float64).
"""

from __future__ import annotations

from typing import Any

from minipar.backend import xp
from minipar.collectives import allreduce
from minipar.collectives.ring import all_gather
from minipar.comm.traced import traced
from minipar.nn import fp8
from minipar.nn.dtypes import down, up
from minipar.nn.layers import bias_backward, bias_forward, embedding_backward
from minipar.nn.weight_grad import weight_grad
from minipar.parallel.mappings import (
    copy_to_tensor_model_parallel_region,
    gather_from_sequence_parallel_region,
    reduce_from_tensor_model_parallel_region,
    reduce_scatter_to_sequence_parallel_region,
)

__all__ = ["ColumnParallelLinear", "RowParallelLinear", "VocabParallelEmbedding",
           "vocab_parallel_cross_entropy_backward", "vocab_parallel_cross_entropy_forward"]


def _dw(x: Any, dy: Any, split: Any = None) -> Any:
    return fp8.wgrad(x, dy, split)  # xᵀ dy; FP8 under a recipe (minipar.nn.fp8)


def _regathered_dw(comm: Any, x: Any, dy: Any, split: Any = None) -> Any:
    """SP's dW: the input's sequence shards all-gathered again (op ``sp_regather``), then
    xᵀ dy.  Split into B and W (:mod:`minipar.nn.weight_grad`) this all-gather is part
    of W: the stage keeps only its shard of x until then."""
    return _dw(gather_from_sequence_parallel_region.forward(comm, x, op="sp_regather"), dy, split)


def _gather_last(comm: Any, x: Any) -> Any:
    """All-gather along the last axis (rank order): every rank's columns (op ``tp_gather``)."""
    c = traced(comm)
    with c.operation("tp_gather"):
        full = all_gather(c, xp.moveaxis(x, -1, 0))
    return xp.ascontiguousarray(xp.moveaxis(full, 0, -1))


def _mine_last(comm: Any, x: Any) -> Any:
    """This rank's equal share of the last axis (no message)."""
    return xp.ascontiguousarray(xp.split(x, comm.Get_size(), axis=-1)[comm.Get_rank()])


# ---------------------------------------------------------------------------- layers
class ColumnParallelLinear:
    """Y_r = f(X) W_r (+ b_r); p = {"w": (d_in, d_out/t), "b": (d_out/t,) optional}."""

    def __init__(self, comm: Any, gather_output: bool = False,
                 sequence_parallel: bool = False, op: str | None = None) -> None:
        self.comm, self.gather_output, self.op = comm, gather_output, op
        self.sp, self.split = sequence_parallel, None  # split: W's columns (minipar.nn.fp8)
        self.f = (gather_from_sequence_parallel_region if sequence_parallel  # SP's f
                  else copy_to_tensor_model_parallel_region)  # f

    def forward(self, p: dict[str, Any], x: Any) -> tuple[Any, tuple]:
        y = fp8.forward(self.f.forward(self.comm, x, op=self.op), p["w"], self.split)
        if p.get("b") is not None:
            y = bias_forward(y, p["b"])
        if self.gather_output:
            y = _gather_last(self.comm, y)
        return y, (x,)  # SP: only the shard is kept, gathered again in backward

    def backward(self, p: dict[str, Any], saved: tuple, dy: Any) -> tuple[Any, dict[str, Any]]:
        (x,) = saved
        if self.gather_output:
            dy = _mine_last(self.comm, dy)
        grads = {} if p.get("b") is None else {"b": bias_backward(dy)}
        grads["w"] = (weight_grad(_regathered_dw, self.comm, x, dy, self.split) if self.sp
                      else weight_grad(_dw, x, dy, self.split))
        return self.f.backward(self.comm, fp8.dgrad(dy, p["w"], self.split), op=self.op), grads


class RowParallelLinear:
    """Y = g(Σ_r X_r W_r) + b; p = {"w": (d_in/t, d_out), "b": (d_out,) optional, replicated}.

    SP: Y (and b's gradient) is this rank's sequence shard."""

    def __init__(self, comm: Any, input_is_parallel: bool = True,
                 sequence_parallel: bool = False, op: str | None = None) -> None:
        self.comm, self.input_is_parallel, self.op = comm, input_is_parallel, op
        self.split = None  # W's rows over the ranks, for FP8's scaling blocks (minipar.nn.fp8)
        self.g = (reduce_scatter_to_sequence_parallel_region if sequence_parallel  # SP's g
                  else reduce_from_tensor_model_parallel_region)  # g

    def forward(self, p: dict[str, Any], x: Any) -> tuple[Any, tuple]:
        if not self.input_is_parallel:
            x = _mine_last(self.comm, x)
        partial = fp8.forward(x, p["w"], self.split)
        y = self.g.forward(self.comm, partial, op=self.op)
        del partial
        if p.get("b") is not None:
            y = bias_forward(y, p["b"])  # once, after the sum
        return y, (x,)

    def backward(self, p: dict[str, Any], saved: tuple, dy: Any) -> tuple[Any, dict[str, Any]]:
        (x,) = saved
        grads = {} if p.get("b") is None else {"b": bias_backward(dy)}
        dy = self.g.backward(self.comm, dy, op=self.op)
        grads["w"] = weight_grad(_dw, x, dy, self.split)
        dx = fp8.dgrad(dy, p["w"], self.split)
        return (dx if self.input_is_parallel else _gather_last(self.comm, dx)), grads


class VocabParallelEmbedding:
    """Rows [r·V/t, (r+1)·V/t) of the token table on rank r; p = {"table": (V/t, d)}.

    y = g(E_r[ids − lo] where lo <= id < hi, else 0); SP: y is this rank's sequence
    shard.  Backward scatters dy into the rows this rank owns."""

    def __init__(self, comm: Any, vocab_size: int, sequence_parallel: bool = False,
                 op: str | None = None) -> None:
        self.comm, self.vocab_size, self.op = comm, vocab_size, op
        self.g = (reduce_scatter_to_sequence_parallel_region if sequence_parallel  # SP's g
                  else reduce_from_tensor_model_parallel_region)  # g

    def forward(self, p: dict[str, Any], ids: Any) -> tuple[Any, tuple]:
        table = p["table"]
        lo = traced(self.comm).rank * table.shape[0]
        local = ids - lo
        outside = (local < 0) | (local >= table.shape[0])
        local[outside] = 0
        y = table[local]
        y[outside] = 0
        return self.g.forward(self.comm, y, op=self.op), (local, outside, table.shape, table.dtype)

    def backward(self, p: dict[str, Any], saved: tuple, dy: Any) -> tuple[None, dict[str, Any]]:
        local, outside, shape, dtype = saved
        dy = xp.array(self.g.backward(self.comm, dy, op=self.op), copy=True)
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
