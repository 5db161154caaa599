"""Pipeline parallelism: the model cut by layers into stages, micro-batches flowing through.

EN pipeline parallelism · RU конвейерный параллелизм · ZH 流水线并行

The technique: read ``stage_loop.py`` (135 code lines), then ``schedule.py`` (114 code
lines) — GPipe, 1F1B, interleaved 1F1B — ``zero_bubble.py`` (110 code lines) — ZB-H1,
ZB-H2, ZB-V — and ``dualpipe.py`` (59 code lines) — DeepSeek-V3's DualPipe and
DualPipe-V.  ``stage_loop.py`` holds the instructions one stage runs (``Forward``,
``Backward``, its split ``BackwardInput`` (B) and ``BackwardWeight`` (W), ``SendAct``,
``RecvAct``, ``SendGrad``, ``RecvGrad``, ``OptimizerStep``, DualPipe's overlapped pair
``ForwardBackward``), the virtual stages, and ``StageLoop``: one stage's list run
against its neighbours, one dispatch table; ``schedule.py`` the naive, GPipe, 1F1B and
interleaved compute orders and ``with_comm``, which puts the messages around any order
(``stage_schedule(kind, s, p, m, v)``, ``schedules(kind, p, m, v)``); ``zero_bubble.py``
the orders whose backward is split in B and W (Qi et al. 2023, arXiv 2401.10241; zb-v's
chunks in a V); ``dualpipe.py`` DeepSeek's eight steps (arXiv 2412.19437), micro-batches
from both ends (``dualpipe``) or down and back up a V (``dualpipev``).

The model is cut into ``p`` stages, one per rank, and the mini-batch into ``m``
micro-batches that flow through them (GPipe, Huang et al. 2018, arXiv 1811.06965; 1F1B
and interleaved 1F1B, Narayanan et al. 2021, arXiv 2104.04473).  Who holds what (p = 4,
8 blocks; interleaved: rank s also holds virtual stages s + p, s + 2p, ...)::

      rank 0          rank 1          rank 2          rank 3
    +----------+    +----------+    +----------+    +----------+
    | embed    | -> | blocks   | -> | blocks   | -> | blocks   |   activations ->
    | blocks   |    |   2, 3   |    |   4, 5   |    |   6, 7   |
    |   0, 1   | <- |          | <- |          | <- | head     |   <- their gradients
    +----------+    +----------+    +----------+    | + loss   |
                                                    +----------+
    each rank: its stage's parameters, gradients and AdamW states only;
    the activations of the micro-batches it has forwarded but not yet backwarded

The shell around it (one module each; nothing is imported here):

- :mod:`.engine` — ``PipelineParallel``: the engine interface (``step(batch)``,
  ``evaluate``, ``state_dict``: each stage's tensors whole under their serial names,
  replica = the dp coordinate), its options and their checks, the stage loop given its
  link, hooks and step, every instruction timed and measured from outside the loop
  (imports mpi4py); ``build`` (strategy "pp"); the hybrid
  (:mod:`minipar.parallel.hybrid`) gives it its own stage model, wire and sync;
- :mod:`.parts` — what the engine is given: a stage model (``SerialStage``: the serial
  GPT's units, whole tensors) and a gradient sync (``AllReduceSync`` over dp);
- :mod:`.p2p` — ``StageLink``, the messages between stages: non-blocking sends, blocking
  receives, tags, a rank's hand-off to itself; what travels is its wire (``Whole``);
- :mod:`.stage` — a stage's hooks (gradient accumulation, remat, offload) and its
  activation ledger;
- :mod:`.partition` — which blocks each (virtual) stage holds (even or a ``balance``
  list), and the checks of a run's pipeline options, without MPI (the schedules' own
  arithmetic rules are :func:`.schedule.check_arguments`);
- :mod:`.check` — ``problems(schedules)`` / ``check_schedules(schedules)``: dependencies,
  matching messages, no deadlock, each problem naming the stage and the instruction;
- :mod:`.simulate` — ``replay(schedules, cost)``: the timeline a dedicated machine would
  have (ASAP, blocking receives, buffered or rendezvous sends), ``Deadlock`` if it sticks;
- :mod:`.measure` — the bubble of a timeline and its text chart, the micro-batches in
  flight (``in_flight``) and waiting for W (``w_pending``) of a list; a recorded run's
  timeline rebuilt on a dedicated machine; the timeline file of ``minipar run pp
  --timeline`` read by ``minipar bubble --from-run`` (the papers' formula itself:
  :func:`minipar.plan.pipeline.bubble_formula`).

    scheds = schedules("1f1b", p=4, m=8)
    tl = replay(scheds, uniform_cost(forward=1, backward=2))
    bubble_time_ratio(tl)                 # Fraction(3, 8) = (p - 1)/m
"""
