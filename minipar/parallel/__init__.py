"""Parallel training, one folder per family — параллельное обучение — 并行训练.

Read the field in this order; each family's ``__init__`` is its own table of
contents, and every family reproduces the serial model (:mod:`minipar.nn`) on any
world size it supports (its tests say which serial computation it reproduces).

=====================  =====================================================================
shared parts (layer 4) ``engine`` (the one interface: Batch, StepResult, Shard, State; the
                       serial engine, the oracle), ``common`` (RunSpec, rows of the batch),
                       ``parity`` (the one verdict), ``mappings`` (Megatron's conjugate
                       pairs f/g, gather/scatter, all-to-all), ``remat`` (activation
                       checkpointing), ``offload/`` (activations and optimizer states to
                       host and disk)
families (layer 5)     ``data_parallel/`` (DDP, the parameter server), ``zero/`` (ZeRO 0-3),
                       ``tensor_parallel/`` (Megatron, + sequence parallelism),
                       ``context_parallel/`` (ring attention, Ulysses), ``expert_parallel/``,
                       ``pipeline/`` (GPipe, 1F1B, interleaved, zero bubble) — they never
                       import each other
composition (layer 6)  ``hybrid`` (dp x pp x cp x tp on one grid, ZeRO in a pipeline)
on any engine (7)      ``strategies`` (one table builds every engine), ``loop`` (one
                       training loop), ``checkpoint`` (save and resume any layout)
=====================  =====================================================================

Who holds what, 8 ranks as dp 2 x pp 2 x tp 2 (rank = (d·pp + p)·tp + t)::

                 stage 0 (embedding, blocks 0-1)     stage 1 (blocks 2-3, head)
    replica 0    rank 0 | rank 1   (tp halves)       rank 2 | rank 3
    replica 1    rank 4 | rank 5                     rank 6 | rank 7
                 └── f/g all-reduces inside a box ──┘   activations → between stages,
                 gradients all-reduced down each column (the dp axis)

Inside each family the technique itself is a short *core* — its ``__init__`` says
which files, "The technique: read ..." — and the engine around it a *shell*
(``engine.py``: the Engine interface, options and their checks, state_dict, memory,
traffic, timelines; ``measure.py``: formulas and ledgers).  The shell calls the core;
the core holds no clock and no counter (``tests/test_core_budget.py``).  A technique
plugs into the one walk over the model (:mod:`minipar.nn.executor`) through hooks,
never by copying it.  Checks that must run before MPI starts live beside the family's
shell (``options.py`` where the shell imports MPI); what ``minipar run`` needs to
start a technique (its options and reports) lives beside the command, in
:mod:`minipar.run`.
"""
