"""Data parallelism: every rank a full replica, the batch split by rows, the gradients summed.

EN data parallelism · RU параллелизм по данным · ZH 数据并行

The technique: read ``ddp.py`` (77 code lines) — DDP (Li et al. 2020, arXiv
2006.15704): this rank's rows and their weight b_r / B, gradient ``Bucket``s in
reverse parameter order, the ``DDPHooks`` that start a full bucket's all-reduce as
backward fills it (overlapped), and ``ddp_step`` (wait for all, the optimizer);
then ``parameter_server.py`` (113 code lines) — the parameter server (Li et al.
2014, OSDI '14): a ``Worker`` computes, pushes its gradient and pulls the
parameters; a ``Server`` aggregates, updates and answers, synchronously or with
bounded staleness.

The shell around them:

- :mod:`.engine` — ``DataParallel``, DDP's :class:`~minipar.parallel.engine.Engine`:
  its options and their checks, each bucket's all-reduce (the α–β–γ model, decided on
  rank 0 and broadcast), the step's ``Timeline`` (the overlap, measured), state;
- :mod:`.ps_engine` — ``ParameterServer``, the parameter server's Engine: roles,
  options, the straggler and the workers' measured seconds, state;
- :mod:`.measure` — the formulas next to the counters (bytes per bucket, a replica's
  model-state bytes) and the overlap measured, then rebuilt on a link of its own.

Both engines run on a grid of dp ranks (``strategies.build("dp" | "ps", spec, grid,
**options)``): ``step(batch)`` cuts a rank's rows of the global batch;
``state_dict()`` holds, in DDP, whole tensors with replica = the dp rank, in the
parameter server a server's flat range cut per tensor (replica 0) and a worker's
whole parameters (replica 1 + worker).

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
