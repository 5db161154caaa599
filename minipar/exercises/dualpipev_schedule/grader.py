"""Grader of the DualPipe-V exercise: the GPipe exercise's checks, with DualPipe-V's rules.

EN DualPipe-V schedule grader · RU проверка расписания DualPipe-V · ZH DualPipe-V 调度评分

DeepSeek-AI 2024, "DeepSeek-V3 Technical Report", arXiv 2412.19437, §3.2.1 (DualPipe), cut in
half on ZB-V's V (Sea AI Lab; DeepSeek's ``dualpipev.py``).  Checked
(:mod:`minipar.exercises.gpipe_schedule.grader` runs them):

* correct for p = 1..4 (and N) ranks, m = 2p, 2p + 1, 3p + 2 (DualPipe-V needs m >= 2p):
  every F, B and W of both chunks once, each W after its own B, messages matched (placed
  by ``with_comm``, given), no deadlock; an overlapped pair of one micro-batch (its two
  halves depend on each other), a W before its B and the wrong chunk on the V's way
  back are named;
* DualPipe-V's memory and pairs: at most PP + 1 = 2p + 1 chunk-activations in flight on a
  rank, and as many overlapped pairs as DeepSeek's steady state (a missing pair named);
* the bubble on the simulator (F 1, B 2, W 1, F&B = F + B): each rank idles at most
  DualPipe-V's (PP/2 − 1)(F&B + B − 3W), what minipar's own dualpipev reaches;
* on N real ranks through the MPI executor (both chunks, pairs overlapped): the serial
  run's parameters (m = 2N, 2N + 1).
"""

from __future__ import annotations

from minipar.exercises.gpipe_schedule import grader as common
from minipar.exercises.grading import Check
from minipar.exercises.judging import Records

KIND = "dualpipev"
FIRST_STEP = (
    "step 1 of DeepSeek's eight, nF0: rank s runs 2(p - s - 1) forwards of chunk 0 "
    "(Forward(i, 0)) before anything else; the messages are added by with_comm (given)."
)
label, make_input, oracle, diagnose = (common.label, common.make_input, common.oracle,
                                       common.diagnose)


def cases(n: int) -> list[dict]:
    return common.cases_for(KIND, n, (2 * n, 2 * n + 1))


run_stage = common.run_stage


def judge(n: int, cases: list[dict], records: Records) -> list[Check]:
    return common.judge_kind(KIND, n, cases, records)
