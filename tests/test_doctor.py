"""``minipar doctor`` and the GPU extras: one line per probe, a failing probe is its line,
the CUDA-aware rules, and pyproject's extras naming CuPy's wheels (no network)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from minipar import cli
from minipar.cli import doctor

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10
    import tomli as tomllib

ROOT = Path(__file__).resolve().parents[1]
LABELS = ["Python", "NumPy", "mpi4py", "MPI", "backend", "CuPy", "device", "CUDA-aware MPI",
          "host memory"]
PYPI = ("MPICH Version:      5.0.2\nMPICH Custom Information:\t"
        "https://pypi.org/p/mpich/5.0.2/")


def test_gpu_extras_name_the_cupy_wheels() -> None:
    """The source distribution ``cupy`` compiles for many minutes: the extras name wheels."""
    extras = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))[
        "project"]["optional-dependencies"]
    assert extras["gpu-cuda12"] == ["cupy-cuda12x>=14"]
    assert extras["gpu-cuda13"] == ["cupy-cuda13x>=14"]
    assert extras.get("gpu", extras["gpu-cuda12"]) == extras["gpu-cuda12"]  # old name: an alias
    named = [r for reqs in extras.values() for r in reqs if r.lower().startswith("cupy")]
    assert all(r.startswith(("cupy-cuda12x", "cupy-cuda13x")) for r in named), named


def test_doctor_prints_one_line_per_probe(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["doctor"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert [ln.split("  ")[0] for ln in lines[:len(LABELS)]] == LABELS
    assert all(ln.startswith("fix ") for ln in lines[len(LABELS):]) and len(lines) > len(LABELS)
    mpi = next(ln for ln in lines if ln.startswith("MPI "))
    assert "MPI standard" in mpi and "failed" not in mpi
    aware = next(ln for ln in lines if ln.startswith("CUDA-aware MPI"))
    assert aware.split()[2] in ("yes", "no", "unknown") and "(" in aware


def test_doctor_json_is_the_same(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["doctor", "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert list(data["lines"]) == LABELS and data["fix"]
    assert data["cuda_aware_mpi"] in ("yes", "no", "unknown") and data["cuda_aware_rule"]


def test_a_failing_probe_is_its_line(monkeypatch: pytest.MonkeyPatch,
                                     capsys: pytest.CaptureFixture[str]) -> None:
    def broken(*a: object, **k: object) -> None:
        raise RuntimeError("the MPI probe exited 1: MPIR_Init_thread: no network\nmore")

    monkeypatch.setattr(doctor, "mpi_probe", broken)
    monkeypatch.setattr(doctor, "cupy_probe", lambda: 1 / 0)
    assert cli.main(["doctor"]) == 0
    out = capsys.readouterr().out
    assert ("MPI             failed: RuntimeError: the MPI probe exited 1: MPIR_Init_thread: "
            "no network more\n") in out
    assert "CuPy            failed: ZeroDivisionError: division by zero\n" in out
    assert "MPI does not start" in out


def test_the_mpi_probe_asks_the_library() -> None:
    mpi = doctor.mpi_probe()
    assert mpi["library"] and mpi["standard"].count(".") == 1
    assert mpi["query"] in (0, 1, None)


@pytest.mark.parametrize("env, mpi, answer, rule", [
    ("1", None, "yes", "MINIPAR_CUDA_AWARE_MPI=1 says so"),
    ("0", {"library": PYPI, "query": 1, "query_lib": "libmpi.so.12"}, "no",
     "MINIPAR_CUDA_AWARE_MPI=0 says so; the library says yes"),
    (None, {"library": PYPI, "query": 0, "query_lib": "libmpi.so.12"}, "no",
     "MPIX_Query_cuda_support() of libmpi.so.12 returned 0: the mpich wheel from PyPI is "
     "built without CUDA"),
    (None, {"library": "MPICH Version: 4.2", "query": 1, "query_lib": "libmpi.so.12"}, "yes",
     "MPIX_Query_cuda_support() of libmpi.so.12 returned 1"),
    (None, {"library": PYPI, "query": None}, "no",
     "the mpich wheel from PyPI is built without CUDA"),
    (None, {"library": "Open MPI v5.0.8", "query": None}, "yes",
     "ompi_info: mpi_built_with_cuda_support is true"),
    (None, {"library": "Intel(R) MPI Library 2021", "query": None}, "unknown",
     "mpi4py has no query for it and Intel(R) MPI Library 2021 exports no "
     "MPIX_Query_cuda_support"),
    (None, None, "unknown", "mpi4py has no query for it"),
    ("yes", None, "unknown", "mpi4py has no query for it"),  # neither 1 nor 0: ignored
])
def test_cuda_aware_rules(env, mpi, answer, rule) -> None:
    got = doctor.cuda_aware(env, mpi, ompi=lambda: True)
    assert (got["answer"], got["rule"][:len(rule)]) == (answer, rule)


def test_fixes_say_what_to_do() -> None:
    unknown = {"answer": "unknown", "rule": "", "library_says": None}
    no = {"answer": "no", "rule": "", "library_says": "no"}
    wrong = {"answer": "yes", "rule": "", "library_says": "no"}
    gpu = [{"name": "NVIDIA H200", "memory": 150 * 2**30}]
    missing = doctor.fixes("cupy", None, "failed: RuntimeError: x", {"installed": False}, [],
                           None, None, None)
    assert missing[0].startswith("MINIPAR_BACKEND=cupy needs CuPy: pip install "
                                 "'minipar[gpu-cuda12]'")
    assert doctor.fixes(None, "numpy", None, {"installed": False}, [], no, None, None) == [
        "nothing to fix"]
    assert doctor.fixes(None, "numpy", None, {"installed": True}, gpu, no, None, None) == [
        "this machine has a GPU: MINIPAR_BACKEND=cupy runs minipar on it"]
    staged = doctor.fixes("cupy", "cupy", None, {"installed": True}, gpu, unknown, None, None)
    assert staged == ["set MINIPAR_CUDA_AWARE_MPI=1 if your MPI is CUDA-aware; device buffers "
                      "are staged through host memory otherwise (a copy each way per message)"]
    assert "unset it" in doctor.fixes("cupy", "cupy", None, {"installed": True}, gpu, wrong,
                                      None, "1")[0]
    assert doctor.fixes(None, "numpy", None, None, [], no, None, "maybe") == [
        "MINIPAR_CUDA_AWARE_MPI='maybe' is neither 1 nor 0: it is ignored"]


def test_gpus_text() -> None:
    gpus = [{"name": "NVIDIA H200", "memory": 150 * 2**30},
            {"name": "NVIDIA H200", "memory": 2**30}]
    assert doctor.gpus_text(gpus[:1]) == "1 GPU: 0 NVIDIA H200 (150.0 GiB)"
    assert doctor.gpus_text(gpus) == "2 GPUs: 0 NVIDIA H200 (150.0 GiB), 1 NVIDIA H200 (1.0 GiB)"


def test_a_hostfile_that_is_not_there_is_refused_in_one_line(
        capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["doctor", "--hostfile", "/no/such/hosts"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("minipar doctor: ") and "--hostfile" in err[0]


def test_the_hosts_of_a_hostfile(tmp_path) -> None:
    hosts = tmp_path / "hosts"
    hosts.write_text("# the cluster\nnode1:4\nnode2 # the second\n\n10.0.0.3:2\n")
    assert doctor.read_hosts(str(hosts)) == ["node1", "node2", "10.0.0.3"]


def test_a_bad_heartbeat_setting_is_one_launch_error(monkeypatch: pytest.MonkeyPatch,
                                                     tmp_path) -> None:
    from minipar import launch

    hosts = tmp_path / "hosts"
    hosts.write_text("localhost\n")
    monkeypatch.setenv("MINIPAR_HEARTBEAT_S", "soon")
    with pytest.raises(launch.LaunchError, match=r"^MINIPAR_HEARTBEAT_S='soon': seconds"):
        launch.run(1, "minipar.cli.demo", timeout=30, hostfile=hosts)
