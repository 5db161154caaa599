"""``minipar bench precision`` at a tiny size: every row trains the same model on the same
batches, the ZeRO rows come from ``minipar run zero``, the outlier errors from the
quantizer; bad options are refused in one line.  No timing is asserted."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from conftest import refused_before_mpi

from minipar.bench import precision as bench
from minipar.parallel.common import RunSpec, serial_reference

TINY = ["--layers", "1", "--d-model", "16", "--heads", "2", "--seq", "8", "--batch", "4",
        "--steps", "4", "--eval-every", "2", "--eval-batches", "1"]


def test_the_bench_runs_every_recipe_and_zero_and_draws_the_curves(tmp_path: Path,
                                                                  capsys) -> None:
    out, png = tmp_path / "p.json", tmp_path / "p.png"
    rc = bench.main([*TINY, "-n", "2", "--node", "1", "--zeropp", "all",
                     "--plot", str(png), "--json-out", str(out)])
    text = capsys.readouterr().out
    assert rc == 0, text
    data = json.loads(out.read_text())
    rows = {r["name"]: r for r in data["rows"]}
    assert list(rows) == ["float32", "bf16 mixed", "fp8 tensor", "fp8 block",
                          "ZeRO-3 + qwz+hpz+qgz"]
    assert all([s for s, _ in r["validation"]] == [2, 4] for r in rows.values())
    # the serial float32 row is the serial engine, bit for bit
    spec = RunSpec(**bench.spec_fields(bench.parse_args(TINY)), precision="float32")
    assert rows["float32"]["losses"] == serial_reference(spec)["losses"]
    # ZeRO++ (INT8 weights, INT4 gradients) on 2 ranks in nodes of 1: under half of ZeRO-3's
    # bytes, all of them across nodes; losses near float32's, not equal
    z = rows["ZeRO-3 + qwz+hpz+qgz"]
    assert 0 < z["bytes_per_step"] < z["zero3_bytes_per_step"] / 2
    assert z["inter_node_bytes_per_step"] > 0
    f32 = rows["float32"]["losses"]
    assert z["losses"] != f32 and z["losses"] == pytest.approx(f32, rel=1e-2)
    assert png.stat().st_size > 0 and "final validation" in text and "ZeRO-3" in text


def test_tiles_beat_one_scale_per_tensor_on_outliers() -> None:
    """INT8 loses the ordinary values to one outlier 1,000x larger (all flushed to 0);
    E4M3's exponent absorbs it until ~10^5 x, where tiles win too."""
    e = {(r["magnitude"], r["format"]): r for r in bench.outlier_errors((1e3, 1e5))}
    assert e[1e3, "int8"]["tensor_zeros"] > 0.99 and e[1e3, "int8"]["tile"] < 0.2
    assert e[1e3, "e4m3"]["tensor"] < 0.03 and e[1e3, "e4m3"]["tile"] < 0.03
    assert e[1e5, "e4m3"]["tensor"] > 3 * e[1e5, "e4m3"]["tile"]


def test_steps_alone_picks_a_validation_interval_and_names_take_hyphens() -> None:
    """--steps 10 alone: validation every 10 (the last step); 148: every 4; "fp8-block" is
    "fp8 block"."""
    assert bench.parse_args(["--steps", "10"]).eval_every == 10
    assert bench.parse_args(["--steps", "148"]).eval_every == 4
    a = bench.parse_args(["--recipes", "fp8-block,bf16-mixed,fp8 tensor"])
    assert a.recipes == ["fp8 block", "bf16 mixed", "fp8 tensor"]


@pytest.mark.parametrize("args,option", [
    (["--zeropp", "qwz,zpp"], "--zeropp"), (["-n", "4", "--node", "3"], "--node"),
])
def test_bad_options_are_refused_in_one_line(args: list[str], option: str,
                                              tmp_path: Path) -> None:
    line = refused_before_mpi(["bench", "precision", *TINY, *args], tmp_path).stderr.strip()
    assert line.startswith("minipar bench precision: ") and option in line, line
