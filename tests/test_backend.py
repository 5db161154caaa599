"""The array backend: NumPy by default, CuPy on request, and math modules use ``xp``.

The CuPy path never needs a rewrite only if the modules that do math take
their array functions from ``minipar.backend.xp``.  ``test_math_modules_use_xp``
keeps that true: in those modules, ``np.<name>`` may only name dtypes and
types (or host-side set-up explicitly listed below), never compute.
"""

from __future__ import annotations

import ast
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from minipar import backend

PKG = Path(backend.__file__).resolve().parent

#: files whose array math must go through xp (globs relative to the package).
#: The parallel strategies are not listed: they hand host buffers to MPI
#: (staging is the CuPy path without CUDA-aware MPI), so NumPy is right there.
MATH_MODULES = ["nn/*.py", "optim.py", "precision.py"]

#: ``np.<name>`` uses that do no array math: dtypes, type checks, dtype queries
ALLOWED = {
    "dtype", "ndarray", "generic", "number", "integer", "signedinteger", "unsignedinteger",
    "floating", "complexfloating", "bool_", "float16", "float32", "float64", "int8", "int16",
    "int32", "int64", "uint8", "uint16", "uint32", "uint64", "finfo", "iinfo", "issubdtype",
    "result_type", "promote_types", "can_cast",
}

#: host-side set-up that is moved to the device right after (file, name): why
HOST_SIDE = {
    ("nn/init.py", "random"): "the init RNG runs on the host so every backend draws the same numbers",
    ("nn/init.py", "full"): "a constant built on the host, then to_device",
    ("nn/decoding.py", "random"): "the sampling RNG runs on the host so every backend draws the same ids",
}


def _np_attributes(path: Path) -> list[tuple[int, str]]:
    tree = ast.parse(path.read_text(encoding="utf-8"))
    aliases = {a.asname or a.name for node in ast.walk(tree) if isinstance(node, ast.Import)
               for a in node.names if a.name == "numpy"}
    return [(node.lineno, node.attr) for node in ast.walk(tree)
            if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name)
            and node.value.id in aliases]


def test_math_modules_use_xp() -> None:
    files = sorted({p for pattern in MATH_MODULES for p in PKG.glob(pattern)})
    assert any(f.parent.name == "nn" for f in files), "the serial model's modules were not found"
    bad = []
    for f in files:
        rel = f.relative_to(PKG).as_posix()
        for line, attr in _np_attributes(f):
            if attr not in ALLOWED and (rel, attr) not in HOST_SIDE:
                bad.append(f"minipar/{rel}:{line}: np.{attr}")
    assert not bad, "array math must use minipar.backend.xp, not numpy directly:\n" + "\n".join(bad)


def test_numpy_is_the_default_backend() -> None:
    assert backend.xp is np and backend.name == "numpy"
    a = np.arange(5.0)
    assert np.array_equal(backend.to_host(backend.to_device(a)), a)
    assert backend.device_memory_bytes() is None


def _import_with(value: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, backend.BACKEND_ENV: value}
    return subprocess.run([sys.executable, "-c", "import minipar.backend"], env=env,
                          capture_output=True, text=True, timeout=60, check=False)


def test_unknown_backend_is_a_clear_error() -> None:
    proc = _import_with("tensorflow")
    assert proc.returncode != 0
    assert "expected 'numpy', 'cupy' or 'strict'" in proc.stderr


def test_cupy_without_cupy_or_gpu_is_a_clear_error() -> None:
    try:
        import cupy  # noqa: F401
    except ImportError:
        proc = _import_with("cupy")
        assert proc.returncode != 0 and "CuPy is not installed" in proc.stderr
    else:  # pragma: no cover - only on a machine with CuPy
        proc = _import_with("cupy")
        if proc.returncode != 0:
            assert "GPU" in proc.stderr


@pytest.mark.parametrize("value", ["numpy", " NumPy "])
def test_numpy_spellings(value: str) -> None:
    assert _import_with(value).returncode == 0


@pytest.mark.parametrize("value", ["tensorflow", "cupy"])
def test_a_backend_that_cannot_load_is_one_line_before_anything_starts(value: str) -> None:
    """Every verb but ``doctor`` (which reports it among the rest) refuses to start."""
    try:
        import cupy  # noqa: F401
        if value == "cupy":
            pytest.skip("CuPy is installed here")
    except ImportError:
        pass
    env = {**os.environ, backend.BACKEND_ENV: value}
    proc = subprocess.run([sys.executable, "-m", "minipar.cli", "run", "dp", "-n", "2"],
                          env=env, capture_output=True, text=True, timeout=60, check=False)
    assert proc.returncode == 2 and proc.stderr.count("\n") == 1, proc.stderr
    assert proc.stderr.startswith(f"minipar run: {backend.BACKEND_ENV}=")
    doctor = subprocess.run([sys.executable, "-m", "minipar.cli", "doctor"], env=env,
                            capture_output=True, text=True, timeout=120, check=False)
    assert doctor.returncode == 0 and "cannot load" in doctor.stdout
