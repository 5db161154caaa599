"""`minipar bench pp` on a tiny model: the figures are there and consistent; bad options exit 2.

The throughput itself (target >= 1.5x on 2 ranks) is measured by the full-size
bench, not asserted here: on a shared machine a timed assertion tests the load.
"""

from __future__ import annotations

import json

import pytest

from minipar import cli
from minipar.bench import pp as bench_pp

TINY = ["--d-model", "16", "--layers", "2", "--heads", "2", "--seq", "8", "--batch", "8",
        "--vocab", "10", "--steps", "1", "--rounds", "1", "--timeout", "120"]


def test_tiny_bench_reports_speedup_and_bubbles(capsys: pytest.CaptureFixture[str]) -> None:
    assert bench_pp.main([*TINY, "--json"]) == 0
    row = json.loads(capsys.readouterr().out)
    assert row["stages"] == 2 and row["micro_batches"] == 8 and row["schedule"] == "1f1b"
    assert row["bubble_formula"] == pytest.approx(1 / 9)
    assert 0 <= row["bubble_rebuilt"] < 1 and 0 <= row["bubble_wall_clock"] < 1
    assert 0 <= row["bubble_rebuilt_median"] < 1 and 0 <= row["bubble_rebuilt_cpu"] < 1
    assert row["speedup_dedicated"] == pytest.approx(row["serial_cpu_s"] / row["pp_cpu_rebuilt_s"])
    assert row["speedup"] == pytest.approx(row["serial_s"] / row["pp_s"])
    assert len(row["stage_compute_s"]) == 2 and min(row["stage_compute_s"]) > 0
    # each stage sends 8 micro-batches of 1 row x T 8 x d 16 float32 one way
    assert row["bytes_p2p_per_step"] == 8 * 8 * 16 * 4


def test_the_text_view(capsys: pytest.CaptureFixture[str]) -> None:
    assert bench_pp.main([*TINY, "--schedule", "gpipe", "--micro-batches", "4"]) == 0
    out = capsys.readouterr().out
    assert "speed-up" in out and "formula (p-1)/(m+p-1) = 0.200" in out
    assert "ideal p·m/(m+p-1) = 1.60, GPipe's bubble on 2 ranks" in out
    assert "target" not in out


@pytest.mark.parametrize("args,words", [
    (["--layers", "1"], "2 stages but the model has only 1 layer:"),
    (["--micro-batches", "0"], "--micro-batches"),
    (["--micro-batches", "9", "--batch", "8"], "m=9 micro-batches"),
    (["--ep", "2", "--experts", "3"], "--ep 2 must divide --experts 3"),
])
def test_bad_options_are_one_line_and_exit_2(args: list[str], words: str,
                                             capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["bench", "pp", *TINY, *args]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and words in err[0], err


def test_zero_bubble_v_next_to_1f1b_on_the_same_launch(capsys: pytest.CaptureFixture[str]
                                                       ) -> None:
    """``--schedule zb-v`` (Qi et al. 2023): two chunks per rank in a V, run beside 1F1B in
    the same launch; the formula's zero, the bubble with every stage synchronised, the
    bytes kept only for W on every stage, and twice 1F1B's messages."""
    assert bench_pp.main([*TINY, "--layers", "4", "--schedule", "zb-v", "--json"]) == 0
    row = json.loads(capsys.readouterr().out)
    assert row["schedule"] == "zb-v" and row["chunks"] == 2 and row["bubble_formula"] == 0
    assert 0 <= row["bubble_rebuilt"] < 1 and 0 <= row["bubble_synced"] < 1
    assert 0 <= row["bubble_rebuilt_cpu_compute"] < 1
    assert all(b > 0 for b in row["w_peak_bytes"]) and len(row["w_peak_bytes"]) == 2
    base = row["baseline_1f1b"]
    assert base["bubble_formula"] == pytest.approx(1 / 9) and 0 <= base["bubble_rebuilt"] < 1
    assert row["bytes_p2p_per_step"] == 2 * 8 * 8 * 16 * 4  # rank 0: F of chunk 0, B of chunk 1


def test_zero_bubble_text_names_table_2(capsys: pytest.CaptureFixture[str]) -> None:
    assert bench_pp.main([*TINY, "--schedule", "zb-h1", "--micro-batches", "4"]) == 0
    out = capsys.readouterr().out
    assert "Table 2 with the measured T_F, T_B, T_W" in out and "1F1B on the same launch" in out
    assert "bytes kept only for W, peak per stage" in out and "target" not in out


def test_dualpipe_against_1f1b_and_zb_h1_with_the_hidden_fraction(
        capsys: pytest.CaptureFixture[str]) -> None:
    """``--schedule dualpipe`` (DeepSeek-V3): beside 1F1B and ZB-H1 in the same launch, each
    with the share of its message time hidden behind computing (``hidden_fraction``); with
    experts over ep 2 pipeline replicas, the experts' all-to-all in it and alone
    (``hidden_fraction_a2a``): DualPipe's pair takes turns, 1F1B and ZB-H1 have no pair."""
    assert bench_pp.main([*TINY, "--schedule", "dualpipe", "--micro-batches", "4",
                          "--experts", "4", "--ep", "2", "--json"]) == 0
    row = json.loads(capsys.readouterr().out)
    assert row["chunks"] == 2 and set(row["baselines"]) == {"1f1b", "zb-h1"}
    for b in (row, *row["baselines"].values()):
        for h in (b["hidden_fraction"], b["hidden_fraction_a2a"]):
            assert 0 <= h <= 1  # both send: the pipeline's messages, the all-to-alls
    assert all(b["pp_s"] > 0 for b in row["baselines"].values())
    assert row["overlapped_pairs"] == 1  # m = 4 on 2 ranks: one pair per rank and step
    assert [b["overlapped_pairs"] for b in row["baselines"].values()] == [0, 0]
    assert row["ep"] == 2 and row["bytes_a2a_per_step"] > 0
