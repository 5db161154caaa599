"""ZeRO, stages 0-3: data parallelism with one copy of the model states in total (stage 3: FSDP).

EN Zero Redundancy Optimizer (ZeRO) · RU оптимизатор с нулевой избыточностью · ZH 零冗余优化器

The technique: read ``shard.py`` (41 code lines), ``hooks.py`` (96 code lines),
``step.py`` (21 code lines), in this order:

- :mod:`.shard` — the rule: rank r owns the slice ``[lo_r, hi_r)`` of the flat
  buffer (``shard_range``), a unit is a span of it, and its part on a rank is the
  ``overlap`` of the two; ``shard_states``: what a rank holds at each stage, the
  optimizer's slice a view of the full buffers where those exist;
- :mod:`.hooks` — ``ZeroHooks`` on the units executor: stage 3 all-gathers a unit
  before it runs and drops it after, stages 2-3 reduce-scatter its gradients;
  with prefetch K, stage 3 posts the next K units' all-gathers of the walk's plan
  while a unit computes and reduce-scatters without waiting (FSDP's prefetch);
- :mod:`.step` — ``zero_step``: the walk, then all-reduce (0) or reduce-scatter (1)
  the gradients, step the own shard, all-gather the parameters (1-2).

ZeRO++ (Wang et al. 2023, arXiv 2306.10209), stage 3 with quantized and hierarchical
communication: read ``zeropp.py`` (85 code lines), then
``minipar/collectives/quantized.py`` (39 code lines) — ``ZeroPPHooks`` override where
stage 3 gathers (qwZ's int8 all-gather, hpZ's node all-gather in backward) and how it
reduces (qgZ's int4 all-to-all, in the node then across nodes).  The same hooks run in
the hybrid's ZeRO-3 (:mod:`minipar.parallel.hybrid.sync`), per pipeline stage, over its
dp·cp ranks (``minipar run hybrid --zero 3 --zeropp``).

Then the shell:

- :mod:`.engine` — ``ZeRO`` (Rajbhandari et al. 2019, arXiv 1910.02054), an
  :class:`~minipar.parallel.engine.Engine`: its options and their checks, the
  all-reduce choice, the offloads wired in, what a rank holds (``ledger``,
  ``memory``), its ``traffic`` and its ``state_dict`` (the flat ranges cut per
  tensor, so any layout resumes any other); ``MeteredZeroHooks``, the hooks that
  also measure what stage 3 held gathered at most;
- :mod:`.measure` — a run's bytes sent and held, next to their exact figure and the
  paper's (ZeRO++'s too: inside and across nodes, and hpZ's memory);
- :mod:`.oracle` — the serial arithmetic of a ZeRO++ run, which it equals bit for bit.

Who holds what (N = 3 ranks, Ψ parameters; C_r ≈ Ψ/3 the shard of rank r)::

    stage      rank 0          rank 1          rank 2
    0  DP      P G O  (Ψ)      P G O  (Ψ)      P G O  (Ψ)       all-reduce grads
    1  P_os    P G (Ψ), O C_0  P G (Ψ), O C_1  P G (Ψ), O C_2   reduce-scatter G,
    2  P_os+g  P (Ψ), G O C_0  P (Ψ), G O C_1  P (Ψ), G O C_2   step own O, all-gather P
    3  +p      P G O  C_0      P G O  C_1      P G O  C_2       all-gather P per unit

    P params, G grads, O optimizer states (fp32 master, Adam m and v)
"""
