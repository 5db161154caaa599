"""The explorers' numbers (minipar.viz.explore): against minipar.plan, the simulator, the cost
model and — for the memory explorer — a measured run on real ranks; the thin widget redraws."""

from __future__ import annotations

import math
import re

import pytest

from minipar.collectives.cost_model import allreduce_time, load_costs
from minipar.plan.layouts import Layout, layout_memory
from minipar.plan.model import gpt_param_count
from minipar.plan.presets import load_model
from minipar.plan.tensor import tp_bytes_per_rank_per_layer
from minipar.viz.explore import (
    collective,
    experts,
    memory,
    predict,
    problems,
    schedule,
    step,
    tensor,
)
from minipar.viz.explore.view import explore

MEMORY_CASES = [  # (preset, dp, tp, pp, vp, cp, zero, remat, m, schedule)
    ("llama3-70b", "Llama 3 70B", 8, 8, 4, 1, 1, 1, "selective", 16, "1f1b"),
    ("gpt3-175b", "GPT-3 175B", 4, 8, 8, 2, 1, 3, "full", 16, "interleaved"),
    ("llama3-8b", "Llama 3 8B", 2, 2, 2, 1, 2, 2, "none", 4, "1f1b"),
    ("llama3-405b", "Llama 3 405B", 8, 8, 2, 1, 1, 0, "full", 8, "1f1b"),
]


@pytest.mark.parametrize("case", MEMORY_CASES, ids=[c[1] for c in MEMORY_CASES])
def test_memory_is_the_planners_layout_memory(case):
    """Without offload or experts, the explorer's total less its buffers is layout_memory's
    (the schedule's in-flight count from the package's schedules equals the planner's)."""
    preset, name, d, t, p, v, c, z, remat, m, kind = case
    view = memory.memory(name, dp=d, tp=t, pp=p, vp=v, cp=c, zero=z, remat=remat,
                         micro_batches=m, schedule=kind)
    want = layout_memory(load_model(preset), Layout(d, t, p, c, z, remat, 1, m, v=v))
    got = view.numbers
    assert got["device_total"] - got["buffers"] == pytest.approx(want["total"], rel=1e-12)
    assert got["activations"] == pytest.approx(want["activations"], rel=1e-12)
    assert got["params"] + got["grads"] + got["optimizer"] == pytest.approx(want["states"])
    assert view.figure is not None and view.lines


def test_memory_presets_count_their_parameters():
    assert memory.total_params("Llama 3 70B") == load_model("llama3-70b").psi
    assert memory.total_params("GPT-3 175B") == load_model("gpt3-175b").psi
    assert memory.total_params(predict.SMALL) == gpt_param_count(2, 16, 10, 8) == 7040
    assert memory.total_params("Mixtral 8x7B") == pytest.approx(46.7e9, rel=2e-3)  # 46.7B
    assert memory.total_params("DeepSeek-V3") == pytest.approx(671e9, rel=3e-3)  # 671B


def test_memory_offload_experts_and_bad_layouts():
    on = memory.memory(offload=True).numbers
    off = memory.memory().numbers
    assert on["optimizer"] == 0 and on["offloaded"] == off["optimizer"] > 0
    assert on["device_total"] == pytest.approx(off["device_total"] - off["optimizer"])
    moe1 = memory.memory("Mixtral 8x7B", dp=8, tp=1, pp=1, ep=1).numbers
    moe8 = memory.memory("Mixtral 8x7B", dp=8, tp=1, pp=1, ep=8).numbers
    assert moe8["params"] < moe1["params"] and moe8["activations"] == moe1["activations"]
    for bad, word in (({"tp": 3}, "t = 3"), ({"ep": 2}, "no experts"),
                      ({"vp": 2}, "interleaved")):
        with pytest.raises(ValueError, match=word):
            memory.memory(**bad)
    assert memory.memory("Llama 3 405B", dp=1, tp=1, pp=1).numbers["fits"] is False
    ring, gather = (memory.memory(dp=4, cp=2, cp_kind=k).numbers["buffers"]
                    for k in ("ring", "allgather"))
    kv = 8 * 128 / 8 * 2  # Llama 3 70B: 8 KV heads of 128 over tp 8, 2 bytes
    assert ring - 25e6 == 2 * 2 * 4096 * kv and gather - 25e6 == 2 * 8192 * kv


def test_fp8_is_one_more_precision_entry():
    """DeepSeek-V3's FP8, the Playbook's row: 1 + 6 + 8 = 15 bytes of model states a
    parameter (FP8 weights; BF16 + FP32 accumulated grads; FP32 master + BF16 moments),
    activations counted as bf16's."""
    fp8, bf16 = (memory.memory("Llama 3 8B", dp=1, tp=1, pp=1, zero=0, precision=p).numbers
                 for p in ("fp8 (DeepSeek-V3)", "bf16 mixed"))
    psi = fp8["params_per_rank"]
    assert (fp8["params"], fp8["grads"], fp8["optimizer"]) == (psi, 6 * psi, 8 * psi)
    assert fp8["params"] + fp8["grads"] + fp8["optimizer"] == 15 * psi
    assert fp8["activations"] == bf16["activations"]
    assert "fp8 (DeepSeek-V3)" in memory.CONTROLS["precision"]


def test_memory_explorer_against_a_measured_run():
    """minipar run zero --stage 3 -n 2 (float64): the model states one rank holds, measured,
    are the memory explorer's params + grads + optimizer for the same small GPT."""
    measured = predict.measure_model_states(3, 2)
    assert measured == predict.predicted_model_states(3, 2) == 32 * 7040 / 2
    assert predict.QUESTIONS["zero-memory"].formula() == measured


def test_measure_this_on_tensor_and_pipeline_layouts():
    """"measure this" beyond dp/ZeRO: the same small GPT on dp 1 · tp 2 · pp 2 with ZeRO-3
    (minipar run hybrid, 4 ranks): the model states of the explorer's stage, measured, are
    the explorer's to the byte."""
    assert predict.measure_command(3, 1, 2, 2).startswith(
        "minipar run hybrid -n 4 --dp 1 --tp 2 --pp 2 --zero 3 --layers 2")
    measured = predict.measure_model_states(3, 1, tp=2, pp=2)
    assert measured == predict.predicted_model_states(3, 1, tp=2, pp=2) == 60_672


def test_question_formulas_are_the_counted_numbers():
    """Each question's formula, as minipar run counts the same configuration (its summaries'
    exact counts; tests of each family check those against the runs)."""
    q = predict.QUESTIONS
    assert q["ring-bytes"].formula() == 36_000  # 2(N−1)/N × 24,000
    assert q["dp-bytes"].formula() == 56_320  # minipar run dp -n 2: Ψ·8
    assert q["tp-bytes"].formula() == 81_920  # minipar run tp -n 2: bytes_exact_per_rank
    assert q["bubble"].formula() == pytest.approx(0.2)
    # minipar run zero --stage 3 -n 4 --node 2 --zeropp qwz: the paper's 53,130 B, counted
    # 53,168-53,184 (each shard's blocks have their own scales)
    assert q["qwz-bytes"].formula() == 2 * 5280 * (1 + 8 / 256) + 5280 * 8 == 53_130
    assert q["moe-memory"].formula() == 365_568  # minipar run ep -n 2 --experts 4


def test_judge_says_right_or_names_the_usual_mistake():
    right = predict.judge(36_000, 36_000, 36_000, 0.01, "MISTAKE", "B")
    wrong = predict.judge(48_000, 36_000, 36_000, 0.01, "MISTAKE", "B")
    assert right[-1].endswith("right.") and "MISTAKE" in wrong[-1]
    assert "36,000 B" in right[0] and "no prediction" in predict.judge(None, 1, 1, 0, "")[-1]
    assert predict.parse_number("56,320") == 56320 and predict.parse_number("") is None


@pytest.mark.parametrize("kind", ["naive", "gpipe", "1f1b", "interleaved", "zb-h1", "zb-h2",
                                  "zb-v"])
def test_schedule_bubble_is_the_formula(kind):
    view = schedule.schedule(kind, 4, 8, 2)
    assert view.numbers["bubble"] == pytest.approx(view.numbers["formula"], abs=1e-12)
    held = view.numbers["in_flight"]
    assert {"gpipe": held == [8] * 4, "1f1b": held == [4, 3, 2, 1],
            "interleaved": held[0] == 11}.get(kind, True)


@pytest.mark.parametrize("kind", ["dualpipe", "dualpipev"])
def test_dualpipe_is_one_more_entry(kind):
    from minipar.plan.pipeline import dualpipe_formula

    view = schedule.schedule(kind, 4, 8)
    assert view.numbers["v"] == 2 and max(view.numbers["in_flight"]) > 0
    assert view.numbers["formula"] == float(dualpipe_formula(kind, 4, 8, 1, 2, 1)["fraction"])
    mem = {k: memory.memory("Llama 3 8B", dp=1, tp=1, pp=4, micro_batches=8, schedule=k)
           for k in ("1f1b", kind)}
    from minipar.plan.layouts import stage_param_count

    llama = load_model("llama3-8b")
    pv = 4 if kind == "dualpipe" else 8  # DualPipe: stages 0 and 3 of 4; V: 0 and 7 of 8
    both = stage_param_count(llama, pv, 1, 0) + stage_param_count(llama, pv, 1, pv - 1)
    assert mem[kind].numbers["params_per_rank"] == both


def test_schedule_costs_and_zero_bubble_table2():
    v = schedule.schedule("zb-h1", 4, 8, t_f=1, t_b=1, t_w=0.5)  # (p−1)(F + B − W)
    assert v.numbers["formula"] == pytest.approx(4.5 / (4.5 + 8 * 2.5))
    assert v.numbers["bubble"] == pytest.approx(v.numbers["formula"])


@pytest.mark.parametrize("algorithm", list(collective.ALGORITHMS))
@pytest.mark.parametrize("n", [2, 4, 8])
def test_collective_ends_with_every_sum_and_the_models_time(algorithm, n):
    view = collective.collective(algorithm, n, 1 << 20, step=99)
    num = view.numbers
    assert num["complete"] and num["step"] == num["steps"]
    c = load_costs()
    if algorithm in ("ring", "recursive_doubling"):
        assert num["time_s"][algorithm] == allreduce_time(algorithm, 1 << 20, n, c)
    if algorithm == "ring":
        assert num["bytes_sent_per_rank"] == [num["ring_formula_bytes"]] * n
        assert num["steps"] == 2 * (n - 1)
    if algorithm == "tree":
        assert num["steps"] == 2 * math.ceil(math.log2(n))
    assert not collective.collective(algorithm, n, 1 << 20, step=0).numbers["complete"]


def test_tensor_bytes_and_activations_against_t():
    view = tensor.tensor("GPT-3 175B", t=8, sp=True)
    assert view.numbers["bytes_per_block"] == tp_bytes_per_rank_per_layer(1, 2048, 12288, 8)
    no_sp = tensor.tensor("GPT-3 175B", t=8, sp=False).numbers
    assert view.numbers["bytes_per_block"] == no_sp["bytes_per_block"]  # RS + AG = AR
    assert view.numbers["activation_bytes"] < no_sp["activation_bytes"]
    assert view.numbers["collectives"] == ["all-gather", "reduce-scatter"] * 2
    with pytest.raises(ValueError, match="t = 5"):
        tensor.tensor("Llama 3 8B", t=5)


def test_experts_load_capacity_and_dropped():
    v = experts.experts(tokens=1024, n_experts=8, top_k=2, capacity_factor=1.25, skew=1.0)
    n = v.numbers
    assert n["capacity"] == math.ceil(2 * 1024 / 8 * 1.25) and sum(n["load"]) == 2048
    assert n["dropped"] == sum(max(0, x - n["capacity"]) for x in n["load"])
    curve = list(n["curve"].values())
    assert all(a >= b for a, b in zip(curve, curve[1:]))
    even = experts.experts(skew=0.0, capacity_factor=2.0).numbers
    assert even["dropped"] == 0 and even["aux_loss"] == pytest.approx(0.01, rel=0.05)


def test_loss_free_balancing_evens_the_load():
    """DeepSeek-V3's bias: after its updates the favoured experts are chosen less, fewer
    assignments are dropped, and the bias is what update_bias made of the loads."""
    plain = experts.experts(skew=2.0, capacity_factor=1.0).numbers
    free = experts.experts(balancing="loss-free (DeepSeek-V3)", skew=2.0,
                           capacity_factor=1.0).numbers
    assert max(free["load"]) < max(plain["load"]) and free["dropped"] < plain["dropped"]
    assert free["bias"][0] < 0 < free["bias"][-1]  # the favoured expert pushed down
    assert plain["bias"] is None


def test_step_is_the_planners_estimate():
    from minipar.plan.cluster import load_cluster
    from minipar.plan.step_time import estimate

    v = step.step()
    want = estimate(load_model("gpt3-175b"), Layout(8, 8, 16, 1, 1, "full", 1, 192),
                    load_cluster("dgx-a100"), 1536)
    assert v.numbers["step_s"] == want["step_s"] and v.numbers["mfu"] == want["mfu"]


def test_the_widget_redraws_when_a_control_moves(monkeypatch):
    pytest.importorskip("ipywidgets")
    from minipar.viz.explore import view as vw

    shown: list[str] = []

    class Handle:
        def update(self, obj):
            shown.append(obj.data)
    monkeypatch.setattr(vw, "_handle", lambda obj: Handle())
    first = explore(schedule.schedule, schedule.CONTROLS)
    assert "bubble: replayed 0.273" in first.text and set(first.controls) == set(
        schedule.CONTROLS)
    first.controls["p"].value = 2
    assert "p = 2" in shown[-2] and "bubble: replayed 0.111" in shown[-2]
    assert isinstance(shown[-1], bytes) and shown[-1].startswith(b"\x89PNG")
    first.controls["kind"].value = "interleaved"  # v = 1: one line, no traceback
    assert shown[-1] == "not a valid choice: interleaved needs v ≥ 2 chunks per rank"
    assert vw.widget_for("x", range(1, 5), 2).max == 4


@pytest.mark.parametrize("nb", sorted(problems.PROBLEMS))
def test_worked_problems_state_minipar_plans_answers(nb):
    for p in problems.PROBLEMS[nb]:
        assert p.answer == pytest.approx(p.check(), rel=p.rel_tol), p.question


@pytest.mark.parametrize("family", ["data_parallel", "zero", "tensor_parallel", "pipeline",
                                    "expert_parallel"])
def test_read_first_names_the_core_and_its_lines(family):
    assert re.search(r"The technique: read ``[\w/.]+`` \(\d+ code lines\)",
                     problems.read_first(family))


def test_measure_this_says_the_explorers_number_without_widgets(monkeypatch):
    import builtins

    import IPython.display

    shown: list[str] = []
    monkeypatch.setattr(IPython.display, "display", lambda obj, **k: shown.append(obj.data))

    real = builtins.__import__

    def no_widgets(name, *a, **k):
        if name == "ipywidgets":
            raise ImportError(name)
        return real(name, *a, **k)
    monkeypatch.setattr(builtins, "__import__", no_widgets)
    predict.measure_this(dp=4, zero=2)
    out = "".join(shown)
    assert f"{8 * 7040 + 24 * 7040 // 4:,} B per rank" in out
    assert "dp 4 · tp 1 · pp 1 · cp 1, ZeRO-2" in out
    assert "minipar run zero -n 4 --stage 2" in out
    shown.clear()
    predict.measure_this(dp=1, zero=3, tp=2, pp=2)
    predict.measure_this(dp=4, zero=0, tp=2)
    tp_pp, too_many = shown
    assert "60,672 B per rank (stage " in tp_pp and "minipar run hybrid -n 4 --dp 1" in tp_pp
    assert too_many.startswith("dp 4 · tp 2 · pp 1 · cp 1 = 8 ranks: at most 4 here")
    assert predict.measure_command(2, 2, cp=2).startswith(
        "minipar run hybrid -n 4 --dp 2 --tp 1 --pp 1 --cp 2 --zero 2")
    assert predict.predicted_model_states(2, 2, cp=2) == 98_560  # ZeRO over dp·cp = 4
