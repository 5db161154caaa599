"""``minipar bench all``: it runs every benchmark and writes every ratio in its format.
Never a speed: the sizes are shrunk to the smallest (monkeypatched) so the test is quick."""

from __future__ import annotations

import json

import pytest

from minipar.bench import all as bench_all


def test_runs_every_benchmark_and_writes_the_ratios(tmp_path, monkeypatch, capsys) -> None:
    monkeypatch.setattr(bench_all, "MODEL_ARGS", ["--sizes", "tiny", "--repeat", "1"])
    monkeypatch.setattr(bench_all, "DP_ARGS", ["-n", "2", "--d-model", "16", "--layers", "1",
                                               "--heads", "2", "--seq", "8", "--batch", "4",
                                               "--vocab", "32", "--steps", "1", "--rounds", "1"])
    monkeypatch.setattr(bench_all, "COLLECTIVES_ARGS", ["-n", "2", "--collectives", "allreduce",
                                                        "--algorithms", "ring", "auto",
                                                        "--iters", "1", "--sizes", "8", "1024"])
    out = tmp_path / "ratios.json"
    assert bench_all.main(["--json-out", str(out)]) == 0
    text = capsys.readouterr().out
    data = json.loads(out.read_text())
    bench_all.check_result(data)
    benches = {r["bench"] for r in data["ratios"]}
    assert {"dp", "collectives"} <= benches
    assert all(r["ratio"] > 0 for r in data["ratios"])
    assert {r["ideal"] for r in data["ratios"] if r["bench"] == "dp"} == {2.0}
    dp = [r["name"] for r in data["ratios"] if r["bench"] == "dp"]
    assert len(dp) == 2 and dp[1].startswith("ceiling on 2 ranks: serial / independent")
    assert "ideal" in text and "target" not in text.lower() and "goal" not in text.lower()


def test_check_result_refuses_a_wrong_format() -> None:
    good = {"date": "d", "machine": "m", "cores": 2, "load_average": [0.0, 0.0], "seconds": 1.0,
            "ratios": [bench_all.ratio("model", "x", 1.0, 1.0, True)]}
    bench_all.check_result(good)
    with pytest.raises(ValueError):
        bench_all.check_result({**good, "extra": 1})
    with pytest.raises(ValueError):
        bench_all.check_result({**good, "ratios": [{"bench": "model"}]})
    with pytest.raises(ValueError):
        bench_all.check_result({**good, "ratios": [{**good["ratios"][0], "ratio": "1"}]})


def test_says_when_pytorch_is_missing_and_what_brings_it(tmp_path, monkeypatch, capsys) -> None:
    import os

    # the model's measuring subprocess finds a `torch` that cannot be imported, as on a
    # machine without it (CI has none; this machine may)
    (tmp_path / "torch").mkdir()
    (tmp_path / "torch" / "__init__.py").write_text("raise ImportError('hidden by the test')\n")
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(tmp_path)] + [
        p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]))
    monkeypatch.setattr(bench_all, "MODEL_ARGS", ["--sizes", "tiny", "--repeat", "1"])
    assert bench_all.main(["--skip", "dp", "collectives", "--json"]) == 0
    out, err = capsys.readouterr()
    assert json.loads(out)["ratios"] == []  # stdout: the JSON only
    assert err.strip().splitlines()[-1] == f"minipar bench all: {bench_all.NO_TORCH}"
    assert "pip install torch" in err
