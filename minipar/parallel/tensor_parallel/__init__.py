"""Tensor parallelism (Megatron), with sequence parallelism as its option — тензорный
параллелизм (и параллелизм по последовательности) — 张量并行（含序列并行）.

EN tensor parallelism, sequence parallelism · RU тензорный параллелизм, параллелизм по
последовательности · ZH 张量并行，序列并行

Shoeybi et al. 2019, arXiv 1909.08053 (the layers, f and g); Korthikanti et al. 2022,
arXiv 2205.05198 (sequence parallelism: g split in two).  Read in this order, with the
conjugate pairs of :mod:`minipar.parallel.mappings` beside you:

- :mod:`.layers` — the slicing (``shard_params``: columns, rows, q/k/v per head, the
  sequence), ``ColumnParallelLinear``, ``RowParallelLinear``, ``VocabParallelEmbedding``
  and the vocab-parallel cross-entropy;
- :mod:`.model` — Megatron's MLP, attention and MoE on this rank's slices, the block's
  steps and the GPT's units (``TPEmbedUnit``, ``TPBlockUnit``, ``TPHeadUnit``),
  ``sequence_parallel=True`` for SP;
- :mod:`.engine` — ``TensorParallel``: TP, TP+SP and TP x DP training on a dp x tp grid,
  an :class:`~minipar.parallel.engine.Engine` (``placements`` of :mod:`.layers` say where
  each slice sits in the global tensor: its ``state_dict``);
- :mod:`.measure` — the exact byte formulas and the activation ledger (not on the
  reading path).

Who holds what, t = 2 (one block; x is (b, s, h)):

    rank 0:  W_qkv[:, my heads]  W_out[my heads rows, :]  W_in[:, :d_ff/2]  W_out[:d_ff/2, :]
    rank 1:  W_qkv[:, my heads]  W_out[my heads rows, :]  W_in[:, d_ff/2:]  W_out[d_ff/2:, :]
    both:    LayerNorms, b_out, pos_emb (replicated); x whole (TP) or x[:, my s/2, :] (SP)
"""
