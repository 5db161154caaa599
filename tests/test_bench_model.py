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
