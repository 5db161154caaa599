"""``minipar bench model`` runs at a tiny size, with and without PyTorch (no timing assertions)."""

from __future__ import annotations

import importlib.util
import json
import sys

from minipar.bench import model as bench


def test_measure_without_torch_fills_the_numpy_column(monkeypatch) -> None:
    monkeypatch.setitem(sys.modules, "torch", None)  # import torch -> ImportError
    rows = bench.measure(["tiny"], repeat=1, use_torch=True)
    (row,) = rows
    assert row["numpy_s"] > 0 and row["torch_s"] is None and row["ratio"] is None
    assert row["params"] == 32 * 64 * 2 + 16 * 32 + 12 * 32 * 32 + 13 * 32 + 2 * 32
    text = bench.table(rows)
    assert "tiny" in text and "NumPy column only" in text


def test_torch_path_agrees_with_numpy_when_torch_is_installed() -> None:
    rows = bench.measure(["tiny"], repeat=1, use_torch=True)
    if importlib.util.find_spec("torch") is None:
        assert rows[0]["torch_s"] is None
    else:  # the same model in PyTorch: same loss to float32 rounding
        assert rows[0]["torch_s"] > 0 and rows[0]["loss_diff"] < 1e-5
        assert "NumPy column only" not in bench.table(rows)


def test_cli_runs_in_a_one_thread_subprocess(tmp_path, capsys) -> None:
    out = tmp_path / "rows.json"
    assert bench.main(["--sizes", "tiny", "--repeat", "1", "--no-torch", "--json-out", str(out)]) == 0
    text = capsys.readouterr().out
    assert "one thread" in text and "tiny" in text
    assert json.loads(out.read_text())[0]["size"] == "tiny"


def test_float64_gradients_agree_with_pytorch_autograd_when_torch_is_installed() -> None:
    """The hand-written backward equals PyTorch autograd on the same GPT in float64 to
    1e-12 (the summation orders differ, so not to the bit)."""
    import numpy as np

    from minipar.nn import GPT, GPTConfig

    if importlib.util.find_spec("torch") is None:
        assert bench._import_torch() is None
        return
    import torch

    d, n_layer, n_head, t, b, v = bench.SIZES["tiny"]
    model = GPT(GPTConfig(vocab_size=v, block_size=t, n_layer=n_layer, n_head=n_head,
                          d_model=d, dtype="float64"))
    params = model.init(0)
    r = np.random.default_rng(0)
    x, y = r.integers(0, v, (b, t)), r.integers(0, v, (b, t))
    loss, grads = model.loss_and_grads(params, x, y)
    tp = {k: torch.tensor(a, requires_grad=True) for k, a in params.items()}
    tl = bench.torch_gpt_loss(torch, tp, torch.tensor(x), torch.tensor(y), n_layer, n_head)
    tl.backward()
    assert abs(loss - float(tl.detach())) < 1e-12
    for k in params:
        assert np.abs(grads[k] - tp[k].grad.numpy()).max() < 1e-12, k


def test_profile_has_every_kind_and_a_total() -> None:
    sizes = bench.profile(["tiny"], repeat=1)
    (size,) = sizes
    assert [k["kind"] for k in size["kinds"]] == list(bench.KINDS)
    assert all(k["numpy_s"] >= 0 for k in size["kinds"])
    assert sum(k["numpy_s"] for k in size["kinds"]) > 0
    text = bench.profile_table(sizes)
    assert "total" in text and "layer norm" in text


def test_float64_cli(tmp_path) -> None:
    out = tmp_path / "rows.json"
    assert bench.main(["--sizes", "tiny", "--repeat", "1", "--dtype", "float64", "--no-torch",
                       "--json-out", str(out)]) == 0
    assert json.loads(out.read_text())[0]["numpy_s"] > 0
