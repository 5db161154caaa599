"""Tensor parallelism overlapped with its GEMMs — асинхронный тензорный параллелизм — 异步张量并行.

EN asynchronous tensor parallelism (communication overlapped with GEMMs) · RU асинхронный
тензорный параллелизм (обмены, скрытые за умножениями матриц) · ZH 异步张量并行（通信与矩阵乘重叠）

The same layers as :mod:`.layers`, the same messages (bytes) and the same sums; only
*when* they move changes, so that the matrix multiplies hide them:

* **f's backward** (no SP): dX = all-reduce(dY Wᵀ), and the weight gradient
  dW = Xᵀ dY needs nothing of that sum.  So the all-reduce is posted
  non-blocking (:class:`~minipar.collectives.nonblocking.RingAllreduceRequest`, the
  blocking ring's steps) and advanced between the column blocks of dW
  (Megatron's async all-reduce, ``--async-tensor-model-parallel-allreduce``;
  picotron's ``LinearWithAsyncAllReduce``).
* **SP's all-gather before a column-parallel GEMM**: Y = AG(X) W_r is, chunk by
  chunk, Y[chunk of rank q] = X_q W_r.  Decomposed into the ring's t − 1 steps,
  the chunk at hand multiplies while the next one moves
  (:func:`all_gather_matmul`).
* **SP's reduce-scatter after a row-parallel GEMM**: rank r keeps chunk r of
  Σ_q X_q W_q.  At ring step s rank r sends its running sum of chunk (r−s−1) and,
  while it moves, computes its own partial product of the chunk it receives next
  (:func:`matmul_reduce_scatter`).

Wang et al. 2023, "Overlap communication with dependent computation via
decomposition in large deep learning models", ASPLOS (the decomposition); PyTorch's
async TP, Megatron's ``tp-comm-overlap``.  Chunks follow :mod:`minipar.spans`; the
sums are the blocking ring's (own partial + received), so the bytes are those of
:func:`~minipar.parallel.mappings_measure.pair_bytes_sent`, counted under the
same operation names.  One process computes, so a message moves while the GEMM runs
only as far as MPI progresses it in the background; the measured share is the
shell's (``hidden_fraction``).
"""

from __future__ import annotations

from typing import Any

from mpi4py import MPI

from minipar import spans
from minipar.backend import xp
from minipar.collectives.nonblocking import RingAllreduceRequest
from minipar.comm.tags import nonblocking_tag
from minipar.comm.traced import traced
from minipar.nn import fp8
from minipar.nn.layers import bias_backward, bias_forward
from minipar.nn.weight_grad import weight_grad
from minipar.parallel.tensor_parallel.layers import ColumnParallelLinear, RowParallelLinear

#: the tag of the rings here (one in flight at a time per tensor-parallel group)
TAG = nonblocking_tag(0)
#: the column blocks of dW between which f's all-reduce is advanced
DW_BLOCKS = 4


def _dw_progressing(x: Any, dy: Any, request: Any) -> Any:
    """dW = xᵀ dy by blocks of columns, advancing ``request`` between them."""
    blocks = []
    parts = min(DW_BLOCKS, dy.shape[-1])
    for lo, hi in (spans.span(dy.shape[-1], parts, i) for i in range(parts)):
        blocks.append(fp8.wgrad(x, dy[..., lo:hi]))
        request.progress()
    return xp.concatenate(blocks, axis=1)


def all_gather_matmul(comm: Any, x: Any, w: Any, op: str, split: Any = None) -> Any:
    """AG(x) @ w along the sequence (axis 1), the ring's chunks multiplied as they come."""
    c = traced(comm)
    r, n = c.rank, c.size
    piece = xp.ascontiguousarray(x)  # (b, s_r, h): my chunk
    b, h = piece.shape[0], piece.shape[2]
    ys, src = [None] * n, r
    for s in range(n):
        if s < n - 1:  # a chunk has at most one position more than mine (array_split)
            buf = xp.empty(b * (piece.shape[1] + 1) * h, piece.dtype)
            with c.operation(op):
                reqs = [c.Irecv(buf, (r - 1) % n, TAG), c.Isend(piece, (r + 1) % n, TAG)]
        ys[src] = fp8.forward(piece, w, split)  # the chunk at hand, while the next one moves
        if s < n - 1:
            c.waitall(reqs)
            size = reqs[0].status.Get_count(MPI.BYTE) // buf.itemsize
            piece, src = buf[:size].reshape(b, -1, h), (src - 1) % n
    return xp.concatenate(ys, axis=1)


def matmul_reduce_scatter(comm: Any, x: Any, w: Any, op: str, split: Any = None) -> Any:
    """This rank's sequence chunk of Σ_ranks x @ w, each chunk's product computed while
    the running sum before it moves."""
    c = traced(comm)
    r, n = c.rank, c.size
    counts = spans.counts(x.shape[1], n)
    offs = spans.offsets(counts)

    def part(i: int) -> Any:  # my partial product of chunk i, (b, k_i, d)
        i %= n
        return fp8.forward(x[:, offs[i]:offs[i] + counts[i]], w, split)

    acc = part(r - 1)
    for s in range(n - 1):
        buf = xp.empty((acc.shape[0], counts[(r - s - 2) % n], acc.shape[2]), acc.dtype)
        with c.operation(op):
            reqs = [c.Irecv(buf, (r - 1) % n, TAG), c.Isend(acc, (r + 1) % n, TAG)]
        mine = part(r - s - 2)  # the chunk arriving, while it moves
        c.waitall(reqs)
        acc = mine + buf  # own partial + received: the blocking ring's sum
    return acc


class AsyncColumnParallelLinear(ColumnParallelLinear):
    """:class:`~.layers.ColumnParallelLinear` with f's all-reduce hidden behind dW (TP)
    or SP's all-gather decomposed into the GEMM (``gather_output``: the blocking form)."""

    def forward(self, p: dict[str, Any], x: Any) -> tuple[Any, tuple]:
        if not self.sp or self.gather_output:
            return super().forward(p, x)
        y = all_gather_matmul(self.comm, x, p["w"], self.op or self.f.name, self.split)
        if p.get("b") is not None:
            y = bias_forward(y, p["b"])
        return y, (x,)

    def backward(self, p: dict[str, Any], saved: tuple, dy: Any) -> tuple[Any, dict[str, Any]]:
        if self.sp or self.gather_output:
            return super().backward(p, saved, dy)
        (x,) = saved
        grads = {} if p.get("b") is None else {"b": bias_backward(dy)}
        dx = xp.ascontiguousarray(fp8.dgrad(dy, p["w"], self.split))  # partial: f's backward sums
        request = RingAllreduceRequest(self.comm, dx.reshape(-1), TAG,
                                       name=self.op or self.f.name)
        grads["w"] = weight_grad(_dw_progressing, x, dy, request)
        request.wait()  # dx, summed in place
        return dx, grads


class AsyncRowParallelLinear(RowParallelLinear):
    """:class:`~.layers.RowParallelLinear` with SP's reduce-scatter decomposed into the
    GEMM (without SP, with a replicated input, or under FP8: the blocking form)."""

    def forward(self, p: dict[str, Any], x: Any) -> tuple[Any, tuple]:
        if self.g.name != "sp_g" or not self.input_is_parallel or fp8.active():
            return super().forward(p, x)  # FP8: ranks would reduce other chunks' tile amax
        y = matmul_reduce_scatter(self.comm, x, p["w"], self.op or self.g.name, self.split)
        if p.get("b") is not None:
            y = bias_forward(y, p["b"])  # once, after the sum
        return y, (x,)
