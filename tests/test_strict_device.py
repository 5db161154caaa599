"""The device stand-in itself (minipar.strict_device): it refuses what CuPy refuses, and
more, with the call site in the message; it counts the crossings it allows; and what it
computes is NumPy's result, to the bit.  In process: the module needs no backend set."""

from __future__ import annotations

import os
import subprocess
import sys

import numpy as np
import pytest

from minipar import strict_device as sd

HERE = os.path.basename(__file__)


@pytest.fixture()
def d() -> sd.ndarray:
    return sd.asarray(np.arange(12.0).reshape(3, 4))


# -- refused: what CuPy refuses ---------------------------------------------------------
@pytest.mark.parametrize("call", [
    lambda d: np.asarray(d),                        # implicit conversion (CuPy: TypeError)
    lambda d: np.array(d),
    lambda d: d + np.ones(4),                       # a host array in a device operation
    lambda d: sd.matmul(d, np.ones((4, 2))),        # ... in a device function
    lambda d: d[np.array([0, 1])],                  # ... as an index
    lambda d: d.__setitem__(0, np.zeros(4)),        # ... as a value
    lambda d: memoryview(d),                        # no buffer protocol
    lambda d: d.__cuda_array_interface__,           # no CUDA-aware path chosen
])
def test_refuses_what_cupy_refuses(d: sd.ndarray, call) -> None:
    with pytest.raises(TypeError):
        call(d)


# -- refused: more than CuPy, on purpose ----------------------------------------------
@pytest.mark.parametrize("call, words", [
    (lambda d: np.concatenate([d, d]), "numpy.concatenate called on a device array"),
    (lambda d: np.exp(d), "ufunc exp called on a device array"),
    (lambda d: np.ones(4) + d, "ufunc add called on a device array"),
    (lambda d: np.linalg.norm(d), "called on a device array"),
    (lambda d: np.add.at(d, [0], 1.0), "called on a device array"),
])
def test_refuses_numpy_functions_that_cupy_would_dispatch(d: sd.ndarray, call, words) -> None:
    with pytest.raises(TypeError, match=words) as e:
        call(d)
    assert f"{HERE}:" in str(e.value) and "xp." in str(e.value)  # the call site, the fix


def test_the_message_names_the_line_that_mixed_host_and_device(d: sd.ndarray) -> None:
    with pytest.raises(TypeError) as e:
        np.asarray(d)  # the line named below
    line = sys._getframe().f_lineno - 1
    assert f"{HERE}:{line} in test_the_message_names_the_line" in str(e.value)
    assert "xp.asnumpy" in str(e.value)


def test_host_access_to_the_device_buffer_is_refused(d: sd.ndarray) -> None:
    for name in ("__array_interface__", "__array_struct__", "__dlpack__", "ctypes", "tobytes"):
        with pytest.raises(AttributeError):
            getattr(d, name)


# -- allowed, as in CuPy ------------------------------------------------------------------
def test_host_scalars_mix_freely(d: sd.ndarray) -> None:
    host = np.arange(12.0).reshape(3, 4)
    for got, want in [(np.float64(2.0) * d, 2.0 * host), (d * np.float32(3), host * 3),
                      (1 - d, 1 - host), (d ** 2, host ** 2), (d > 5, host > 5)]:
        assert type(got) is sd.ndarray and np.array_equal(got.get(), want)


def test_results_are_numpys_to_the_bit() -> None:
    rng = np.random.default_rng(0)
    a, b = rng.standard_normal((5, 7)), rng.standard_normal((7, 3))
    da, db = sd.asarray(a), sd.asarray(b)
    assert np.array_equal(sd.matmul(da, db).get(), a @ b)
    assert np.array_equal(sd.einsum("ij,jk->ik", da, db).get(), np.einsum("ij,jk->ik", a, b))
    assert np.array_equal(sd.exp(da).sum(axis=0).get(), np.exp(a).sum(axis=0))
    acc = sd.zeros(4)
    sd.add.at(acc, sd.asarray(np.array([0, 0, 3])), 1.5)  # a ufunc's method
    assert acc.get().tolist() == [3.0, 0.0, 0.0, 1.5]
    c = da.copy()
    c += 1  # in place: the same device array
    c[0] = sd.zeros(7)
    assert np.array_equal(c.get()[1:], a[1:] + 1) and not c.get()[0].any()


def test_reductions_stay_on_the_device_as_0d_arrays(d: sd.ndarray) -> None:
    s = d.sum()
    assert type(s) is sd.ndarray and s.shape == ()


# -- counted crossings --------------------------------------------------------------------
def test_crossings_are_counted(d: sd.ndarray) -> None:
    sd.transfers.reset()
    host = np.ones((2, 8))
    x = sd.asarray(host)  # host -> device: 128 bytes
    assert sd.transfers.h2d_bytes == 128 and sd.transfers.h2d_calls == 1
    float(x.sum()), x[0, 0].item(), bool(x[0, 0] > 0), int(x[1, 1])  # 4 scalar reads
    x.get(), sd.asnumpy(x), x.tolist()  # 3 whole copies
    assert sd.transfers.d2h_calls == 7  # float64 scalars of 8 bytes, a bool of 1
    assert sd.transfers.d2h_bytes == 3 * 8 + 1 + 3 * 128
    sd.asarray(x)  # already on the device: no crossing
    assert sd.transfers.h2d_calls == 1


def test_views_share_device_memory(d: sd.ndarray) -> None:
    """``.data.ptr`` and ``ndarray(shape, dtype, memptr=)``, as the offloading code uses them."""
    row = d[1]
    assert row.data.ptr - d.data.ptr == 4 * 8
    again = sd.ndarray((4,), np.float64, memptr=d.reshape(-1).view(np.uint8).data + 32)
    again[0] = 100.0
    assert d[1, 0].item() == 100.0


def test_the_cuda_array_interface_only_on_a_cuda_aware_path(d, monkeypatch) -> None:
    monkeypatch.setenv(sd.CUDA_AWARE_ENV, "1")
    cai = d.__cuda_array_interface__
    assert cai["shape"] == (3, 4) and cai["typestr"] == "<f8" and cai["version"] == 3


def test_the_backend_selects_it_and_the_serial_model_trains_on_it() -> None:
    """MINIPAR_BACKEND=strict makes it ``xp``; the serial GPT trains on it with the losses of
    NumPy, to the bit."""
    code = ("from minipar import backend\n"
            "from minipar.parallel import strategies\n"
            "from minipar.parallel.common import RunSpec\n"
            "print(backend.name, backend.xp.__name__, backend.device)\n"
            "spec = RunSpec(steps=3)\n"
            "e = strategies.build('serial', spec, None)\n"
            "print(repr([e.step(spec.batch_at(s)).loss for s in range(3)]))\n")
    out = {}
    for name in ("strict", "numpy"):
        proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                              timeout=120, check=False, env={**os.environ, "MINIPAR_BACKEND": name})
        assert proc.returncode == 0, proc.stderr[-2000:]
        out[name] = proc.stdout.splitlines()
    assert out["strict"][0] == "strict minipar.strict_device True"
    assert out["strict"][1] == out["numpy"][1]


def test_staging_reuses_one_host_buffer_per_message_size() -> None:
    from minipar.comm.staging import HostBuffers

    pool = HostBuffers()
    a = pool.take(64)
    b = pool.take(64)  # in flight at once: two buffers
    pool.give(a)
    pool.give(b)
    assert pool.take(64) is b and pool.take(64) is a and pool.made == 2
    assert pool.take(32).nbytes == 32 and pool.made == 3


def test_a_views_base_is_the_device_array_that_owns_it() -> None:
    """``base`` as in CuPy, the same object each time: the memory ledgers find a view's
    owner through it (``minipar.trees.owner``), as under NumPy."""
    from minipar import trees

    a = sd.zeros((4, 4))
    assert a.base is None and a[1:].base is a and trees.owner(a.reshape(-1)[2:]) is a


def test_numpy_names_cupy_lacks_are_refused(d: sd.ndarray) -> None:
    """As on a GPU (found there: ``xp.errstate`` failed under CuPy 14.2)."""
    for name in ("errstate", "matrix", "memmap", "nditer"):
        with pytest.raises(AttributeError, match="CuPy has no"):
            getattr(sd, name)
    with pytest.raises(AttributeError):
        d.resize((2, 6))
    assert sd.einsum is sd.einsum and sd.float32 is np.float32  # what CuPy has, kept
