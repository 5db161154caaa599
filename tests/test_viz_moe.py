"""minipar.viz.moe: the layer costs it measures, and every figure draws from plain data."""

from __future__ import annotations

import pytest
from matplotlib.figure import Figure

from minipar.plan.model import gpt_active_param_count, gpt_param_count
from minipar.viz import moe as vm


def test_layer_costs_count_sparse_flops_and_parameters():
    d, E = 16, 4
    dense, moe, wide = vm.layer_costs(tokens=64, d_model=d, n_experts=E, top_k=1,
                                      capacity_factor=2.0, repeats=1)
    expert = 2 * d * 4 * d + 4 * d + d
    assert dense["params"] == dense["active"] == expert
    assert moe["params"] == E * expert + d * E and moe["active"] == expert + d * E
    assert wide["params"] == wide["active"] == 2 * d * 4 * d * E + 4 * d * E + d
    # top-1: at most one expert row per token, plus the router
    assert 2 * d * E < moe["flops"] <= dense["flops"] + 2 * d * E
    assert wide["flops"] == E * dense["flops"]
    assert all(r["seconds"] > 0 for r in (dense, moe, wide))


def test_layer_costs_top2_runs_two_experts_per_kept_token():
    d, E = 16, 4
    _, moe, _ = vm.layer_costs(tokens=64, d_model=d, n_experts=E, top_k=2,
                               capacity_factor=4.0, repeats=1)  # capacity for every assignment
    assert moe["flops"] == 2 * d * E + 2 * (4 * d * 4 * d)


def test_figures_draw_from_plain_data():
    rows = [{"label": f"E={E}", "total": gpt_param_count(2, 32, 10, 16, n_experts=E),
             "active": gpt_active_param_count(2, 32, 10, 16, n_experts=E, top_k=1)}
            for E in (1, 4, 16)]
    assert isinstance(vm.sparsity(rows), Figure)
    costs = [{"name": n, "params": p, "flops": f, "seconds": s}
             for n, p, f, s in (("a", 1, 2, 1e-6), ("b", 4, 2, 2e-6))]
    assert isinstance(vm.compute_per_token(costs), Figure)
    table = [{"capacity_factor": cf, "drop_rate": r} for cf, r in ((0.5, 0.5), (1.0, 0.1),
                                                                  (2.0, 0.0))]
    assert isinstance(vm.drop_curve({"before": table, "after": table}), Figure)
    ranks = [{"bytes_by_axis": {"ep": 1000.0}, "ep_bytes_formula": 1000}] * 2
    assert isinstance(vm.traffic(ranks), Figure)
    for bad in (lambda: vm.sparsity([]), lambda: vm.drop_curve({}), lambda: vm.traffic([]),
                lambda: vm.compute_per_token([])):
        with pytest.raises(ValueError):
            bad()


def test_moe_stats_from_a_routing_table_row():
    row = {"capacity_factor": 1.0, "capacity": 3, "assignments": 8,
           "routed": [[4, 2, 1, 1], [2, 2, 2, 2]], "tokens_per_expert": [[3, 2, 1, 1], [2, 2, 2, 2]]}
    stats = vm.moe_stats(row)
    assert [s["dropped"] for s in stats] == [1, 0]
    assert stats[0] == {"block": 0, "routed": [4, 2, 1, 1], "tokens_per_expert": [3, 2, 1, 1],
                        "capacity": 3, "dropped": 1}
    from minipar.viz.model import expert_load

    assert isinstance(expert_load({"before": stats, "after": stats}), Figure)
