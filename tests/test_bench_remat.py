"""``minipar bench remat`` and ``minipar bench offload`` at tiny sizes (no timing assertions):
the rows are filled, the ledger's activation bytes fall with remat, the forwards counted."""

from __future__ import annotations

import json
from pathlib import Path

from minipar import cli
from minipar.bench import offload as bench_offload
from minipar.bench import remat as bench_remat
from minipar.plan.checkpointing import recompute_forward_layers

SIZE = {"d_model": 8, "heads": 2, "seq": 8, "batch": 2, "vocab": 11}


def test_remat_rows_curve_and_table() -> None:
    rows = bench_remat.measure([2, 7], repeat=1, **SIZE)
    assert [r["layers"] for r in rows] == [2, 7] and [r["every"] for r in rows] == [2, 3]
    for r in rows:
        n, k = r["units"], r["every"]
        assert r["forwards"] == n + recompute_forward_layers(n, k)
        assert r["held_remat"] < r["held_plain"] and r["peak_plain"] > 0
        assert r["plain_s"] > 0 and r["time_ratio"] > 0
    # O(sqrt n) against O(n): from 2 to 7 blocks plain grows more than remat
    assert rows[1]["held_plain"] / rows[0]["held_plain"] > rows[1]["held_remat"] / rows[0][
        "held_remat"]
    text = bench_remat.table(rows)
    assert "time ratio" in text and len(text.splitlines()) == 4


def test_remat_cli_runs_in_a_subprocess(tmp_path: Path, capsys) -> None:
    out = tmp_path / "rows.json"
    assert bench_remat.main(["--layers", "1", "2", "--repeat", "1", "--d-model", "8", "--seq",
                             "8", "--batch", "2", "--json-out", str(out)]) == 0
    text = capsys.readouterr().out
    assert "one thread" in text and "ideal 4/3 = 1.33x" in text and "target" not in text
    assert [r["layers"] for r in json.loads(out.read_text())] == [1, 2]
    assert cli.main(["bench", "remat", "--layers", "1", "--every", "9"]) == 2
    assert "--every 9 exceeds the 3 units" in capsys.readouterr().err


def test_offload_rows(tmp_path: Path) -> None:
    size = {**SIZE, "d_model": 32, "seq": 16}  # activations well above the handles' bytes
    acts = bench_offload.activations(2, repeat=1, folder=str(tmp_path), **size)
    assert [r["what"] for r in acts] == ["plain", "offload host", "offload disk", "remat + disk"]
    plain, host, disk, both = acts
    assert plain["bytes_out"] == 0 and host["bytes_out"] == disk["bytes_out"] == plain["device"]
    assert host["device"] == 0 and host["host"] == plain["device"]
    assert disk["disk"] == plain["device"] and both["disk"] == both["bytes_out"] > 0
    assert disk["traced_after_forward"] < plain["traced_after_forward"]
    opts = bench_offload.optimizer_states(2, repeat=1, folder=str(tmp_path), **size)
    assert [r["offloaded"] > 0 for r in opts] == [False, True, True]
    assert opts[2]["traced_states"] < opts[0]["traced_states"]
    assert "optimizer states on disk" in bench_offload.table(acts, opts)
    assert not [p for p in tmp_path.rglob("*") if p.is_file()]
