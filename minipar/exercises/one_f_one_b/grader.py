"""Grader of the 1F1B schedule exercise: the GPipe exercise's checks, with 1F1B's rule and bubble.

EN 1F1B schedule grader · RU проверка расписания 1F1B · ZH 1F1B 调度评分

Narayanan et al. 2021, "Efficient Large-Scale Language Model Training on GPU
Clusters Using Megatron-LM", arXiv 2104.04473, §2.2.1 (PipeDream-Flush).
Checked (:mod:`minipar.exercises.gpipe_schedule.grader` runs them):

* correct for p = 1..4 (and N) stages, m = 1..8: dependencies, messages, no deadlock;
* at most p − s micro-batches in flight on stage s (min(p − s, m)): never more than p;
* bubble (p − 1)/m of the ideal time on the simulator (forward 1, backward 2), exactly —
  the same as GPipe's (p − 1)/(m + p − 1) of the step, with p instead of m activations held;
* on N real ranks through the MPI executor: the serial run's parameters (m = 1, N − 1, 2N + 1:
  fewer micro-batches than stages too, where the warm-up is cut short).
"""

from __future__ import annotations

from minipar.exercises.gpipe_schedule import grader as common
from minipar.exercises.grading import Check
from minipar.exercises.judging import Records

KIND = "1f1b"
FIRST_STEP = (
    "the warm-up: stage s runs min(p - s - 1, m) forwards (RecvAct unless stage 0, Forward, "
    "SendAct unless the last stage) before its first backward."
)
label, make_input, oracle, diagnose = (common.label, common.make_input, common.oracle,
                                       common.diagnose)


def cases(n: int) -> list[dict]:
    return common.cases_for(KIND, n, (1, max(1, n - 1), 2 * n + 1))


run_stage = common.run_stage


def judge(n: int, cases: list[dict], records: Records) -> list[Check]:
    return common.judge_kind(KIND, n, cases, records)
