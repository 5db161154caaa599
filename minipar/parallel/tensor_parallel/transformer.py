"""Megatron's parallel MLP and attention, built from the column- and row-parallel layers —
параллельные MLP и внимание Megatron — Megatron 的并行 MLP 与注意力.

EN tensor-parallel MLP and self-attention (Megatron-LM) · RU тензорно-параллельные MLP и
самовнимание · ZH 张量并行的 MLP 与自注意力

Shoeybi et al. 2019, arXiv 1909.08053, §3, Fig. 3: each is a column-parallel layer, then
local work, then a row-parallel layer, so each runs exactly one f (entering, inside the
column-parallel layer: identity forward, all-reduce backward) and one g (leaving, inside
the row-parallel layer: all-reduce forward, identity backward)::

    MLP        f → X W_in,r + b_in,r → GELU (local) → · W_out,r → g → + b_out
    attention  f → QKV of my n_head/t heads → softmax(q kᵀ/√d_h + M) v (local)
               → · W_out,r (the rows of my heads) → g → + b_out

Rank r holds the columns r·d_ff/t … (r+1)·d_ff/t of W_in (and b_in) and the same rows of
W_out; of W_qkv the q, k and v columns of its heads and the rows of W_out that read
them; b_out whole.  Nothing between f and g needs another rank: GELU is element-wise, and
the heads are independent.  With ``sequence_parallel=True`` the same code is sequence
parallelism: f and g become SP's all-gather and reduce-scatter along the sequence
(:mod:`~minipar.parallel.tensor_parallel.layers`), x and y are this rank's sequence shard.

``forward(p, x) -> (y, saved)``, ``backward(p, saved, dy) -> (dx, grads)``, ``p`` and
``grads`` keyed by the serial names without the block's prefix (``w_in``, ``b_in``,
``w_out``, ``b_out``; ``w_qkv``, ``b_qkv``, ``w_out``, ``b_out``): the feed-forward and
attention steps of the serial block walk (:func:`minipar.nn.gpt.block_forward`), as
:class:`~minipar.parallel.tensor_parallel.model.TPBlockUnit` hands them in.  Tests:
tests/mpi/tp_check.py (the GPT built from them against the serial one, float64).
"""

from __future__ import annotations

from typing import Any

from minipar.comm.traced import traced
from minipar.nn.attention import (
    attention_core_backward,
    attention_core_forward,
    merge_heads,
    merge_qkv,
    split_heads,
    split_qkv,
)
from minipar.nn.layers import gelu_backward, gelu_forward
from minipar.parallel.tensor_parallel.layers import ColumnParallelLinear, RowParallelLinear

__all__ = ["ParallelAttention", "ParallelMLP"]


class ParallelMLP:
    """Megatron's MLP: W_in column-parallel (f), GELU local, W_out row-parallel (g)."""

    def __init__(self, comm: Any, sequence_parallel: bool = False) -> None:
        self.dense_h_to_4h = ColumnParallelLinear(comm, sequence_parallel=sequence_parallel)
        self.dense_4h_to_h = RowParallelLinear(comm, sequence_parallel=sequence_parallel)

    def forward(self, p: dict[str, Any], x: Any) -> tuple[Any, tuple]:
        a, s_in = self.dense_h_to_4h.forward({"w": p["w_in"], "b": p["b_in"]}, x)
        h, s_gelu = gelu_forward(a)
        del a
        y, s_out = self.dense_4h_to_h.forward({"w": p["w_out"], "b": p["b_out"]}, h)
        return y, (s_in, s_gelu, s_out)

    def backward(self, p: dict[str, Any], saved: tuple, dy: Any,
                 daux: float = 1.0) -> tuple[Any, dict[str, Any]]:
        # daux: the gradient of a MoE's auxiliary loss, which a block's feed-forward step
        # takes whatever it is; a dense MLP has no such loss
        s_in, s_gelu, s_out = saved
        dh, g_out = self.dense_4h_to_h.backward({"w": p["w_out"], "b": p["b_out"]}, s_out, dy)
        dx, g_in = self.dense_h_to_4h.backward({"w": p["w_in"], "b": p["b_in"]}, s_in,
                                               gelu_backward(s_gelu, dh))
        return dx, {"w_in": g_in["w"], "b_in": g_in["b"], "w_out": g_out["w"],
                    "b_out": g_out["b"]}


class ParallelAttention:
    """Self-attention on this rank's n_head/t heads: QKV column-parallel (f), the output
    projection row-parallel (g).  ``core``: another attention core on the local fused qkv
    (b, s, (H + 2K)/t·d_h) -> o (b, s, h/t), e.g. context parallelism's ``CPAttention``.
    Grouped-query attention (``n_kv_head`` K): K/t key/value heads per rank when t divides
    K; when K < t each is held by the t/K ranks whose query heads read it, and its
    gradient is summed over them (op ``tp_kv_grads``, one all-reduce of that group)."""

    def __init__(self, comm: Any, n_head: int, sequence_parallel: bool = False,
                 core: Any = None, n_kv_head: int | None = None) -> None:
        self.query_key_value = ColumnParallelLinear(comm, sequence_parallel=sequence_parallel)
        self.dense = RowParallelLinear(comm, sequence_parallel=sequence_parallel)
        self.heads, self.core = n_head // traced(comm).size, core
        self.kv_heads = max((n_kv_head or n_head) // traced(comm).size, 1)

    def forward(self, p: dict[str, Any], x: Any) -> tuple[Any, tuple]:
        qkv, s_qkv = self.query_key_value.forward({"w": p["w_qkv"], "b": p["b_qkv"]}, x)
        if self.core is not None:
            o, s_core = self.core.forward(qkv)
        else:
            o, s_core = attention_core_forward(*split_qkv(qkv, self.heads, self.kv_heads))
            o = merge_heads(o)
        del qkv
        y, s_out = self.dense.forward({"w": p["w_out"], "b": p["b_out"]}, o)
        return y, (s_qkv, s_core, s_out)

    def backward(self, p: dict[str, Any], saved: tuple, dy: Any) -> tuple[Any, dict[str, Any]]:
        s_qkv, s_core, s_out = saved
        do, g_out = self.dense.backward({"w": p["w_out"], "b": p["b_out"]}, s_out, dy)
        if self.core is not None:
            dqkv = self.core.backward(s_core, do)
        else:
            dqkv = merge_qkv(*attention_core_backward(s_core, split_heads(do, self.heads)))
        dx, g_qkv = self.query_key_value.backward({"w": p["w_qkv"], "b": p["b_qkv"]}, s_qkv,
                                                  dqkv)
        return dx, {"w_qkv": g_qkv["w"], "b_qkv": g_qkv["b"], "w_out": g_out["w"],
                    "b_out": g_out["b"]}
