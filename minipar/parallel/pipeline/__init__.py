"""Pipeline parallelism: schedules as data, their checks and the timeline simulator.

EN pipeline parallelism · RU конвейерный параллелизм · ZH 流水线并行

The model is cut into ``p`` stages, one per rank, and the mini-batch into
``m`` micro-batches that flow through them (GPipe, Huang et al. 2018, arXiv
1811.06965; 1F1B and interleaved 1F1B, Narayanan et al. 2021, arXiv
2104.04473).  One source, several uses:

- :mod:`.schedule` — ``schedule(kind, stage, p, m, v=1)``: the list of
  instructions (``Forward``, ``Backward``, ``SendAct``, ``RecvAct``,
  ``SendGrad``, ``RecvGrad``, ``OptimizerStep``) a stage runs, for ``naive``,
  ``gpipe``, ``1f1b`` and ``interleaved``; ``in_flight`` (activations held);
- :mod:`.check` — ``check(schedules)``: dependencies, matching messages, no
  deadlock, each problem naming the stage and the instruction;
- :mod:`.simulate` — ``simulate(schedules, cost)``: the timeline a dedicated
  machine would have, ``bubble_fraction`` and ``bubble_time_ratio`` of it
  (the formulas they reproduce live in :mod:`minipar.plan.pipeline`);
- :mod:`.partition` — which blocks each (virtual) stage holds (even or a
  ``balance`` list) and every check of a pipeline's sizes, without MPI;
- :mod:`.execute` — ``PipelineParallel``: the same instruction lists run over
  the grid's pipeline neighbours on real MPI ranks, every instruction timed
  (imports mpi4py, so it is not imported here); :mod:`.messages` its sends
  and receives (tags, non-blocking sends, a stage's hand-off to itself);
- :mod:`.stage_memory` — activation bytes a stage holds, against GPipe's
  re-materialisation formula;
- :mod:`.measure` — the bubble of a recorded run: wall clock, and rebuilt by
  the simulator from each instruction's measured cost; the timeline file of
  ``minipar run pp --timeline`` read by ``minipar bubble --from-run``.

    scheds = schedules("1f1b", p=4, m=8)
    tl = simulate(scheds, uniform_cost(forward=1, backward=2))
    bubble_time_ratio(tl)                 # Fraction(3, 8) = (p - 1)/m
"""

from minipar.parallel.pipeline.check import check, problems
from minipar.parallel.pipeline.schedule import (
    KINDS,
    Backward,
    Forward,
    Instruction,
    OptimizerStep,
    RecvAct,
    RecvGrad,
    SendAct,
    SendGrad,
    in_flight,
    schedule,
    schedules,
)
from minipar.parallel.pipeline.simulate import (
    Deadlock,
    Record,
    Timeline,
    bubble_fraction,
    bubble_time_ratio,
    chart,
    run,
    simulate,
    uniform_cost,
)

__all__ = [
    "KINDS", "Backward", "Deadlock", "Forward", "Instruction", "OptimizerStep", "Record",
    "RecvAct", "RecvGrad", "SendAct", "SendGrad", "Timeline", "bubble_fraction",
    "bubble_time_ratio", "chart", "check", "in_flight", "problems", "run", "schedule",
    "schedules", "simulate", "uniform_cost",
]
