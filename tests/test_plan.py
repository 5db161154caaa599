"""minipar.plan: the papers' numbers, reproduced, and the ``minipar plan`` verb.

Each expected value is either printed in the paper (ZeRO's 7.5 B / N = 64
example, the 2 TB seed figure) or worked out by hand in the comment next to
it from the formula in docs/REFERENCES.md, never computed by the code under test.
"""

from __future__ import annotations

import json
import math
import re
import subprocess
import sys

import pytest

from minipar import plan as P
from minipar.cli.plan import main as plan_main


# ----------------------------------------------------------------- collectives
def test_ring_and_ring_halves():
    assert P.ring_allreduce_volume(800, 4) == 1200.0          # 2·3/4·800
    assert P.ring_allreduce_volume(800, 1) == 0.0
    assert P.reduce_scatter_volume(800, 4) == 600.0           # 3/4·800
    assert P.all_gather_volume(800, 4) == 600.0
    assert P.all_to_all_volume(800, 4) == 600.0
    assert P.ring_allreduce_volume(800, 4) == P.reduce_scatter_volume(800, 4) + P.all_gather_volume(800, 4)
    assert P.ring_allreduce_steps(4) == 6
    assert P.parameter_server_bytes_at_server(800, 4) == 3200.0
    assert P.parameter_server_bytes_per_worker(800) == 800.0


def test_one_meaning_per_name():
    """plan's *_volume(S, N) are the papers' formulas; collectives' *_bytes(n, itemsize, N, rank)
    the exact counts: no public name means both."""
    import minipar.collectives as C

    assert set(P.__all__) & set(C.__all__) == set()
    # the formula and the exact count agree where the formula is exact (N divides n)
    assert P.ring_allreduce_volume(800, 4) == C.ring_allreduce_bytes_sent(200, 4, 4, 3)
    assert P.reduce_scatter_volume(800, 4) == C.reduce_scatter_bytes(200, 4, 4, 1)[0]


@pytest.mark.parametrize("op, N, factor", [
    ("all_reduce", 8, 1.75), ("allreduce", 8, 1.75), ("reduce_scatter", 8, 0.875),
    ("all_gather", 4, 0.75), ("all_to_all", 2, 0.5), ("broadcast", 8, 1.0), ("reduce", 8, 1.0),
])
def test_busbw_factors(op, N, factor):
    assert P.busbw_factor(op, N) == factor


def test_busbw_from_time():
    assert P.algbw(1e9, 0.5) == 2e9
    assert P.busbw(1e9, 0.5, "all_reduce", 4) == 3e9         # 2e9 · 2·3/4


def test_seed_figure_trillion_parameters_2_tb():
    g = P.gradient_sync(1e12, 64)
    assert g["payload"] == 2e12                               # 10¹² × 2 bytes = 2 TB
    assert g["ring_per_rank"] == pytest.approx(2 * 63 / 64 * 2e12, rel=1e-15)
    assert g["ps_server_in"] == g["ps_server_out"] == 64 * 2e12
    assert g["ps_per_worker"] == 2e12


# ------------------------------------------------------------------------ ZeRO
def test_zero_paper_example_7_5b_on_64():
    # Rajbhandari et al. 2019, Figure 1: 120 GB, 31.4 GB, 16.6 GB, 1.9 GB
    got = [round(P.zero_model_state_bytes(7.5e9, 64, s) / 1e9, 1) for s in range(4)]
    assert got == [120.0, 31.4, 16.6, 1.9]
    assert P.zero_model_state_bytes(7.5e9, 64, 3) == 1.875e9
    table = P.zero_table(7.5e9, 64)
    assert [r["name"] for r in table] == ["DP", "P_os", "P_os+g", "P_os+g+p"]
    assert [round(r["GB"], 1) for r in table] == [120.0, 31.4, 16.6, 1.9]
    assert table[0]["GiB"] == 120e9 / 2**30


def test_zero_formulas_by_part():
    b = P.zero_model_state_breakdown(1000, 4, 2)
    assert b == {"params": 2000.0, "grads": 500.0, "optimizer": 3000.0, "total": 5500.0}
    assert P.zero_model_state_bytes(1000, 4, 1) == 4000 + 12000 / 4
    assert P.zero_model_state_bytes(1000, 4, 3, K=8) == (2 + 2 + 8) * 1000 / 4
    assert P.mixed_precision_bytes_per_param() == {"params": 2, "grads": 2, "optimizer": 12, "total": 16}


def test_zero_communication_2psi_and_3psi():
    assert [P.zero_comm_elements(100, s) for s in range(4)] == [200, 200, 200, 300]
    ring = P.zero_comm_bytes_per_rank(100, 4, 0)
    assert ring == 2 * 3 / 4 * 100 * 2                       # = ring all-reduce of 2Ψ bytes
    assert P.zero_comm_bytes_per_rank(100, 4, 3) == 1.5 * ring


def test_zero_offload_sides():
    o = P.zero_offload_bytes(1e9)
    assert o["device_params"] == o["device_total"] == 2e9
    assert o["device_grads_transient"] == 2e9
    assert o["host_total"] == 14e9                            # 12 (fp32 + m + v) + 2 (grads)
    assert P.zero_offload_bytes(1e9, N=4, host_grad_bytes=4)["host_total"] == 16e9 / 4
    assert P.offload_pcie_bytes_per_step(1e9, 4) == {"to_host": 5e8, "to_device": 5e8}


# ------------------------------------------------------------------- GPT count
def test_gpt_param_count_by_hand():
    # d = 4, V = 10, T = 8, d_ff = 16, 2 layers
    # tok_emb 40, pos_emb 32; block: ln1 8 + w_qkv 48 + b_qkv 12 + w_out 16 + b_out 4
    #   + ln2 8 + w_in 64 + b_in 16 + w_out 64 + b_out 4 = 244; ln_f 8, lm_head 40
    assert P.gpt_param_count(2, 4, 10, 8) == 40 + 32 + 2 * 244 + 8 + 40
    # MoE every 2nd block (block 1), E = 3: router 12 + 3 experts of 148 replace the 148 MLP
    assert P.moe_block_indices(2, 2) == [1]
    assert P.gpt_param_count(2, 4, 10, 8, n_experts=3, moe_every=2) == 608 - 148 + 12 + 3 * 148
    assert P.gpt_active_param_count(2, 4, 10, 8, n_experts=3, moe_every=2, top_k=1) == 608 + 12
    assert P.gpt_active_param_count(2, 4, 10, 8, n_experts=3, moe_every=2, top_k=2) == 608 + 12 + 148
    # d_ff = 8: block = ln1 8 + attn (48 + 12 + 16 + 4) + ln2 8 + mlp (32 + 8 + 32 + 4) = 172
    assert P.gpt_param_count(3, 4, 10, 8, d_ff=8) == 40 + 32 + 3 * 172 + 48


def test_gpt_param_count_gpt2_small_untied():
    # GPT-2 small, 124,439,808 with the head tied; minipar's head is untied: + 768·50257
    assert P.gpt_param_count(12, 768, 50257, 1024) == 124_439_808 + 768 * 50257



@pytest.mark.parametrize("kw", [
    {}, {"n_layer": 3, "d_model": 16, "n_head": 2, "vocab_size": 11, "block_size": 7, "d_ff": 24},
    {"n_layer": 5, "d_model": 8, "n_head": 2, "n_experts": 3, "moe_every": 2, "top_k": 2},
    {"n_layer": 4, "d_model": 8, "n_head": 2, "n_experts": 4, "moe_every": 1},
])
def test_gpt_param_count_matches_the_serial_model(kw):
    from minipar.nn.gpt import GPTConfig, param_shapes

    c = GPTConfig(**kw)
    shapes = param_shapes(c)
    assert P.gpt_param_count(c.n_layer, c.d_model, c.vocab_size, c.block_size, c.d_ff,
                             c.n_experts, c.moe_every) == sum(math.prod(s) for s in shapes.values())
    moe = sorted({int(k.split(".")[1]) for k in shapes if ".moe." in k})
    assert moe == (P.moe_block_indices(c.n_layer, c.moe_every) if c.n_experts else [])


def test_expert_capacity_matches_the_serial_model():
    from minipar.nn.moe import expert_capacity

    for tokens in range(1, 130):
        for E in (1, 2, 3, 5, 8):
            for cf in (0.5, 1.0, 1.1, 1.25, 2.0):
                assert P.expert_capacity(tokens, E, cf) == expert_capacity(tokens, E, cf)

# ---------------------------------------------------------- tensor / sequence
def test_tensor_parallel_bytes():
    assert P.tp_allreduces_per_layer() == 4 and P.tp_allreduces_per_layer(backward=False) == 2
    assert P.tp_allreduce_bytes(2, 4, 8) == 128                # b·s·h·2
    assert P.tp_bytes_per_rank_per_layer(2, 4, 8, 4) == 4 * 2 * 3 / 4 * 128
    assert P.tp_bytes_per_rank(3, 2, 4, 8, 4) == 3 * 768
    assert P.tp_bytes_per_rank_per_layer(2, 4, 8, 1) == 0.0


def test_korthikanti_small_config_by_hand():
    # s = 4, b = 2, h = 8, a = 2, t = 2: sbh = 64, 5as/h = 5
    hand = {"none": 64 * 39, "tp": 64 * (10 + 12 + 2.5), "tp+sp": 64 * (17 + 2.5),
            "tp+selective": 64 * 22, "tp+sp+selective": 64 * 17, "full": 128}
    for mode, want in hand.items():
        assert P.activation_bytes_per_layer(4, 2, 8, 2, 2, mode) == want, mode
    assert P.activation_bytes(3, 4, 2, 8, 2, 2, "tp+sp") == 3 * 1248
    rows = P.activation_table(4, 2, 8, 2, 2, n_layer=3)
    assert [r["mode"] for r in rows] == list(P.ACTIVATION_MODES)
    # with t = 1 tensor and sequence parallelism change nothing
    assert len({P.activation_bytes_per_layer(4, 2, 8, 2, 1, m) for m in ("none", "tp", "tp+sp")}) == 1


def test_ulysses_vs_megatron_sp_and_ring_attention():
    assert P.ulysses_alltoall_elements_per_link(1024, 64, 8) == 4 * 1024 * 64 / 8
    assert P.megatron_sp_elements_per_link(1024, 64, 8) == 4 * 1024 * 64
    # N and P grow together: Ulysses constant
    assert P.ulysses_alltoall_elements_per_link(2048, 64, 16) == P.ulysses_alltoall_elements_per_link(1024, 64, 8)
    assert P.ring_attention_bytes_per_rank(8, 1, 4, 4) == 3 * 2 * 1 * 2 * 4 * 2   # (P-1)·2·b·(s/P)·h·2


# -------------------------------------------------------------------- pipeline
@pytest.mark.parametrize("K, M, want", [(4, 4, 3 / 7), (4, 16, 3 / 19), (1, 8, 0.0), (8, 1, 7 / 8)])
def test_gpipe_bubble(K, M, want):
    assert P.gpipe_bubble_fraction(K, M) == want


def test_1f1b_and_interleaved_bubble():
    assert P.bubble_time_ratio(4, 8) == 3 / 8
    assert P.bubble_time_ratio(4, 8, v=2) == 3 / 16
    assert P.bubble_fraction(4, 8) == pytest.approx(P.gpipe_bubble_fraction(4, 8), rel=1e-15)
    assert P.peak_microbatches_in_flight(4, 16, "1f1b") == 4
    assert P.peak_microbatches_in_flight(4, 16, "gpipe") == 16
    assert P.peak_microbatches_in_flight(4, 2, "1f1b") == 2
    assert P.pipeline_p2p_bytes_per_rank(1, 4, 8, m=3, v=2) == 2 * 3 * 2 * 32 * 2


def test_gpipe_rematerialisation_memory():
    # N = 8 samples, L = 4 layers, K = 2 partitions, M = 4 micro-batches
    assert P.gpipe_activation_bytes(8, 4, 2, 4, 10, 1) == 8 * 1 + 2 * 2 * 10
    assert P.gpipe_activation_bytes(8, 4, 2, 4, 10, 1, rematerialize=False) == 2 * 8 * 10


# --------------------------------------------------------------- checkpointing
def test_chen_sqrt_n_checkpointing():
    assert P.checkpoint_memory(16, 4) == 8                   # 16/4 checkpoints + 4 live
    assert P.checkpoint_memory(10, 3, layer_bytes=2.0) == (4 + 3) * 2.0
    assert P.optimal_checkpoint_interval(16) == 4
    assert P.optimal_checkpoint_interval(100) == 10
    assert P.recompute_forward_layers(16, 4) == 12
    assert P.recompute_forward_layers(10, 3) == 9            # last segment is 1 layer
    assert P.recompute_forward_layers(8, 8) == 0


# ------------------------------------------------------------------------- MoE
def test_expert_capacity_and_aux_loss():
    assert P.expert_capacity(8, 4, 1.25) == 3                # ceil(2.5)
    assert P.expert_capacity(8, 4) == 2
    assert P.expert_capacity(50, 5, 1.1) == 11               # float product 11.000000000000002
    assert P.load_balancing_loss([0.25] * 4, [0.25] * 4) == pytest.approx(0.01, rel=1e-15)
    assert P.load_balancing_loss([1, 0, 0, 0], [1, 0, 0, 0]) == 0.04
    assert P.load_balancing_loss([0.5, 0.5], [0.9, 0.1], alpha=1.0) == 2 * (0.45 + 0.05)


def test_moe_alltoall_bytes():
    # 8 tokens, d = 4, ep = 2, top-2, 16-bit: buffer 8·2·4·2 = 128, half leaves, ×2 all-to-alls
    assert P.moe_alltoall_bytes_per_rank(8, 4, 2, top_k=2) == 128.0
    assert P.moe_alltoall_bytes_per_rank(8, 4, 2, top_k=2, backward=True) == 256.0
    # padded: E = 4, C = ceil(16/4·1.0) = 4, buffer 4·4·4·2 = 128
    assert P.moe_alltoall_bytes_per_rank(8, 4, 2, top_k=2, n_experts=4, capacity_factor=1.0) == 128.0


# -------------------------------------------------------------------------- 3D
def test_3d_layout():
    P.check_3d_layout(8, 2, 2, 2)
    with pytest.raises(ValueError, match="does not equal"):
        P.check_3d_layout(8, 2, 2, 3)
    assert P.model_state_bytes_3d(8e9, 2, 2, 2)["total"] == 32e9        # 2e9 per rank × 16
    assert P.model_state_bytes_3d(8e9, 2, 2, 2, zero_stage=3, n=8)["total"] == 16e9
    with pytest.raises(ValueError):
        P.model_state_bytes_3d(8e9, 2, 2, 2, n=16)


# ----------------------------------------------------------------- bad inputs
@pytest.mark.parametrize("call", [
    lambda: P.ring_allreduce_volume(-1, 4),
    lambda: P.ring_allreduce_volume(10, 0),
    lambda: P.ring_allreduce_volume(10, 2.5),
    lambda: P.ring_allreduce_volume(float("nan"), 2),
    lambda: P.busbw_factor("gather", 4),
    lambda: P.algbw(10, 0),
    lambda: P.zero_model_state_bytes(0, 4, 1),
    lambda: P.zero_model_state_bytes(1e9, 4, 4),
    lambda: P.zero_model_state_bytes(1e9, 4, -1),
    lambda: P.zero_model_state_bytes(1e9, 4, True),
    lambda: P.zero_model_state_bytes(1e9, 0, 1),
    lambda: P.zero_comm_elements(1e9, 5),
    lambda: P.gpt_param_count(0, 4, 10, 8),
    lambda: P.gpt_param_count(2, 4, 10, 8, n_experts=-1),
    lambda: P.gpt_active_param_count(2, 4, 10, 8, n_experts=2, top_k=3),
    lambda: P.activation_bytes_per_layer(4, 2, 8, 2, 0),
    lambda: P.activation_bytes_per_layer(4, 2, 8, 2, 2, "sp"),
    lambda: P.gpipe_bubble_fraction(0, 4),
    lambda: P.bubble_time_ratio(4, 8, v=0),
    lambda: P.peak_microbatches_in_flight(4, 8, "zb"),
    lambda: P.gpipe_activation_bytes(4, 4, 2, 8, 1, 1),
    lambda: P.checkpoint_memory(4, 5),
    lambda: P.expert_capacity(8, 0),
    lambda: P.expert_capacity(8, 4, 0.0),
    lambda: P.load_balancing_loss([0.5, 0.5], [1.0]),
    lambda: P.load_balancing_loss([], []),
    lambda: P.moe_alltoall_bytes_per_rank(8, 4, 3, n_experts=4, capacity_factor=1.0),
    lambda: P.moe_alltoall_bytes_per_rank(8, 4, 2, capacity_factor=1.0),
    lambda: P.tp_allreduce_bytes(2, 4, 8, bytes_per_elem=0),
])
def test_bad_sizes_raise_value_error(call):
    with pytest.raises(ValueError):
        call()


# ------------------------------------------------------------------- the verb
def test_cli_text_paper_example(capsys):
    assert plan_main(["--params", "7.5e9", "-n", "64"]) == 0
    out = capsys.readouterr().out
    rows = [line.split() for line in out.splitlines() if line.strip()[:1] in "0123"]
    gb = {r[0]: r[-5] for r in rows if len(r) >= 6 and r[1].startswith(("DP", "P_os"))}
    assert gb == {"0": "120.0", "1": "31.4", "2": "16.6", "3": "1.9"}
    assert "ring all-reduce" in out and "parameter server" in out and "960 GB" in out


def test_cli_json_and_gpt(capsys):
    argv = ["--gpt", "2,64,100,16", "-n", "4", "--heads", "2", "--tp", "2", "--batch", "3", "--json"]
    assert plan_main(argv) == 0
    d = json.loads(capsys.readouterr().out)
    assert d["params"] == P.gpt_param_count(2, 64, 100, 16)
    assert [r["bytes"] for r in d["zero"]] == [P.zero_model_state_bytes(d["params"], 4, s) for s in range(4)]
    acts = d["activations"]
    assert (acts["s"], acts["b"], acts["a"], acts["t"]) == (16, 3, 2, 2)
    assert acts["rows"][0]["per_layer"] == 16 * 3 * 64 * (34 + 5 * 2 * 16 / 64)
    assert d["gradient_sync"]["payload"] == 2 * d["params"]
    assert plan_main(["--params", "1T", "-n", "8", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["gradient_sync"]["payload"] == 2e12
    assert plan_main(["--gpt", "2,64,100,16", "-n", "4"]) == 0
    assert "activation memory" in capsys.readouterr().out


def test_cli_absurd_sizes_print_readably(capsys):
    """1e30 parameters, 1e12 ranks: e-notation, never inf or a 30-digit number (bad ones: test_bad_input)."""
    assert plan_main(["--params", "1e30", "-n", "4"]) == 0
    out = capsys.readouterr().out
    assert "Ψ = 1.00e+30 parameters" in out and "3.00e+30 B" in out
    assert plan_main(["--gpt", "1000000,1000000,1000000,1000000", "-n", "1000000000000",
                   "--seq", "1000000000000", "--batch", "1000000000000"]) == 0
    out += capsys.readouterr().out
    assert "inf" not in out and "nan" not in out
    assert not re.search(r"\d{14}", out.replace(",", ""))  # 1e12 (13 digits) is the longest


def test_cli_default_heads_divide_d_model(capsys):
    from minipar.cli.plan_sizes import default_heads

    assert [default_heads(d) for d in (32, 64, 200, 768, 1600)] == [1, 1, 2, 12, 25]
    assert plan_main(["--gpt", "2,200,100,16", "-n", "4", "--json"]) == 0  # d/64 = 3 heads would not divide
    assert json.loads(capsys.readouterr().out)["activations"]["a"] == 2


def test_cli_process_and_light_import():
    proc = subprocess.run([sys.executable, "-m", "minipar.cli", "plan", "--params", "7.5e9", "-n", "0"],
                          capture_output=True, text=True, timeout=60, check=False)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert proc.stderr == "minipar plan: -n/--ranks must be an integer from 1 to 1e12, got 0\n"
    code = "import sys, minipar.plan; print('numpy' in sys.modules)"
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=False)
    assert proc.stdout.strip() == "False"
    assert math.isclose(P.gradient_sync(1e12, 2)["ring_per_rank"], 2e12)


def test_docs_page_lists_every_function():
    from pathlib import Path

    page = (Path(__file__).resolve().parents[1] / "docs" / "plan.md").read_text(encoding="utf-8")
    functions = [n for n in P.__all__ if callable(getattr(P, n)) and n != "main"]
    assert [n for n in functions if f"`{n}" not in page and f" {n}`" not in page
            and f"{n}(" not in page] == []


def test_deepseek_experts_in_the_plan() -> None:
    """Shared experts and the experts' width counted as the GPT holds them; node-limited
    routing bounds a token's dispatch bytes across groups by min(k, M) vectors."""
    from minipar.nn import GPT, GPTConfig

    cfg = GPTConfig(vocab_size=256, block_size=32, n_layer=2, n_head=2, d_model=16,
                    n_experts=8, top_k=4, shared_experts=2, expert_width=24, moe_every=2)
    kw = dict(n_experts=8, moe_every=2, shared_experts=2, expert_width=24)
    assert P.gpt_param_count(2, 16, 256, 32, **kw) == GPT(cfg).n_params()
    expert = 16 * 24 + 24 + 24 * 16 + 16
    assert P.gpt_param_breakdown(2, 16, 256, 32, **kw)["shared"] == 2 * expert
    assert (P.gpt_param_count(2, 16, 256, 32, **kw)
            - P.gpt_active_param_count(2, 16, 256, 32, top_k=4, **kw)) == 4 * expert
    b = P.node_limited_dispatch_bytes(10, 16, 8, groups=8, per_token=4, bytes_per_elem=2)
    assert b == {"per_assignment": 10 * 8 * 32, "per_group": 10 * 4 * 32,
                 "per_group_unlimited": 10 * 8 * 32}
    with pytest.raises(ValueError, match="per_token=5 exceeds groups=4"):
        P.node_limited_dispatch_bytes(10, 16, 8, groups=4, per_token=5)
