"""Expert parallelism — параллелизм экспертов — 专家并行.

EN expert parallelism (EP) · RU параллелизм экспертов · ZH 专家并行

Each MoE layer's E experts are spread over the ``ep`` ranks of a group; the
tokens travel to their experts' ranks by all-to-all and back.  Everything
else (embedding, attention, routers, head) is replicated and trained data
parallel.  Read in this order:

* ``layout.py``   which experts each rank holds, the capacity C_j of each source, the checks
* ``layer.py``    the MoE layer across ranks: dispatch → all-to-all → experts → all-to-all → combine
* ``engine.py``   ``ExpertParallel``, the Engine of EP x data parallelism: dense and expert
                  gradients apart; each tensor saved once (experts by their edp replica 0)
* ``measure.py``  the exact all-to-all bytes; expert load and dropped tokens vs capacity factor

Who holds what (4 ranks, ep = 2, E = 4)::

    ep group [0, 1]:  rank 0 experts 0 1 | rank 1 experts 2 3     edp groups [0, 2], [1, 3]
    ep group [2, 3]:  rank 2 experts 0 1 | rank 3 experts 2 3
    dense parameters: every rank; tokens: each rank its own rows of the batch (one routing
    group per rank: the serial oracle's routing is (N,))
"""
