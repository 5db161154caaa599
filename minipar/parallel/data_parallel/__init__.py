"""Data parallelism: every rank a full replica, the batch split by rows, the gradients summed.

EN data parallelism · RU параллелизм по данным · ZH 数据并行

Read in this order:

- :mod:`.ddp` — ``DataParallel`` (DDP, Li et al. 2020, arXiv 2006.15704): gradient
  ``Bucket``s in reverse parameter order, all-reduced by ``DDPHooks`` as backward fills
  them (overlapped), the per-bucket algorithm, the step's ``Timeline``;
- :mod:`.parameter_server` — ``ParameterServer`` (Li et al. 2014, OSDI '14): workers
  push gradients to server ranks and pull parameters, synchronous or with bounded
  staleness;

both are :class:`~minipar.parallel.engine.Engine` s on a grid of dp ranks
(``strategies.build("dp" | "ps", spec, grid, **options)``): ``step(batch)`` cuts
a rank's rows of the global batch; ``state_dict()`` holds, in DDP, whole tensors
with replica = the dp rank, in the parameter server a server's flat range cut
per tensor (replica 0) and a worker's whole parameters (replica 1 + worker);
- :mod:`.measure` — the formulas next to the counters (bytes per bucket, a replica's
  model-state bytes) and the overlap measured, then rebuilt on a link of its own.

Who holds what (N = 3 ranks, Ψ parameters, B rows of the batch)::

    DDP            rank 0          rank 1          rank 2
                   params Ψ        params Ψ        params Ψ       replicas, equal
                   grads  Ψ        grads  Ψ        grads  Ψ
                   optim  Ψ        optim  Ψ        optim  Ψ
                   rows 0..B/3     rows B/3..2B/3  rows 2B/3..B
                      \\______ all-reduce grads (per bucket) ______/

    PS (1 server)  rank 0: server  rank 1: worker  rank 2: worker
                   params Ψ        params Ψ        params Ψ
                   grads  Ψ        grads  Ψ        grads  Ψ
                   optim  Ψ        rows 0..B/2     rows B/2..B
                      ^------- push grads, pull params -------/
"""
