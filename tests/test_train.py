"""The serial training loop learns, the precisions agree, and the ``minipar train`` verb works."""

from __future__ import annotations

import io
import json

import numpy as np
import pytest

from minipar import train as T
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


def test_progress_bar_shows_the_loss() -> None:
    s = io.StringIO()
    T.train(MLP(MLPConfig()), T.mlp_task(8), steps=20, progress=s, lr=1e-3)
    lines = s.getvalue().splitlines()
    assert len(lines) == 11 and lines[-1].startswith("step 20/20 [####")
    assert "loss" in lines[0] and "\r" not in s.getvalue()


def test_dtype_mismatch_raises() -> None:
    with pytest.raises(ValueError, match="does not match"):
        T.train(GPT(GPTConfig(**SMALL)), T.gpt_task(7, 10, 4), steps=1, precision="float32")


def test_cli_verb(tmp_path, capsys) -> None:
    path = tmp_path / "curve.json"
    rc = T.main(["--model", "gpt", "--steps", "3", "--vocab", "7", "--seq", "8", "--d-model", "16",
                 "--layers", "1", "--heads", "2", "--batch", "4", "--json", str(path)])
    assert rc == 0
    out = capsys.readouterr()
    assert "gpt:" in out.out and "loss" in out.out and "step 3/3" in out.err
    assert len(json.loads(path.read_text())["losses"]) == 3
    assert T.main(["--model", "mlp", "--steps", "2", "--quiet"]) == 0
    assert T.main(["--d-model", "30", "--heads", "4", "--steps", "1", "--quiet"]) == 2
    assert "not divisible" in capsys.readouterr().err
