"""``minipar bench device`` without a GPU: one line, exit 0; and the parts that need no
CuPy (the comparison, the measuring processes, the 2-rank worker, the text) on NumPy and
on the strict stand-in.  The GPU run itself is never part of the suite."""

from __future__ import annotations

import argparse
import json

import pytest

from minipar.bench import device
from conftest import run_minipar

RUN = {"losses": [2.3, 2.1], "params": [0.5, -1.0, 0.25]}


def test_without_a_gpu_one_line_and_exit_0() -> None:
    proc = run_minipar("bench", "device", env={"CUDA_VISIBLE_DEVICES": ""})
    assert proc.returncode == 0 and proc.stderr == "", proc.stderr
    lines = proc.stdout.splitlines()
    assert len(lines) == 1 and lines[0].startswith("minipar bench device: no GPU here: ")
    assert lines[0].endswith("; nothing measured")


def test_without_a_gpu_json_is_one_line(monkeypatch: pytest.MonkeyPatch,
                                        capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setattr(device, "gpu", lambda: (None, "CuPy is not installed"))
    assert device.main(["--json"]) == 0
    out = capsys.readouterr().out
    assert out.count("\n") == 1 and json.loads(out) == {"gpu": None,
                                                       "reason": "CuPy is not installed"}


def test_bad_sizes_are_refused(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as e:
        device.main(["--sizes", "100"])
    assert e.value.code == 2
    assert capsys.readouterr().err == ("minipar bench device: --sizes must be multiples of 8 "
                                       "(the heads), got [100]\n")


def test_compare() -> None:
    assert device.compare(RUN, RUN)["line"] == "equal, bit for bit"
    near = {"losses": RUN["losses"], "params": [0.5 + 1e-16, -1.0, 0.25]}
    r = device.compare(near, RUN)
    assert r["status"] == "equal" and not r["bitwise"]
    assert r["line"].startswith("equal within 1e-12 relative (losses max |d| 0.0e+00, params max "
                                "|d| 1.1e-16 = 1.1e-16 relative)")
    far = {"losses": [2.3, 2.2], "params": RUN["params"]}
    r = device.compare(far, RUN)
    assert r["status"] == "different" and r["line"].startswith("different: losses 4.3e-02 "
                                                                "relative > 1e-12")
    nan = {"losses": [2.3, float("nan")], "params": RUN["params"]}
    assert device.compare(nan, RUN)["line"].startswith("different: losses not finite")
    short = {"losses": RUN["losses"], "params": [0.5]}
    assert device.compare(short, RUN)["line"] == "different: params of shapes (1,) and (3,)"


def test_serial_runs_agree_across_processes_and_with_the_stand_in() -> None:
    """The measuring process on NumPy, and on the strict stand-in (host copies by .get())."""
    a = device.inner("numpy", "serial", ["--steps", "2"], 120)
    b = device.inner("strict", "serial", ["--steps", "2"], 120)
    assert (a["backend"], b["backend"]) == ("numpy", "strict") and len(a["losses"]) == 2
    assert device.compare(b, a)["line"] == "equal, bit for bit"


def test_a_failed_measuring_process_is_one_line() -> None:
    with pytest.raises(RuntimeError, match=r"^serial under bogus exited 1: ValueError: "
                                           r"MINIPAR_BACKEND='bogus'"):
        device.inner("bogus", "serial", ["--steps", "1"], 120)


def test_step_times_on_numpy() -> None:
    rows = device.step_times([8, 16], repeat=1, warmup=0)
    assert [r["d_model"] for r in rows] == [8, 16] and all(r["seconds"] > 0 for r in rows)
    assert rows[0]["params"] < rows[1]["params"]


def test_dp_worker_on_numpy() -> None:
    row = device.dp_run("numpy", 1, 120)
    assert row["backend"] == "numpy" and len(row["losses"]) == 1 and row["params"]
    assert "equal" in row["verdict"]


def test_text_of_a_run_and_its_failures() -> None:
    info = {"count": 1, "name": "NVIDIA H200", "memory": 140 * 2**30, "cupy": "14.2.0",
            "runtime": 13000}
    a = argparse.Namespace(steps=3, repeat=5)
    ok = {**device.compare(RUN, RUN), "verdicts": {"numpy": "equal", "cupy": "equal"}}
    res = {"gpu": info, "serial": device.compare(RUN, RUN), "dp": ok,
           "timing": {"rows": [{"d_model": 128, "params": 1000, "numpy_s": 0.02,
                                "cupy_s": 0.004, "speedup": 5.0}]}}
    text = device.format_text(res, a).splitlines()
    assert text[0] == ("minipar bench device: NVIDIA H200 (1 GPU, 140.0 GiB), CuPy 14.2.0, "
                       "CUDA runtime 13.0")
    assert text[1].endswith("float64, 3 steps), cupy vs numpy: equal, bit for bit")
    assert text[3] == "  numpy: dp vs its serial run: equal"
    assert text[-1].split() == ["128", "1,000", "20.00", "4.00", "5.0x"]
    assert not device.failed(res)
    res["dp"] = {"error": "dp under cupy: rank 1 of 2 failed: TypeError: ..."}
    assert "dp on 2 ranks (float64, 3 steps), cupy vs numpy: failed: dp under cupy" in \
        device.format_text(res, a)
    assert device.failed(res)
