"""Grader of the ZB-H1 exercise: the GPipe exercise's checks, with ZB-H1's memory and bubble.

EN ZB-H1 schedule grader · RU проверка расписания ZB-H1 · ZH ZB-H1 调度评分

Qi et al. 2023, "Zero Bubble Pipeline Parallelism", arXiv 2401.10241, §3.1
(ZB-H1, Table 2).  Checked (:mod:`minipar.exercises.gpipe_schedule.grader` runs them):

* correct for p = 1..4 (and N) stages, m = 1..8: every F, B and W once, each W after its
  own B, messages matched, no deadlock (a stuck replay names the cycle of waiting stages);
* 1F1B's memory (§3): at most p − s micro-batches between F and B on stage s, and at most
  p between F and W on every stage (W's run soon after their B, not piled up after the
  last F: that too reaches Table 2's bubble, but holds up to m on the last stage);
* bubble on the simulator with the paper's equal costs T_F = T_B = T_W = 1, measured as
  the paper does (iteration time = the longest stage's span, bubble = that −
  m(T_F + T_B + T_W)): at most (p − 1)(T_F + T_B − T_W) for m ≥ p, a third of 1F1B's
  (p − 1)(T_F + T_B + T_W); below m = p, at most what minipar's own zb-h1 reaches there.
  A bubble that is 1F1B's (W right after each B) and a backward never split are named;
* on N real ranks through the MPI executor (B and W as two instructions): the serial
  run's parameters (m = 1, N − 1, 2N + 1: fewer micro-batches than stages too).
"""

from __future__ import annotations

from minipar.exercises.gpipe_schedule import grader as common
from minipar.exercises.grading import Check
from minipar.exercises.judging import Records

KIND = "zb-h1"
FIRST_STEP = (
    "1F1B's warm-up: stage s runs min(p - s - 1, m) forwards (RecvAct unless stage 0, "
    "Forward, SendAct unless the last stage) before its first B (BackwardInput)."
)
label, make_input, oracle, diagnose = (common.label, common.make_input, common.oracle,
                                       common.diagnose)


def cases(n: int) -> list[dict]:
    return common.cases_for(KIND, n, (1, max(1, n - 1), 2 * n + 1))


run_stage = common.run_stage


def judge(n: int, cases: list[dict], records: Records) -> list[Check]:
    return common.judge_kind(KIND, n, cases, records)
