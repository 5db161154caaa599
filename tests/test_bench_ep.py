"""`minipar bench ep` at a tiny size, the traffic measurement notebook 08 uses, and the
capacity-factor study: the structure and the exact figures, never a timing.

No speed is asserted (the machine is shared); the step times only have to exist.
The study's drop rates are checked against what capacity means: a higher capacity
factor never drops more, C = ceil(N/E x cf), and at cf 0.5 (E x C = N/2 slots) at
least half of the assignments are dropped.  The drop rates themselves (Switch's
"typically < 1%" at cf 1.25 once balanced) are measured, not asserted: they are in
docs/PERFORMANCE.md ("Expert parallelism") and notebook 08.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import numpy as np
import pytest
from conftest import refused_before_mpi, run_minipar

TINY = ["-n", "2", "--d-model", "16", "--layers", "1", "--heads", "2", "--seq", "8",
        "--batch", "4", "--vocab", "16", "--steps", "1"]


def _bench(*args: str) -> subprocess.CompletedProcess[str]:
    return run_minipar("bench", "ep", *args, timeout=180)


def test_bench_ep_times_four_runs_and_prints_the_capacity_table() -> None:
    proc = _bench(*TINY, "--capacity-steps", "2", "--json")
    assert proc.returncode == 0, proc.stderr[-2000:]
    out = json.loads(proc.stdout)
    assert set(out["seconds"]) == {"MoE, 1 rank", "dense, 1 rank", "MoE, EP on 2 ranks",
                                   "MoE, DP on 2 ranks"}
    assert all(s > 0 for s in out["seconds"].values()) and out["speedup"] > 0
    assert out["ep_vs_dp"] > 0 and out["cpu_ep_vs_dp"] > 0
    assert set(out["cpu_seconds"]) == set(out["seconds"]) and out["cpu_speedup"] > 0
    # E = 4 top-1: a token uses one expert, the shape of the dense MLP, plus the router
    assert out["active_psi"]["MoE"] == out["psi"]["dense"] + 16 * 4
    cap = out["capacity"]
    assert [r["capacity_factor"] for r in cap["before"]] == [0.5, 0.75, 1.0, 1.25, 1.5, 2.0]
    assert set(cap["after"]) == {"0.0", "0.01", "0.1"}
    for table in [cap["before"], *cap["after"].values()]:
        rates = [r["drop_rate"] for r in table]
        assert rates == sorted(rates, reverse=True) and rates[0] >= 0.5 - 1e-12
        assert [r["capacity"] for r in table] == [64, 96, 128, 160, 192, 256]  # 512 tokens, E 4


def test_the_printed_view_names_the_speed_up() -> None:
    proc = _bench(*TINY, "--capacity-steps", "0")
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "speed-up of expert parallelism on 2 ranks" in proc.stdout
    assert "MoE, EP on 2 ranks" in proc.stdout and "cf 1.25" not in proc.stdout
    assert "EP against pure data parallelism" in proc.stdout
    assert "ideal 2x on 2 ranks" in proc.stdout and "target" not in proc.stdout


def test_measure_traffic_counts_what_the_formulas_say() -> None:
    from minipar.bench.ep import measure_traffic

    out = measure_traffic(2, experts=4, top_k=1, capacity_factor=1.0, d_model=16, seq=8)
    assert out["ranks"] == 2 and out["ep"] == 2
    for r in out["per_rank"]:
        assert r["bytes_by_axis"] == r["bytes_formula"]
        assert r["alltoall_data_bytes"] == r["plan_formula"] > 0  # top-1, equal C
        assert sum(map(sum, r["tokens_per_expert"])) + r["dropped"] == 2 * 4 * 8


@pytest.mark.parametrize("args,option", [
    (["--experts", "3"], "-n 2 does not divide --experts 3"),
    (["--capacity-factor", "0"], "--capacity-factor"),
    (["--top-k", "3"], "--top-k"),
    (["-n", "0"], "-n/--ranks"), (["--batch", "1"], "--batch"),
])
def test_bench_ep_refuses_bad_options_in_one_line(args: list[str], option: str,
                                                 tmp_path: Path) -> None:
    line = refused_before_mpi(["bench", "ep", *TINY, *args], tmp_path).stderr.strip()
    assert line.startswith("minipar bench ep: ") and option in line, line


def test_routing_table_adds_up() -> None:
    """Kept + dropped = every assignment in each block; C = ceil(N/E x cf); more capacity
    never drops more; a dense model is refused."""
    from minipar.nn import GPT, GPTConfig
    from minipar.nn.moe_steps import expert_capacity
    from minipar.parallel.expert_parallel.measure import routing_table

    cfg = GPTConfig(vocab_size=10, block_size=8, n_layer=2, n_head=2, d_model=16,
                    n_experts=4, top_k=2)
    tokens = np.arange(6 * 8).reshape(6, 8) % 10
    table = routing_table(cfg, GPT(cfg).init(0), tokens)
    for row in table:
        assert row["capacity"] == expert_capacity(2 * 48, 4, row["capacity_factor"])  # top-2
        assert row["assignments"] == 96 and len(row["routed"]) == 2
        kept = sum(map(sum, row["tokens_per_expert"]))
        assert kept + row["dropped"] == 2 * 96
        assert all(sum(r) == 48 for r in row["routed"])  # first choices: one per token
        assert row["drop_rate"] == row["dropped"] / (2 * 96) and row["imbalance"] >= 1.0
    rates = [r["drop_rate"] for r in table]
    assert rates == sorted(rates, reverse=True)
    with pytest.raises(ValueError, match="mixture of experts"):
        routing_table(GPTConfig(), GPT(GPTConfig()).init(0), tokens)


def test_the_balance_table_reads_the_study() -> None:
    """``minipar bench ep --balance``'s table: MaxVio over the first and last tenth of the
    steps, the drop rate of the assignments, one row per configuration."""
    from minipar.bench.ep import BALANCE_RUNS, format_balance

    runs = [{"load_balance": lb, "capacity_factor": cf, "max_vio": [2.0] * 10 + [0.5] * 90,
             "val_loss": 2.5, "dropped": 0 if cf is None else 5, "assignments": 100,
             "alltoall_bytes_per_step": 1000.0, "step_seconds": 0.1}
            for lb, cf in BALANCE_RUNS]
    lines = format_balance({"runs": runs}).splitlines()
    assert len(lines) == 1 + len(BALANCE_RUNS)
    assert lines[1].split()[:6] == ["aux", "1.25", "2.000", "0.500", "2.5000", "5.00%"]
    assert lines[4].split()[:2] == ["aux", "dropless"] and "0.00%" in lines[4]
