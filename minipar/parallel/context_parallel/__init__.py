"""Context parallelism — контекстный параллелизм — 上下文并行.

The technique: read ``layout.py`` (28 code lines),
``minipar/nn/blockwise_attention.py`` (65 code lines) and
``ring_attention.py`` (81 code lines) for ring attention: which positions a rank
holds (zigzag included), the online-softmax merge of two partial results, the K/V
blocks around the ring, forward and backward.  ``ulysses.py`` (44 code lines) with
``minipar/nn/attention.py`` (77 code lines) for DeepSpeed-Ulysses: one all-to-all
from sequence to heads, the serial attention core, one all-to-all back.  For Llama 3's
all-gather context parallelism: ``layout.py``, ``blockwise_attention.py`` and
``allgather_attention.py`` (49 code lines): K and V of the whole sequence all-gathered,
each query chunk against the keys before it, dK and dV reduce-scattered.  USP:
``usp.py`` (34 code lines) with ``ulysses.py`` and ``ring_attention.py``: Ulysses inside
groups of U ranks, ring attention across the R groups.  With grouped-query attention
(``--kv-heads K``) every kind moves only the K key/value heads.

Then the shell: ``model.py`` (the CP GPT: the serial units with the attention core
swapped), ``engine.py`` (``ContextParallel``, the Engine interface: the loss over
shards, one gradient all-reduce, state_dict), ``options.py`` (``--kind``, ``--zigzag``
and their checks, no MPI: the launcher calls them) and ``measure.py`` (bytes and
activation memory, counted next to the formulas).

EN context parallelism (CP) · RU контекстный параллелизм · ZH 上下文并行

Every layer's activations are cut along the sequence over the P ranks of the
grid's ``cp`` axis; every rank holds the whole model and every row of the
batch, only its positions of each row.

Who holds what (s = 16, P = 2; zigzag: chunks r and 2P−1−r of c = s/(2P))::

    positions   0-3    4-7    8-11   12-15
    contiguous  rank 0 rank 0 rank 1 rank 1
    zigzag      rank 0 rank 1 rank 1 rank 0     (equal causal work on every rank)
    parameters, optimizer states, batch rows: all of them on every rank
    ring attention: my queries stay; the K/V blocks of every rank pass by, one per step
    Ulysses: between its two all-to-alls, every position of H/P heads
    all-gather: my queries stay; K and V of every position gathered for a layer
"""
