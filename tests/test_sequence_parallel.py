"""Sequence parallelism: activation memory per block measured against the formulas.

Korthikanti et al. 2022 (arXiv 2205.05198), 16-bit: each block's saved activations,
counted by a ledger of the arrays in ``saved`` and by tracemalloc, for none / TP / TP+SP
at t = 1, 2, 4, must equal minipar's own formula
(:func:`minipar.plan.activations.minipar_activation_formula`) within 2%; the paper's
figure (with dropout) is printed next to it.  Parity of TP+SP training with the serial
run is checked in tests/mpi/tp_check.py (tests/test_tensor_parallel.py).
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from mpi4py import MPI

from minipar import launch
from minipar.comm import TracedComm
from minipar.nn import GPTConfig
from minipar.parallel.tensor_parallel.measure import (
    activation_bytes_per_block,
    ledger,
    saved_arrays,
)
from minipar.parallel.tensor_parallel.shards import split_sequence
from minipar.plan.activations import activation_bytes_per_layer, minipar_activation_formula

MPI_DIR = Path(__file__).parent / "mpi"
CFG = GPTConfig(vocab_size=16, block_size=128, n_layer=1, n_head=8, d_model=128,
                dtype="bfloat16")


def _within(measured: float, formula: float, rel: float = 0.02) -> bool:
    return abs(measured - formula) <= rel * formula


def test_one_rank_every_mode_matches_minipar_formula() -> None:
    comm = TracedComm(MPI.COMM_SELF)
    for mode in ("none", "tp", "tp+sp"):
        m = activation_bytes_per_block(comm, CFG, 2, mode)
        assert m["t"] == 1 and m["formula"] == minipar_activation_formula(128, 2, 128, 8, 1)
        assert m["ledger"] == m["formula"], m  # the ledger is exact
        assert _within(m["tracemalloc"], m["formula"]), m
        assert m["paper"] == activation_bytes_per_layer(128, 2, 128, 8, 1, "none")


@pytest.mark.parametrize("t", [2, 4])
def test_tp_and_sp_on_t_ranks_match_minipar_formula(t: int) -> None:
    proc = launch.run(t, str(MPI_DIR / "sp_check.py"), timeout=120,
                      env={"MINIPAR_WATCHDOG_S": "60"})
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    line = next(ln for ln in proc.stdout.splitlines() if ln.startswith("SP-ACT "))
    ranks = json.loads(line[len("SP-ACT "):])
    assert len(ranks) == t
    for per_rank in ranks:
        tp, sp = per_rank["tp"], per_rank["tp+sp"]
        for m in (tp, sp):
            assert m["t"] == t and m["ledger"] == m["formula"], m
            assert _within(m["tracemalloc"], m["formula"]), m
        assert sp["formula"] < tp["formula"] < minipar_activation_formula(128, 2, 128, 8)
        assert tp["formula"] == minipar_activation_formula(128, 2, 128, 8, t, "tp")
        assert sp["paper"] == activation_bytes_per_layer(128, 2, 128, 8, t, "tp+sp")


def test_minipar_formula_by_hand() -> None:
    s, b, h, a = 128, 2, 128, 8
    sbh, att = s * b * h, 2 * a * s * s * b
    # none: 40 sbh (34 - 2 dropout masks + 8 tanh) + 2as²b (softmax) + 2 x 4sb (1/σ, fp32)
    assert minipar_activation_formula(s, b, h, a) == 40 * sbh + att + 8 * s * b == 1_837_056
    assert minipar_activation_formula(s, b, h, a, 4, "tp") == 8 * sbh + 8 * sbh + att / 4 + 8 * s * b
    assert minipar_activation_formula(s, b, h, a, 4, "tp+sp") == 10 * sbh + att / 4 + 2 * s * b
    # float64: twice the 4-byte elements' bytes, 1/σ in float64
    assert minipar_activation_formula(s, b, h, a, 1, "none", 8) == 4 * (40 * sbh + att) + 16 * s * b
    with pytest.raises(ValueError, match="mode"):
        minipar_activation_formula(s, b, h, a, 2, "tp+selective")


def test_ledger_counts_a_view_as_its_base_once() -> None:
    qkv = np.zeros((2, 4, 12))
    q, k, v = np.split(qkv, 3, axis=-1)
    a = np.ones((3, 3))
    saved = {"x": (q, k.T, v), "y": [a, a[1:]], "n": 3}
    assert len(saved_arrays(saved)) == 2
    assert ledger(saved) == qkv.nbytes + a.nbytes


def test_split_sequence_and_bad_mode() -> None:
    x = np.arange(2 * 6 * 3).reshape(2, 6, 3)
    parts = [split_sequence(x, 4, r) for r in range(4)]
    assert [p.shape[1] for p in parts] == [2, 2, 1, 1]
    assert np.array_equal(np.concatenate(parts, axis=1), x)
    with pytest.raises(ValueError, match="mode"):
        activation_bytes_per_block(TracedComm(MPI.COMM_SELF), CFG, 2, "full")


def test_plan_prints_the_papers_and_minipars_figures() -> None:
    import subprocess
    import sys

    args = ["--gpt", "1,128,16,128", "-n", "2", "--batch", "2", "--heads", "8", "--tp", "4"]
    run = [sys.executable, "-m", "minipar.cli", "plan", *args]
    text = subprocess.run(run, capture_output=True, text=True, timeout=60, check=True).stdout
    assert "sbh(34/t + 5as/(ht))" in text and "sbh(40/t + 2as/(ht)) + 8sb/t" in text
    out = json.loads(subprocess.run([*run, "--json"], capture_output=True, text=True,
                                    timeout=60, check=True).stdout)
    rows = {r["mode"]: r["per_layer"] for r in out["activations"]["minipar_rows"]}
    assert rows == {m: minipar_activation_formula(128, 2, 128, 8, 4, m)
                    for m in ("none", "tp", "tp+sp")}
    assert rows["tp+sp"] == 459_264  # the figure measured on 4 ranks (tests above)
