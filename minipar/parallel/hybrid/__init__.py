"""Hybrid (3D/4D) parallelism: every axis on one grid — гибридный параллелизм — 混合并行.

EN 3D parallelism (hybrid parallelism, PTD-P) · RU трёхмерный (гибридный) параллелизм ·
ZH 3D 并行（混合并行）

Narayanan et al. 2021 (PTD-P, arXiv 2104.04473): n = p·t·d ranks; here the grid's
dp x pp x cp x tp (:class:`minipar.comm.topology.Grid`, tp innermost), ep carved out of
the dp·cp ranks.  The pipeline engine runs this rank's stage; its units are tensor-,
context- or expert-parallel ones; the gradients are summed (or ZeRO-sharded) over the
ranks that hold the same shard.  Who holds what (8 ranks, dp 2 x pp 2 x tp 2)::

                  pp stage 0                 pp stage 1
                 tp 0       tp 1            tp 0       tp 1
    dp 0      [ embed,    [ embed,   ==>  [ blocks,   [ blocks,
                blocks      blocks          head        head
                0-1 ]/2     0-1 ]/2         ]/2         ]/2        each rank: 1/t of its
    dp 1      [ same as dp 0: a replica, its own rows of the batch ]   stage's columns/rows

Read in this order (one module each; nothing is imported here):

- :mod:`.layout` — ``check_hybrid`` (every size rule, before any message) and
  ``micro_rows`` (the rows of each micro-batch), without MPI;
- :mod:`.stages` — ``HybridStage``, the stage model: tensor-, context- or expert-parallel
  units, my tp shard of the stage's parameters and where each sits in the serial tensor,
  my rows and positions of the batch, the loss;
- :mod:`.wire` — what travels between stages: PTD-P's scatter/gather, the SP shard;
- :mod:`.sync` — the gradient sync: all-reduce over the dp·cp ranks, experts apart, or
  ZeRO-1, 2 and 3 over them (the sharded states, the hooks each step runs the units with);
- :mod:`.engine` — ``build``: those three parts made from the grid and the options, handed
  to the one pipeline engine (:class:`~minipar.parallel.pipeline.engine.PipelineParallel`):
  the :class:`~minipar.parallel.engine.Engine` interface (``minipar run hybrid``);
- :mod:`.measure` — ``bytes_formula``: the exact bytes per step on each grid axis;
- :mod:`.oracle` — ``hybrid_zeropp_reference``: the serial arithmetic a ZeRO++ run
  (ZeRO-3's ``zeropp``) equals bit for bit.
"""
