"""Tensor parallelism (Megatron): layers, the GPT and training against the serial run.

Each world size 1-4 is ONE launch of tests/mpi/tp_check.py: ColumnParallelLinear,
RowParallelLinear, VocabParallelEmbedding and the vocab-parallel cross-entropy against
the serial layers (float64); the GPT's logits, loss and every gradient for TP at t = N
(3 heads on 3 ranks), TP+SP on 2 and 4, a MoE GPT under TP; counted: exactly 2
all-reduces forward and 2 backward per block, bytes per rank = the ring formula on
b·s·h elements (SP's pairs: the same bytes); several AdamW steps judged by the shared
verdict (TP, TP+SP, TP 2 x DP 2, MoE); bad input one line on every rank, no message.
Here, in one process: slicing round trips, the slicing table, the error sentences, and
``minipar run tp | sp`` (bad input exit 2 before MPI, a good run equal to the serial).
"""

from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path

import numpy as np
import pytest
from conftest import launch_checks, refused_before_mpi, run_minipar

from minipar.nn import GPT, GPTConfig
from minipar.parallel.common import RunSpec
from minipar.parallel.tensor_parallel.shards import (
    check_tp,
    kind_of,
    shard_params,
    split_columns,
    unshard_params,
)


@pytest.mark.parametrize("n", [1, 2, 3, 4])
def test_tp_layers_gpt_counts_and_training(n: int) -> None:
    fields = launch_checks(n, "tp_check.py", "TP", timeout=180, watchdog_s=90)
    assert int(fields["checks"]) > 100


def test_shards_are_cut_from_the_full_init_and_glue_back() -> None:
    cfg = GPTConfig(vocab_size=12, n_layer=2, n_head=4, d_model=16, n_experts=2, moe_every=2)
    full = GPT(cfg).init(3)
    for t in (1, 2, 4):
        shards = [shard_params(full, cfg, t, r) for r in range(t)]
        back = unshard_params(shards, cfg)
        assert list(back) == list(full)
        assert all(np.array_equal(back[k], full[k]) for k in full)
    s = shard_params(full, cfg, 2, 1)
    assert s["blocks.0.attn.w_qkv"].shape == (16, 24) and s["tok_emb"].shape == (6, 16)
    # rank 1's q columns are the q columns of heads 2 and 3
    assert np.array_equal(s["blocks.0.attn.w_qkv"][:, :8], full["blocks.0.attn.w_qkv"][:, 8:16])
    assert np.array_equal(split_columns(np.arange(12), 2, 1, parts=3), [2, 3, 6, 7, 10, 11])


def test_grouped_query_attention_slices_split_or_replicate_key_value_heads() -> None:
    """H = 4, K = 2: t = 2 gives each rank one key/value head; t = 4 replicates each on two
    ranks (rank r reads head r // 2); unshard glues them back; t = 3 is refused."""
    cfg = GPTConfig(vocab_size=12, n_layer=1, n_head=4, n_kv_head=2, d_model=16)
    full = GPT(cfg).init(3)
    w = full["blocks.0.attn.w_qkv"]  # (16, 32): q 0:16, k 16:24, v 24:32
    for t in (1, 2, 4):
        shards = [shard_params(full, cfg, t, r) for r in range(t)]
        back = unshard_params(shards, cfg)
        assert all(np.array_equal(back[k], full[k]) for k in full)
    s = shard_params(full, cfg, 4, 3)["blocks.0.attn.w_qkv"]
    assert np.array_equal(s, np.concatenate([w[:, 12:16], w[:, 20:24], w[:, 28:32]], axis=1))
    with pytest.raises(ValueError, match="kv_heads = 2"):
        check_tp(GPTConfig(vocab_size=12, n_head=6, n_kv_head=2, d_model=24), 3)


def test_the_slicing_table() -> None:
    assert [kind_of(n) for n in ("tok_emb", "pos_emb", "blocks.0.attn.w_qkv",
                                 "blocks.0.attn.w_out", "blocks.0.attn.b_out",
                                 "blocks.1.mlp.w_in", "blocks.1.mlp.b_in", "blocks.1.mlp.w_out",
                                 "blocks.1.moe.router", "blocks.1.moe.experts.0.w_in",
                                 "ln_f.gamma", "lm_head")] == [
        "rows", "replicated", "qkv", "rows", "replicated", "columns", "columns", "rows",
        "replicated", "columns", "replicated", "columns"]


@pytest.mark.parametrize("cfg,t,sp,seq,words", [
    (GPTConfig(n_head=2, d_model=16, vocab_size=12), 4, False, None, "heads = 2"),
    (GPTConfig(n_head=3, d_model=18, vocab_size=12), 2, False, None, "heads = 3"),
    (GPTConfig(n_head=4, d_model=16, d_ff=30, vocab_size=12), 4, False, None, "d_ff = 30"),
    (GPTConfig(n_head=4, d_model=16, vocab_size=10), 4, False, None, "vocab = 10"),
    (GPTConfig(n_head=4, d_model=16, vocab_size=12), 4, True, 10, "sequence length 10"),
    (GPTConfig(n_head=4, d_model=16, vocab_size=12, n_experts=2), 2, True, 8, "mixture"),
])
def test_bad_slicing_is_one_clear_line(cfg: GPTConfig, t: int, sp: bool, seq: int | None,
                                       words: str) -> None:
    with pytest.raises(ValueError) as e:
        check_tp(cfg, t, sp, seq)
    assert words in str(e.value) and len(str(e.value).splitlines()) == 1


def _cli(*args: str) -> subprocess.CompletedProcess[str]:
    return run_minipar("run", *args, timeout=180)


@pytest.mark.parametrize("args,words", [
    (["tp", "-n", "4", "--tp", "4"], "the tensor-parallel size t = 4 does not divide --heads 2"),
    (["tp", "-n", "2", "--tp", "2", "--vocab", "9"], "--vocab 9"),
    (["tp", "-n", "4", "--tp", "3"], "--tp 3 does not divide -n 4"),
    (["tp", "-n", "4", "--tp", "2", "--dp", "1"], "--dp 1 x --tp 2 = 2"),
    (["tp", "-n", "4", "--tp", "2", "--batch", "1", "--vocab", "12"], "--batch"),
    (["sp", "-n", "2", "--tp", "2", "--seq", "7"], "--seq 7"),
    (["sp", "-n", "2", "--experts", "2"], "--experts"),
    # no silent fallback to data parallelism: no t > 1 dividing 3 cuts the default model
    (["sp", "-n", "3"], "-n 3: no tensor-parallel size t > 1 dividing 3 cuts this model"),
    (["sp", "-n", "3"], "--tp 3 --heads 3 --d-model 24 --vocab 6 --seq 12, or --tp 1 for plain"),
    (["tp", "-n", "3"], "--tp 3 --heads 3 --d-model 24 --vocab 6, or --tp 1 for plain data"),
])
def test_run_bad_input_is_one_line_exit_2(args: list[str], words: str, tmp_path: Path) -> None:
    line = refused_before_mpi(["run", *args, "--timeout", "5"], tmp_path).stderr.strip()
    assert words in line, line


def test_run_tp_on_a_2x2_grid_and_sp_json() -> None:
    proc = _cli("tp", "-n", "4", "--tp", "2", "--dp", "2", "--heads", "2", "--vocab", "12",
                "--steps", "2", "--timeout", "120")
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "final parameters: equal to the serial run" in proc.stdout
    assert "grid dp 2 x tp 2" in proc.stdout
    # the headline says it counts the blocks' f and g; the axes add up to every byte
    assert ("bytes sent per rank per step (counted; the blocks' f and g only; every axis: the "
            "lines below): ") in proc.stdout
    axes = re.search(r"by grid axis \(rank 0\): dp ([\d,]+), tp ([\d,]+) \(all axes ([\d,]+)\)",
                     proc.stdout)
    dp_b, tp_b, total = (int(g.replace(",", "")) for g in axes.groups())
    assert dp_b + tp_b == total
    # the dp all-reduce runs over the rank's parameters, not Ψ/t: the replicated ones too
    m = re.search(r"over the rank's P_r = ([\d,]+) parameters: its 1/t slices ([\d,]+) \+ "
                  r"([\d,]+) replicated on every tp rank .*the model's Ψ = ([\d,]+), "
                  r"Ψ/t = ([\d,]+)", proc.stdout)
    assert m, proc.stdout
    p_r, sliced, shared, psi, psi_t = (int(g.replace(",", "")) for g in m.groups())
    assert psi == GPT(RunSpec(heads=2, vocab=12).config()).n_params()
    assert (p_r, psi, psi_t) == (sliced + shared, 2 * sliced + shared, psi // 2) and shared > 0
    proc = _cli("sp", "-n", "2", "--steps", "2", "--json", "--timeout", "120")
    assert proc.returncode == 0, proc.stderr[-2000:]
    s = json.loads(proc.stdout)
    assert s["strategy"] == "sp" and s["parity"] and s["sequence_parallel"]
    assert s["bytes_sent_per_rank"] == s["bytes_exact_per_rank"] == [s["bytes_formula"]] * 2
    assert s["activation_bytes_per_rank"] == [s["activation_formula"]] * 2
    assert all(set(a) == {"tp"} for a in s["bytes_by_axis_per_rank"])


def test_plain_data_parallelism_asked_for_names_uneven_rows() -> None:
    proc = _cli("tp", "-n", "3", "--tp", "1", "--steps", "1", "--timeout", "120")
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "grid dp 3 x tp 1" in proc.stdout and "(--batch 10 split 4, 3, 3)" in proc.stdout
    assert "over the rank's P_r = 7,040 parameters = the model's Ψ" in proc.stdout


def test_the_default_grid_is_the_largest_tp_the_model_cuts() -> None:
    from minipar.parallel.common import RunSpec
    from minipar.run.tp import grid_sizes

    o = {"ranks": 4, "tp": None, "dp": None}
    assert grid_sizes(o, RunSpec()) == {"dp": 2, "tp": 2}  # 2 heads, vocab 10: t = 2, dp 2
    assert grid_sizes(o, RunSpec(heads=4, vocab=12)) == {"dp": 1, "tp": 4}
    assert grid_sizes({**o, "ranks": 3}, RunSpec(heads=2, vocab=10)) == {"dp": 3, "tp": 1}
    assert grid_sizes({**o, "dp": 4}, RunSpec()) == {"dp": 4, "tp": 1}


@pytest.mark.parametrize("t", [1, 2, 4])
def test_placements_say_where_every_slice_of_shard_params_sits(t: int) -> None:
    """Each piece of rank r's shard is the block of the global tensor its Shard names:
    w_qkv three column groups, rows and columns one piece, replicated tensors whole; the
    pieces of the t ranks (replicated tensors: rank 0's) cover every element once."""
    from minipar.parallel.engine import Piece
    from minipar.parallel.tensor_parallel.shards import placements

    cfg = GPTConfig(vocab_size=4 * t, block_size=8, n_layer=2, n_head=t, d_model=4 * t,
                    n_experts=2, moe_every=2)
    full = GPT(cfg).init(0)
    covered = {n: np.zeros(a.shape, int) for n, a in full.items()}
    for r in range(t):
        shard, place = shard_params(full, cfg, t, r), placements(cfg, t, r)
        assert list(place) == list(full)
        for n, sh in place.items():
            assert sh.name == n and sh.global_shape == full[n].shape
            assert len(sh.pieces) == (3 if kind_of(n) == "qkv" else 1)
            for p in sh.pieces:
                assert np.array_equal(shard[n][p.local], full[n][p.global_]), n
                if kind_of(n) != "replicated" or r == 0:
                    covered[n][p.global_] += 1
    assert all((c == 1).all() for c in covered.values())
    if t == 2:  # the engine docstring's example: d = 8 here, rank 1 of w_qkv (8, 24)
        q = placements(cfg, 2, 1)["blocks.0.attn.w_qkv"].pieces
        assert [p.global_[1] for p in q] == [slice(4, 8), slice(12, 16), slice(20, 24)]
        assert q[0] == Piece((slice(0, 8), slice(0, 4)), (slice(0, 8), slice(4, 8)))
