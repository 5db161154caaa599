"""Expert parallelism — параллелизм экспертов — 专家并行.

The technique: read ``minipar/nn/moe_steps.py`` (117 code lines) for the MoE layer in
three steps (the router, top-k and capacity C, dispatch into (E, C, d) buffers, the
experts, combine), ``layout.py`` (11 code lines) for which experts each rank holds and
the capacity C_j of each source, and ``layer.py`` (65 code lines) for the layer across
ranks: dispatch → all-to-all to the experts' ranks → experts → the reverse all-to-all →
combine, and the backward in the mirror order.

Then the shell: ``model.py`` (the EP GPT: the serial units with the MoE step swapped),
``engine.py`` (``ExpertParallel``, the Engine of EP x data parallelism: dense and expert
gradients apart; each tensor saved once, experts by their edp replica 0),
``options.py`` (``check_ep``, no MPI: the launcher calls it) and ``measure.py`` (the
exact all-to-all bytes; expert load and dropped tokens against the capacity factor).

EN expert parallelism (EP) · RU параллелизм экспертов · ZH 专家并行

Each MoE layer's E experts are spread over the ``ep`` ranks of a group; the
tokens travel to their experts' ranks by all-to-all and back.  Everything
else (embedding, attention, routers, head) is replicated and trained data
parallel.

Who holds what (4 ranks, ep = 2, E = 4)::

    ep group [0, 1]:  rank 0 experts 0 1 | rank 1 experts 2 3     edp groups [0, 2], [1, 3]
    ep group [2, 3]:  rank 2 experts 0 1 | rank 3 experts 2 3
    dense parameters: every rank; tokens: each rank its own rows of the batch (one routing
    group per rank: the serial oracle's routing is (N,))
"""
