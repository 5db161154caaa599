"""Expert parallelism reproduces the serial MoE GPT, drops what it drops, sends what the
formula says, and refuses bad input on every rank before any message.

Each world size 1, 2, 4 is ONE launch of tests/mpi/ep_check.py: several AdamW
steps of the float64 MoE GPT per configuration (E = 4 and 8, each with top-1
and top-2, capacity factors that drop tokens, ep = N and ep = 2 x edp = 2 on 4 ranks, pure
data parallelism ep = 1, uneven rows), each judged by the shared verdict
against ``serial_reference(spec, N)`` (GShard's local groups: one micro-batch
per data-parallel rank), with drops > 0 asserted and the bytes counted on the
ep, edp and dp communicators equal to the exact formula
(:func:`minipar.parallel.expert_parallel.measure.alltoall_bytes`; ``minipar.plan.moe``'s figure for
top-1).  In-process: the formula by hand, the checks' sentences, and one
rank's EP block bit-identical to the serial block.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import numpy as np
import pytest
from conftest import refused_before_mpi, run_minipar
from mpi4py import MPI

from minipar import launch
from minipar.comm.topology import Grid
from minipar.nn import GPT
from minipar.parallel.common import RunSpec
from minipar.parallel.expert_parallel.layout import OPS, capacities, expert_ids
from minipar.parallel.expert_parallel.measure import alltoall_bytes
from minipar.parallel.expert_parallel.options import check_ep

SCRIPT = str(Path(__file__).parent / "mpi" / "ep_check.py")


@pytest.mark.parametrize("n,cases", [(1, 7), (2, 9), (4, 11)])
def test_parity_with_drops_bytes_and_bad_input(n: int, cases: int) -> None:
    proc = launch.run(n, SCRIPT, timeout=180, env={"MINIPAR_WATCHDOG_S": "60"})
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    line = [ln for ln in proc.stdout.splitlines() if ln.startswith("EP-SUMMARY")]
    assert line, proc.stdout[-3000:]
    fields = dict(kv.split("=") for kv in line[0].split()[1:])
    assert fields == {"N": str(n), "cases": str(cases), "checks": fields["checks"],
                      "failures": "0"}
    assert int(fields["checks"]) >= n * (9 + 5 * cases)
    case_lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("EP-CASE")]
    assert len(case_lines) == cases
    assert all(("drops=0 " in ln) == ("dropless" in ln) for ln in case_lines)


def test_the_all_to_all_bytes_by_hand() -> None:
    # E = 4 on ep = 2, d = 3, float64; caps 5 (me, rank 0) and 4: I send my 5 rows of each of
    # the other rank's 2 experts (dispatch, and d(out) in backward), and its 4 rows of each
    # of my 2 experts back (combine, and d(buffers)); 2 counts of 8 bytes
    b = alltoall_bytes(4, 3, [5, 4], 0, 8)
    assert b == {"ep_counts": 16, "ep_dispatch": 2 * 5 * 3 * 8, "ep_combine": 2 * 4 * 3 * 8,
                 "ep_combine_grad": 2 * 5 * 3 * 8, "ep_dispatch_grad": 2 * 4 * 3 * 8}
    assert tuple(b) == OPS
    # one rank sends nothing; equal C: 4 (ep-1)/ep E C d b, the plan's padded-buffer figure
    assert sum(alltoall_bytes(8, 16, [6], 0, 8).values()) == 0
    from minipar.plan.moe import moe_alltoall_bytes_per_rank

    data = sum(v for k, v in alltoall_bytes(8, 16, [6, 6, 6, 6], 2, 2).items() if k != OPS[0])
    assert data == 4 * 3 / 4 * 8 * 6 * 16 * 2
    assert data == moe_alltoall_bytes_per_rank(40, 16, 4, 1, 8, 1.2, bytes_per_elem=2,
                                               backward=True)


def test_experts_and_capacities() -> None:
    assert [expert_ids(8, 4, c) for c in range(4)] == [[0, 1], [2, 3], [4, 5], [6, 7]]
    assert expert_ids(4, 1, 0) == [0, 1, 2, 3]
    # B = 10 rows of T = 8 on 4 ranks: 3, 3, 2, 2 rows = 24, 24, 16, 16 tokens; E = 4, cf 1.25
    assert capacities(4, 1.25, [24, 24, 16, 16], 1) == [8, 8, 5, 5]
    assert capacities(4, 1.25, [24, 16], 2) == [15, 10]  # top-2: k·n assignments
    assert capacities(4, None, [24, 16], 2) == [None, None]  # dropless: the counts decide


@pytest.mark.parametrize("args,message", [
    ((0, 1, 1.25, 1, 2), ("--experts must be a positive integer (expert parallelism needs a "
                          "mixture of experts), got 0")),
    ((4, 5, 1.25, 1, 2), "--top-k must be between 1 and --experts 4, got 5"),
    ((1, 2, 1.25, 1, 2), "--top-k must be between 1 and --experts 1, got 2"),
    ((12, 2, None, 4, 4, 3), "--expert-groups 3 and --ep 4: node-limited routing maps"),
    ((4, 0, 1.25, 1, 2), "got 0"),
    ((4, 1, 0.0, 1, 2), "--capacity-factor must be > 0, got 0.0"),
    ((4, 1, float("nan"), 1, 2), "--capacity-factor must be > 0"),
    ((4, 1, 1.25, 3, 4), "--ep 3 must divide the 4 data-parallel ranks"),
    ((4, 1, 1.25, 0, 4), "--ep 0 must divide"),
    ((6, 1, 1.25, 4, 4), "--ep 4 does not divide --experts 6: each expert-parallel rank holds"),
])
def test_bad_input_is_one_line_naming_the_numbers(args: tuple, message: str) -> None:
    with pytest.raises(ValueError) as e:
        check_ep(*args)
    assert message in str(e.value) and "\n" not in str(e.value)
    check_ep(4, 2, 1.25, 2, 4)  # a good one passes


@pytest.mark.parametrize("more", [
    {"capacity_factor": 0.75},
    {"capacity_factor": None, "top_k": 3, "router": "sigmoid", "shared_experts": 2,
     "expert_width": 24, "seq_aux_loss_coef": 0.1, "expert_groups": 2, "groups_per_token": 2},
    {"capacity_factor": None, "top_k": 2, "router": "sigmoid", "expert_groups": 2,
     "groups_per_token": 1},
], ids=["switch", "deepseek-v3", "node-limited"])
def test_one_rank_ep_block_is_the_serial_block_bit_for_bit(more: dict) -> None:
    """On one rank the all-to-alls are copies: the EP GPT's loss and every gradient equal
    the serial GPT's exactly (the same functions, the same order)."""
    from minipar.nn import executor
    from minipar.parallel.expert_parallel.engine import EPHooks, ExpertParallel

    spec = RunSpec(experts=4, top_k=2, batch=4, steps=1).with_(**more)
    grid = Grid(MPI.COMM_SELF)
    eng = ExpertParallel(grid, spec)
    params = spec.initial_params()
    x, y = spec.global_batch(0)
    loss_s, grads_s = GPT(spec.config()).loss_and_grads(params, x, y)
    hooks = EPHooks(params, {k: np.zeros_like(v) for k, v in params.items()})
    loss_p = executor.loss_and_grads(eng.units, hooks, x, y)
    dropped = sum(s["dropped"] for s in hooks.stats)
    assert loss_p == loss_s and (dropped > 0) == (spec.capacity_factor is not None)
    for k, g in grads_s.items():
        assert np.array_equal(hooks.grad_views[k], g), k
    grid.free()


def _cli(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return run_minipar("run", "ep", *args, env=env)


def test_minipar_run_ep_json_has_the_routing_and_the_bytes_per_axis() -> None:
    proc = _cli("-n", "4", "--experts", "4", "--top-k", "2", "--capacity-factor", "1.0",
                "--ep", "2", "--steps", "2", "--json")
    assert proc.returncode == 0, proc.stderr[-2000:]
    s = json.loads(proc.stdout)
    assert s["verdict"]["status"] == "equal" and (s["ep"], s["edp"]) == (2, 2)
    assert len(s["tokens_per_expert"]) == 2 and all(len(b) == 4 for b in s["tokens_per_expert"])
    assert len(s["dropped"]) == 2 and all(d > 0 for d in s["dropped"])
    # kept + dropped = every assignment (B = 10 rows x T = 8 tokens x k = 2, two MoE blocks)
    assert sum(map(sum, s["tokens_per_expert"])) + s["dropped"][-1] == s["assignments_per_step"]
    assert s["bytes_by_axis_per_rank"] == s["bytes_formula_by_axis_per_rank"]
    assert s["bytes_sent_per_rank"] == s["bytes_exact_per_rank"]
    assert s["capacity_per_rank"] == [12, 12, 8, 8]  # k = 2 x (3, 3, 2, 2 rows of 8 tokens) / E 4
    # the all-to-all data: exact for the capacities that ran, and why the plan's padded
    # figure (one C for the whole ep group) differs when a group's C differ
    exact, plan = s["alltoall_data_bytes_per_rank"], s["alltoall_plan_bytes_per_rank"]
    data = next(n for n in s["notes"] if "all-to-all data per rank per step" in n)
    assert ", ".join(f"{b:,.0f}" for b in exact) in data and "C_r = [12, 12, 8, 8]" in data
    padded = next(n for n in s["notes"] if "padded-buffer figure" in n)
    assert ", ".join(f"{b:,.0f}" for b in plan) in padded
    assert "it assumes every rank of the ep group has the same C" in padded
    assert (", as here: it equals the exact figure" in padded) == (exact == plan), padded
    if exact != plan:
        assert "(here [3, 3, 2, 2] rows per rank)" in padded, padded
    # each rank holds the dense parameters and E/ep = 2 of the 4 experts (float64 AdamW:
    # 32 B per parameter), less than a full replica
    d, f = 16, 64
    expert = d * f + f + f * d + d
    psi = GPT(RunSpec(experts=4).config()).n_params()
    assert s["model_state_bytes_per_rank"] == [s["model_state_formula"]] * 4
    assert s["model_state_formula"] == 32 * (psi - 2 * 2 * expert)


@pytest.mark.parametrize("args,option", [
    (["-n", "2", "--experts", "0"], "--experts must be a positive integer"),
    (["-n", "4", "--experts", "4", "--ep", "3"], "--ep 3 must divide the 4 data-parallel"),
    (["-n", "4", "--experts", "6"], "--ep 4 (default: -n) does not divide --experts 6"),
    (["-n", "2", "--experts", "4", "--top-k", "5"], "--top-k 5 exceeds --experts 4"),
    (["-n", "2", "--experts", "4", "--router", "sigmoid"],
     "--router sigmoid needs --top-k >= 2: its gate is the chosen score over"),
    (["-n", "2", "--experts", "4", "--load-balance", "loss-free", "--bias-update-rate", "0"],
     "--bias-update-rate must be > 0, got 0.0"),
    (["-n", "2", "--experts", "4", "--expert-groups", "2", "--groups-per-token", "3"],
     "--groups-per-token must be an integer from 1 to 2"),
    (["-n", "2", "--experts", "6", "--ep", "2", "--expert-groups", "4"],
     "--expert-groups 4 does not divide --experts 6"),
    (["-n", "2", "--experts", "8", "--top-k", "3", "--expert-groups", "4"],
     "--top-k 3 exceeds the 2 experts of --groups-per-token 1"),
    (["-n", "4", "--experts", "12", "--expert-groups", "3"], "--expert-groups 3 and --ep 4"),
    (["-n", "2", "--experts", "4", "--capacity-factor", "nonsense"], "--capacity-factor"),
])
def test_minipar_run_ep_refuses_bad_input_before_mpi(args: list[str], option: str,
                                                     tmp_path: Path) -> None:
    line = refused_before_mpi(["run", "ep", *args], tmp_path).stderr.strip()
    assert line.startswith("minipar run: ") and option in line, line


def _arrays(tree: object) -> list[np.ndarray]:
    if isinstance(tree, np.ndarray):
        return [tree]
    if isinstance(tree, dict):
        return [a for v in tree.values() for a in _arrays(v)]
    if isinstance(tree, (list, tuple)):
        return [a for v in tree for a in _arrays(v)]
    return []


def test_saved_holds_activations_only_and_a_rank_holds_only_its_experts() -> None:
    """No array the EP units save shares memory with the rank's flat parameter buffer
    (the contract of minipar.nn: backward is handed its parameters again)."""
    from minipar.nn import executor
    from minipar.parallel.expert_parallel.engine import EPHooks, ExpertParallel

    spec = RunSpec(experts=4, top_k=2, capacity_factor=1.0, batch=4, steps=1)
    grid = Grid(MPI.COMM_SELF)
    eng = ExpertParallel(grid, spec)
    views = eng.states.param_views()
    _, kept = executor.forward(eng.units, EPHooks(views, {}), spec.global_batch(0)[0])
    saved = [a for k in kept for a in _arrays(k)]
    assert len(saved) > 50
    assert not any(np.shares_memory(a, eng.states.params) for a in saved)
    # one rank of ep = 1 holds every expert; its buffer is dense first, then the experts
    names = list(eng.layout.names)
    first_expert = next(i for i, n in enumerate(names) if ".moe.experts." in n)
    assert all(".moe.experts." in n for n in names[first_expert:])
    assert eng.n_dense == eng.layout.offsets[first_expert]
    grid.free()
