"""``minipar bench train`` at a tiny size: minipar's side is the serial engine's run, the
PyTorch side (where torch is installed) gives the same losses, bad options are refused.

No timing assertions (the machine is shared): the 0.8x target is the benchmark's to
report.  The agreement test needs PyTorch, which the project does not depend on: where it
is not installed the test is skipped (as tests/test_bench_model.py's torch path)."""

from __future__ import annotations

import json
import sys

import pytest

from minipar import cli
from minipar.bench import train as bench
from minipar.parallel.common import serial_reference

TINY = {"layers": 1, "heads": 2, "d_model": 16, "seq": 8, "batch": 2}
TINY_ARGV = [x for k, v in TINY.items() for x in ("--" + k.replace("_", "-"), str(v))]


def test_minipar_side_is_the_serial_engine_trained_by_the_loop() -> None:
    spec = bench.spec_of(**TINY, steps=4)
    row = bench.measure(spec, "minipar", eval_every=2, eval_batches=1)
    assert row["losses"] == serial_reference(spec)["losses"]  # the same engine, bit for bit
    assert [s for s, _ in row["validation"]] == [2, 4]
    assert row["tokens"] == 4 * 2 * 8
    assert row["cpu_seconds"] > 0 and row["tokens_per_s"] > 0 and row["wall_tokens_per_s"] > 0
    assert spec.precision == "float32" and spec.text is not None and spec.betas == (0.9, 0.99)


def test_tokens_per_second_leaves_the_first_step_out() -> None:
    timer = bench.StepTimer(engine=None)
    timer.cpu, timer.wall = [5.0, 1.0, 3.0], [6.0, 2.0, 2.0]
    assert timer.tokens_per_second(10, "cpu") == pytest.approx(20 / 4)
    assert timer.tokens_per_second(10, "wall") == pytest.approx(20 / 4)
    timer.cpu = [2.0]  # a one-step run: that step
    assert timer.tokens_per_second(10) == pytest.approx(5.0)


def test_max_relative_difference_covers_training_and_validation() -> None:
    a = {"losses": [2.0, 1.0], "validation": [[2, 1.5]]}
    b = {"losses": [2.0, 1.0], "validation": [[2, 1.0]]}
    assert bench.max_relative_difference(a, a) == 0.0
    assert bench.max_relative_difference(a, b) == pytest.approx(0.5)
    with pytest.raises(ValueError, match="differ in length"):
        bench.max_relative_difference(a, {"losses": [2.0], "validation": [[2, 1.5]]})


def test_without_torch_minipar_trains_alone_and_says_so(monkeypatch: pytest.MonkeyPatch,
                                                        tmp_path, capsys) -> None:
    out = tmp_path / "train.json"
    rc = bench.main(["--steps", "2", "--eval-every", "2", "--eval-batches", "1", *TINY_ARGV,
                     "--no-torch", "--json-out", str(out)])
    text = capsys.readouterr().out
    assert rc == 0, text
    assert "PyTorch: skipped (--no-torch): minipar only" in text and "minipar" in text
    data = json.loads(out.read_text())
    assert [r["side"] for r in data["sides"]] == ["minipar"] and data["skipped"]
    assert data["spec"]["d_model"] == 16 and len(data["sides"][0]["losses"]) == 2
    monkeypatch.setitem(sys.modules, "torch", None)  # import torch -> ImportError
    assert "not installed" in bench.torch_skipped(False)
    assert bench.torch_skipped(True).startswith("PyTorch: skipped (--no-torch)")


def test_pytorch_gives_the_same_losses_from_the_same_weights_and_batches() -> None:
    pytest.importorskip("torch")  # optional: not a dependency of minipar
    spec = bench.spec_of(**TINY, steps=5)
    ours = bench.measure(spec, "minipar", eval_every=1, eval_batches=1)
    theirs = bench.measure(spec, "pytorch", eval_every=1, eval_batches=1)
    assert ours["losses"][0] == pytest.approx(theirs["losses"][0], rel=1e-6)  # same weights
    assert bench.max_relative_difference(ours, theirs) <= bench.AGREEMENT_RTOL["float32"]
    assert len(theirs["validation"]) == 5


def test_in_float64_pytorch_agrees_to_rounding_at_every_step() -> None:
    pytest.importorskip("torch")  # optional: not a dependency of minipar
    spec = bench.spec_of(**TINY, steps=5, precision="float64")
    rows = [bench.measure(spec, side, eval_every=5, eval_batches=1) for side in bench.SIDES]
    a = bench.agreement(rows, "float64")
    assert a["verdict"] == "agree" and a["parts_at"] is None and a["agree_through"] == 5
    assert a["max_relative_difference"] <= 1e-12  # a 5-step run: rounding barely grown


def test_the_rounding_band_is_the_run_one_ulp_away() -> None:
    for precision, eps in (("float32", 1e-7), ("float64", 1e-16)):
        spec = bench.spec_of(**TINY, steps=3, precision=precision)
        row = bench.measure(spec, "minipar", eval_every=3, eval_batches=1, band=True)
        moved = bench.relative_differences(row["band"], row["losses"])
        assert len(moved) == 3 and max(moved) < 1e3 * eps, (precision, moved)  # may be 0
    assert "band" not in bench.measure(spec, "minipar", eval_every=3, eval_batches=1)


def _rows(ours: list[float], ref: list[float], band: list[float] | None = None) -> list[dict]:
    a = {"losses": ours, "validation": [], **({"band": band} if band else {})}
    return [a, {"losses": ref, "validation": []}]


def test_agreement_says_where_float32_parts_and_whether_rounding_explains_it() -> None:
    ref = [4.0, 3.0, 2.0, 1.0]
    a = bench.agreement(_rows([4.0, 3.0 * (1 + 1e-6), 2.0, 1.0], ref), "float32")
    assert (a["verdict"], a["agree_through"], a["parts_at"]) == ("agree", 4, None)
    assert "losses agree" in bench.agreement_line(a, "float32", 4)
    parted = [4.0, 3.0, 2.0 * (1 + 1e-3), 1.0 * (1 + 2e-3)]  # parts at step 3
    band = [x * (1 + e) for x, e in zip(parted, [0, 1e-7, 5e-4, 1e-3])]  # minipar, moved
    a = bench.agreement(_rows(parted, ref, band), "float32")
    assert (a["verdict"], a["agree_through"], a["parts_at"]) == ("rounding", 2, 3)
    assert a["band"] == pytest.approx(1e-3, rel=1e-2)
    line = bench.agreement_line(a, "float32", 4)
    assert "through step 2, part from step 3" in line and "rounding grown by training" in line
    small = [x * (1 + e) for x, e in zip(parted, [0, 0, 0, 1e-5])]  # a band 100x smaller
    a = bench.agreement(_rows(parted, ref, small), "float32")
    assert a["verdict"] == "DIFFER" and "DIFFER" in bench.agreement_line(a, "float32", 4)
    # float64 has no band to hide behind: 1e-7 at a step is a difference
    a = bench.agreement(_rows([4.0, 3.0 * (1 + 1e-7), 2.0, 1.0], ref, band), "float64")
    assert (a["verdict"], a["parts_at"]) == ("DIFFER", 2)


@pytest.mark.parametrize(("argv", "names"), [
    (["--steps", "0"], ["--steps", "a positive integer"]),
    (["--steps", "5", "--eval-every", "6"], ["--eval-every", "at most --steps (5)", "6"]),
    (["--heads", "3"], ["--heads", "--d-model", "128"]),
    (["--lr", "0"], ["--lr", "> 0"]),
    (["--weight-decay", "-1"], ["--weight-decay", ">= 0"]),
    (["--seq", "1000000"], ["too short"]),
    (["--batch", "x"], ["--batch"]),
    (["--precision", "float16"], ["--precision", "float32", "float64"]),
])
def test_bad_options_are_refused_before_any_training(argv: list[str], names: list[str],
                                                     monkeypatch: pytest.MonkeyPatch,
                                                     capsys) -> None:
    def measured(*args: object, **kwargs: object) -> None:
        raise AssertionError("bad input reached the measurement")

    monkeypatch.setattr(bench.subprocess, "run", measured)
    assert cli.main(["bench", "train", *argv]) == 2
    err = capsys.readouterr().err
    lines = [line for line in err.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("minipar bench train"), err
    for name in names:
        assert name in lines[0], (name, lines[0])


def test_an_unknown_side_is_refused() -> None:
    with pytest.raises(ValueError, match="side"):
        bench.measure(bench.spec_of(**TINY, steps=1), "jax", eval_every=1, eval_batches=1)
