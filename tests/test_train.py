"""The serial training loop learns, the precisions agree, and the ``minipar train`` verb works."""

from __future__ import annotations

import io
import json

import numpy as np
import pytest

from minipar import cli
from minipar import train as T
from minipar.cli.train import main as train_main
from minipar.nn import GPT, MLP, GPTConfig, MLPConfig

SMALL = {"vocab_size": 7, "block_size": 10, "n_layer": 1, "n_head": 2, "d_model": 32}


def test_gpt_loss_falls_clearly() -> None:
    out = T.train(GPT(GPTConfig(**{**SMALL, "n_layer": 2})), T.gpt_task(7, 10, 16), steps=200,
                  lr=3e-3, weight_decay=0.0)
    first, last = np.mean(out["losses"][:5]), np.mean(out["losses"][-5:])
    assert first > 1.8 and last < 0.6 * first, (first, last)


def test_mlp_loss_falls_clearly() -> None:
    out = T.train(MLP(MLPConfig(sizes=(2, 32, 32, 3))), T.mlp_task(64), steps=150,
                  lr=1e-2, weight_decay=0.0)
    assert np.mean(out["losses"][-10:]) < 0.5 * np.mean(out["losses"][:5])


@pytest.mark.parametrize("precision,tol", [("float32", 1e-4), ("mixed", 0.05)])
def test_lower_precision_tracks_float64(precision: str, tol: float) -> None:
    from minipar.precision import get

    curves = {}
    for p in ("float64", precision):
        cfg = GPTConfig(**SMALL, n_experts=2, dtype=get(p).model_dtype)
        curves[p] = T.train(GPT(cfg), T.gpt_task(7, 10, 8), steps=15, precision=p,
                            lr=1e-2, weight_decay=0.0)["losses"]
    assert np.abs(np.array(curves["float64"]) - np.array(curves[precision])).max() < tol


def test_sgd_and_same_seed_same_curve() -> None:
    a = T.train(MLP(MLPConfig()), T.mlp_task(16), steps=5, optimizer="sgd", lr=0.1)["losses"]
    b = T.train(MLP(MLPConfig()), T.mlp_task(16), steps=5, optimizer="sgd", lr=0.1)["losses"]
    assert a == b


def test_progress_bar_off_a_terminal_is_one_line_per_tenth() -> None:
    """tqdm into a file (not a TTY): step 0, then one whole line every 2 of 20 steps, no \r."""
    s = io.StringIO()
    out = T.train(MLP(MLPConfig()), T.mlp_task(8), steps=20, progress=s, lr=1e-3)
    lines = s.getvalue().splitlines()
    assert [ln.split()[1] for ln in lines] == [f"{k}/20" for k in range(0, 21, 2)]
    assert lines[-1].startswith("step 20/20 [" + "#" * 30 + "], loss ")
    assert f"loss {out['losses'][-1]:.4f}" in lines[-1] and "\r" not in s.getvalue()


def test_divergence_stops_training_with_the_step_and_the_reason() -> None:
    """A NaN input makes a NaN loss at the first step; a huge learning rate a loss > 10x."""
    x, y = T.mlp_task(8)(0)
    with pytest.raises(T.Diverged, match=r"diverged at step 1: the loss is nan \(not a finite"):
        T.train(MLP(MLPConfig()), lambda s: (x * np.nan, y), steps=5, diverge_factor=10)
    with pytest.raises(T.Diverged, match=r"exceeds 10 x the first step's ") as e:
        T.train(MLP(MLPConfig()), T.mlp_task(64), steps=50, lr=30.0, diverge_factor=10)
    assert e.value.loss > 10 * e.value.first and e.value.step < 49
    # without a factor the whole curve is kept (the parallel runs' oracle): no exception
    assert len(T.train(MLP(MLPConfig()), T.mlp_task(64), steps=5, lr=30.0)["losses"]) == 5


def test_cli_divergence_is_one_line_and_exit_1(capsys) -> None:
    assert train_main(["--model", "mlp", "--lr", "30", "--steps", "50"]) == 1
    out, err = capsys.readouterr()
    assert out == ""
    last = err.splitlines()[-1]
    assert last.startswith("minipar train: diverged at step ") and last.endswith(
        "a smaller learning rate usually cures it (this run: --lr 30; the default is 0.003)")
    assert all(ln.startswith("step ") for ln in err.splitlines()[:-1])  # the bar, then one line
    assert train_main(["--model", "mlp", "--lr", "30", "--steps", "50", "--quiet",
                   "--diverge", "1e30"]) == 0  # a higher threshold lets it run
    capsys.readouterr()


def test_dtype_mismatch_raises() -> None:
    with pytest.raises(ValueError, match="does not match"):
        T.train(GPT(GPTConfig(**SMALL)), T.gpt_task(7, 10, 4), steps=1, precision="float32")


def test_cli_verb(tmp_path, capsys) -> None:
    path = tmp_path / "curve.json"
    rc = train_main(["--model", "gpt", "--steps", "3", "--vocab", "7", "--seq", "8", "--d-model", "16",
                 "--layers", "1", "--heads", "2", "--batch", "4", "--json-out", str(path)])
    assert rc == 0
    out = capsys.readouterr()
    assert "gpt:" in out.out and "loss" in out.out and "step 3/3" in out.err
    saved = json.loads(path.read_text())
    assert len(saved["losses"]) == 3
    assert saved["args"]["d_model"] == 16 and saved["args"]["experts"] == 0  # defaults filled in
    assert train_main(["--model", "mlp", "--steps", "2", "--quiet"]) == 0
    assert capsys.readouterr().err == ""  # --quiet: no bar at all
    assert cli.main(["train", "--d-model", "30", "--heads", "4", "--steps", "1", "--quiet"]) == 2
    err = capsys.readouterr().err  # more bad input: tests/test_bad_input.py
    assert err == ("minipar train: --heads 4 does not divide --d-model 30 (each head takes "
                   "d_model / heads columns); --heads must be one of 1, 2, 3, 5, 6, 10, 15, 30\n")


def test_micro_batches_accumulate_to_the_full_batch_for_a_dense_model() -> None:
    """Σ_m (b_m/B) ∇loss_m = ∇loss for a dense model (10 rows in 3 slices: 4, 3, 3)."""
    model = GPT(GPTConfig(**SMALL))
    task = T.gpt_task(7, 10, 10)
    whole = T.train(model, task, steps=3, lr=1e-2)
    parts = T.train(model, task, steps=3, lr=1e-2, micro_batches=3)
    np.testing.assert_allclose(parts["losses"], whole["losses"], rtol=1e-13, atol=0)
    np.testing.assert_allclose(parts["states"].params, whole["states"].params, rtol=0, atol=1e-13)


def test_micro_batches_are_the_routing_groups_of_a_mixture_of_experts() -> None:
    """Capacity and aux loss are per forward call: 2 micro-batches route other groups than
    the whole batch, so the runs differ beyond rounding (the oracle of DDP on 2 ranks)."""
    model = GPT(GPTConfig(**SMALL, n_experts=4, top_k=2))
    task = T.gpt_task(7, 10, 10)
    whole = T.train(model, task, steps=2, lr=1e-2)
    parts = T.train(model, task, steps=2, lr=1e-2, micro_batches=2)
    assert np.abs(parts["states"].params - whole["states"].params).max() > 1e-6
    with pytest.raises(ValueError, match="11 micro-batches but the batch has only 10 rows"):
        T.train(model, task, steps=1, micro_batches=11)
    with pytest.raises(ValueError, match="micro_batches must be a positive integer"):
        T.train(model, task, steps=1, micro_batches=0)


def test_fp8_states_its_recipe(capsys) -> None:
    """``--precision fp8`` says what it ran: the recipe in a line and in the JSON."""
    assert train_main(["--model", "gpt", "--steps", "1", "--vocab", "7", "--seq", "8",
                       "--d-model", "16", "--layers", "1", "--heads", "2", "--batch", "4",
                       "--precision", "fp8", "--fp8-block", "8", "--quiet"]) == 0
    line = capsys.readouterr().out.splitlines()[1]
    assert line.startswith("fp8: DeepSeek-V3 block scaling") and "1x8 tiles" in line
    assert "12 GEMMs per forward+backward" in line and "AdamW moments FP32" in line
    assert train_main(["--model", "gpt", "--steps", "1", "--vocab", "7", "--seq", "8",
                       "--d-model", "16", "--layers", "1", "--heads", "2", "--batch", "4",
                       "--precision", "fp8", "--fp8-scaling", "tensor", "--json"]) == 0
    record = json.loads(capsys.readouterr().out)
    assert (record["precision"], record["fp8_scaling"], record["fp8_block"]) == (
        "fp8", "tensor", None)
