"""Context parallelism — контекстный параллелизм — 上下文并行.

EN context parallelism (CP) · RU контекстный параллелизм · ZH 上下文并行

Every layer's activations are cut along the sequence over the P ranks of the
grid's ``cp`` axis; every rank holds the whole model and every row of the
batch, only its positions of each row.  Read in this order:

* ``layout.py``          which positions each rank holds (contiguous or zigzag), the checks
* ``ulysses.py``         DeepSpeed-Ulysses: all-to-all sequence → heads, attention, and back
* ``ring_attention.py``  ring attention: K/V blocks around the ring, online-softmax merge
* ``model.py``           the CP GPT: the serial units with the attention core swapped
* ``engine.py``          ``ContextParallel`` (the Engine interface): the loss over shards, one gradient all-reduce
* ``measure.py``         bytes and activation memory, counted next to the formulas

Who holds what (s = 16, P = 2; zigzag: chunks r and 2P−1−r of c = s/(2P))::

    positions   0-3    4-7    8-11   12-15
    contiguous  rank 0 rank 0 rank 1 rank 1
    zigzag      rank 0 rank 1 rank 1 rank 0     (equal causal work on every rank)
    parameters, optimizer states, batch rows: all of them on every rank
"""
