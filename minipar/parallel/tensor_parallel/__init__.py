"""Tensor parallelism (Megatron), with sequence parallelism as its option — тензорный
параллелизм (и параллелизм по последовательности) — 张量并行（含序列并行）.

The technique: read ``layers.py`` (123 code lines), then ``transformer.py`` (60 code
lines), with the conjugate pairs they call by name, ``minipar/parallel/mappings.py``
(115 code lines).  Overlapped with the GEMMs (``--tp-overlap``, asynchronous tensor
parallelism): ``overlap.py`` (82 code lines).  Then the shell: ``model.py`` (the units
for the executor, SP's gradient sums), ``shards.py`` (who holds which slice, placements
for checkpoints), ``engine.py`` (``TensorParallel``: TP, TP+SP and TP x DP training on a
dp x tp grid, its options and checks, ``state_dict``, traffic) and ``measure.py`` (the
exact byte formulas, the activation ledger).

EN tensor parallelism, sequence parallelism · RU тензорный параллелизм, параллелизм по
последовательности · ZH 张量并行，序列并行

Shoeybi et al. 2019, arXiv 1909.08053 (the layers, f and g); Korthikanti et al. 2022,
arXiv 2205.05198 (sequence parallelism: g split in two).  In reading order:

- :mod:`.layers` — ``ColumnParallelLinear`` (f inside), ``RowParallelLinear`` (g inside),
  ``VocabParallelEmbedding`` and the vocab-parallel cross-entropy;
  ``sequence_parallel=True`` swaps f and g for the all-gather and reduce-scatter along
  the sequence;
- :mod:`.transformer` — Megatron's ``ParallelMLP`` and ``ParallelAttention``: a
  column-parallel layer, local work, a row-parallel layer; one f and one g each;
- :mod:`.overlap` — the same layers with their messages moving while the GEMMs run:
  f's backward all-reduce behind dW, SP's all-gather and reduce-scatter decomposed
  into ring steps (``engine.overlap_layers`` swaps them in);
- :mod:`minipar.parallel.mappings` — the pairs: f =
  ``copy_to_tensor_model_parallel_region``, g = ``reduce_from_tensor_model_parallel_region``,
  SP's ``gather_from_sequence_parallel_region`` and
  ``reduce_scatter_to_sequence_parallel_region``;

and around them (not the technique):

- :mod:`.model` — the GPT's units for the executor (``TPEmbedUnit``, ``TPBlockUnit``,
  ``TPHeadUnit``), SP's gradient sums of the sequence-split parameters, and what other
  techniques hand in as arguments (``ParallelMoE``; a CP attention core and positions);
- :mod:`.shards` — who holds which slice (``shard_params``), where it sits in the global
  tensor (``placements``, for checkpoints), putting slices back together;
- :mod:`.engine` — ``TensorParallel``, an :class:`~minipar.parallel.engine.Engine`, and
  ``TensorParallelGPT`` (the sliced GPT without an optimizer, for tests and tools);
- :mod:`.measure` — the exact byte formulas and the activation ledger.

Who holds what, t = 2 (one block; x is (b, s, h)):

    rank 0:  W_qkv[:, my heads]  W_out[my heads rows, :]  W_in[:, :d_ff/2]  W_out[:d_ff/2, :]
    rank 1:  W_qkv[:, my heads]  W_out[my heads rows, :]  W_in[:, d_ff/2:]  W_out[d_ff/2:, :]
    both:    LayerNorms, b_out, pos_emb (replicated); x whole (TP) or x[:, my s/2, :] (SP)
"""
