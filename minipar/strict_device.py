"""A strict stand-in for a GPU array module: CuPy's rules, enforced on NumPy, no GPU needed.

EN device stand-in · RU имитация устройства · ZH 设备替身

minipar's math takes its array functions from ``minipar.backend.xp``, so that
``MINIPAR_BACKEND=cupy`` runs it on a GPU.  Without a GPU nothing would notice the
places where host code and device code mix, which is where CuPy fails: NumPy handed
a device array, a device array handed to MPI without a CUDA-aware library, a loss
read back with ``float()`` in a hot loop (a synchronising copy).  ``MINIPAR_BACKEND=
strict`` selects this module instead: every array it makes is a :class:`ndarray`
wrapping a NumPy array ("device memory") that

- refuses NumPy: ``np.asarray(d)`` (``__array__``), ``np.concatenate([d])``
  (``__array_function__``), ``np.exp(d)`` (``__array_ufunc__``) and the buffer
  protocol (``memoryview``, mpi4py) raise ``TypeError`` naming the call site.
  CuPy would dispatch the middle two to itself; the stand-in is stricter on
  purpose, so a strategy that calls NumPy on a device array is caught here;
- refuses host arrays in its own functions and operators (``d + np.ones(3)``,
  ``xp.matmul(d, host)``, ``d[host_index]``), as CuPy does: move them with
  :func:`asarray` first;
- **counts** every crossing it allows: device→host by :func:`asnumpy`,
  ``.get()``, ``float()``, ``int()``, ``bool()``, ``.item()`` and ``.tolist()``;
  host→device by :func:`asarray`/:func:`array` of a host array (``transfers``);
- offers ``__cuda_array_interface__`` only when ``MINIPAR_CUDA_AWARE_MPI=1``:
  then a device buffer goes to MPI directly, as with a CUDA-aware MPI library
  (the pointer is host memory here, so plain MPICH can use it).

Host scalars (Python numbers, NumPy scalars) mix freely, as in CuPy.  Everything
else is NumPy's own function on the wrapped arrays, so a run under the stand-in
gives bit for bit the results of a run under NumPy.
"""

from __future__ import annotations

import dis
import os
import sys
import weakref
from typing import Any

import numpy as np

CUDA_AWARE_ENV = "MINIPAR_CUDA_AWARE_MPI"


class Transfers:
    """Bytes and calls across the host/device boundary, each way (this process)."""

    def __init__(self) -> None:
        self.reset()

    def reset(self) -> None:
        self.d2h_bytes = self.d2h_calls = self.h2d_bytes = self.h2d_calls = 0

    def d2h(self, nbytes: int) -> None:
        self.d2h_bytes += int(nbytes)
        self.d2h_calls += 1

    def h2d(self, nbytes: int) -> None:
        self.h2d_bytes += int(nbytes)
        self.h2d_calls += 1

    def as_dict(self) -> dict[str, int]:
        return {"d2h_bytes": self.d2h_bytes, "d2h_calls": self.d2h_calls,
                "h2d_bytes": self.h2d_bytes, "h2d_calls": self.h2d_calls}


#: NumPy's public names that CuPy does not have (read off NumPy 2.5.2 and CuPy 14.2.0 on an
#: H200, 2026-12-04): the stand-in refuses them as CuPy would, with an AttributeError
_NOT_IN_CUPY = frozenset("""
    False_ ScalarType True_ asmatrix block bmat busday_count busday_offset
    busdaycalendar bytes_ char character clongdouble complex256 core ctypeslib
    datetime64 datetime_as_string datetime_data dtypes einsum_path emath errstate f2py
    flexible float128 frompyfunc fromregex geomspace get_include getbufsize geterr
    geterrcall histogram_bin_edges info insert is_busday isnat little_endian longdouble
    ma matrix matvec memmap nanpercentile nanquantile ndenumerate nditer nested_iters
    object_ polyder polydiv polyint rec recarray record sctypeDict setbufsize seterr
    seterrcall show_runtime spacing str_ strings test timedelta64 typecodes unstack
    vecdot vecmat void
""".split())
#: NumPy array methods CuPy's arrays do not have (the same reading)
_NOT_ON_CUPY_ARRAYS = frozenset(("ctypes", "getfield", "resize", "setfield", "setflags",
                                 "to_device", "tobytes", "tofile"))


#: the crossings this process made (minipar.backend.transfers() reads them; a run
#: summary shows them, minipar.run.summary)
transfers = Transfers()


def _site() -> str:
    """``file:line in function`` of the first caller outside this module (and NumPy)."""
    f = sys._getframe(1)
    while f is not None and (f.f_code.co_filename == __file__
                             or os.sep + "numpy" + os.sep in f.f_code.co_filename):
        f = f.f_back
    if f is None:
        return "an unknown place"
    return f"{f.f_code.co_filename}:{f.f_lineno} in {f.f_code.co_name}"


def _refuse(what: str, fix: str) -> TypeError:
    return TypeError(f"{what} at {_site()}: {fix} (MINIPAR_BACKEND=strict, the device stand-in)")


def _host_array(x: Any) -> bool:
    return isinstance(x, np.ndarray)


def _unwrap(x: Any, where: str) -> Any:
    """The NumPy array inside a device array; lists and tuples walked; a host array refused."""
    if type(x) is ndarray:
        return x._a
    if _host_array(x):
        raise _refuse(f"a host (NumPy) array of shape {x.shape} passed to {where}",
                      "move it to the device with xp.asarray(...) first")
    if isinstance(x, (list, tuple)):
        return type(x)(_unwrap(v, where) for v in x)
    return x


def _wrap(r: Any) -> Any:
    """Results back as device arrays (NumPy scalars too: CuPy returns 0-d arrays)."""
    if isinstance(r, (np.ndarray, np.generic)) and not isinstance(r, (np.dtype,)):
        return ndarray._of(np.asarray(r) if isinstance(r, np.generic) else r)
    if isinstance(r, tuple):
        return tuple(_wrap(v) for v in r)
    if isinstance(r, list):
        return [_wrap(v) for v in r]
    return r


def _device_call(fn: Any, where: str) -> Any:
    def call(*args: Any, **kwargs: Any) -> Any:
        args = tuple(_unwrap(a, where) for a in args)
        kwargs = {k: _unwrap(v, where) for k, v in kwargs.items()}
        return _wrap(fn(*args, **kwargs))

    call.__name__ = call.__qualname__ = getattr(fn, "__name__", where)
    call.__doc__ = f"NumPy's ``{where}`` on device arrays (the stand-in)."
    return call


#: the device array of each wrapped NumPy array still alive (by the NumPy array's id)
_LIVE: weakref.WeakValueDictionary[int, ndarray] = weakref.WeakValueDictionary()


def _device_base(a: np.ndarray) -> ndarray | None:
    """The device array of ``a.base`` (None if ``a`` owns its memory): held by the view, as
    CuPy's views hold their base, so it stays the same object while any view lives."""
    b = a.base
    if not isinstance(b, np.ndarray):
        return None
    d = _LIVE.get(id(b))
    return d if d is not None and d._a is b else ndarray._of(b)


class ufunc:  # noqa: N801 - named as NumPy's and CuPy's
    """A NumPy ufunc on device arrays: called, or by its methods (``xp.add.at(...)``)."""

    def __init__(self, f: np.ufunc) -> None:
        self._f = f
        self.__name__ = f.__name__
        self._call = _device_call(f, f.__name__)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self._call(*args, **kwargs)

    def __getattr__(self, name: str) -> Any:
        v = getattr(self._f, name)
        return _device_call(v, f"{self.__name__}.{name}") if callable(v) else v


class Flags:
    """An array's flags as CuPy has them: ``c_contiguous``, ``f_contiguous``, ``owndata``
    (no ``writeable``, no ``aligned``: code that reads them fails here as on a GPU)."""

    __slots__ = ("c_contiguous", "f_contiguous", "owndata")

    def __init__(self, f: Any) -> None:
        self.c_contiguous, self.f_contiguous, self.owndata = (
            f.c_contiguous, f.f_contiguous, f.owndata)


class MemoryPointer:
    """A device address (``ndarray.data``): a buffer and a byte offset into it, as CuPy's."""

    def __init__(self, base: np.ndarray, offset: int = 0) -> None:
        self.base, self.offset = base, offset

    @property
    def ptr(self) -> int:
        return int(self.base.__array_interface__["data"][0]) + self.offset

    def __add__(self, n: int) -> MemoryPointer:
        return MemoryPointer(self.base, self.offset + int(n))


#: the binary-operator opcodes a NumPy scalar's operator reaches __array_ufunc__ from
_OPERATOR_OPS = {op for name, op in dis.opmap.items()
                 if name.startswith(("BINARY_", "INPLACE_", "COMPARE_OP"))}


def _from_operator(frame: Any) -> bool:
    """Whether ``frame`` is executing an operator (``np.float64(2) * d``), not a call."""
    try:
        return frame.f_code.co_code[frame.f_lasti] in _OPERATOR_OPS
    except (AttributeError, IndexError):
        return False


class ndarray:  # noqa: N801 - named as CuPy's (and NumPy's) array type
    """A device array of the stand-in: a NumPy array that refuses to be used as one.

    ``ndarray(shape, dtype, memptr=, strides=)`` makes a view of device memory, as
    ``cupy.ndarray`` does; the stand-in's own functions make the rest."""

    __slots__ = ("_a", "_base", "__weakref__")
    __hash__ = None  # type: ignore[assignment]  # == is elementwise

    def __init__(self, shape: Any, dtype: Any = float, memptr: MemoryPointer | None = None,
                 strides: Any = None) -> None:
        if memptr is None:
            self._a = np.empty(shape, dtype)
        else:
            self._a = np.ndarray(shape, dtype, buffer=memptr.base, offset=memptr.offset,
                                 strides=strides)
        self._base = _device_base(self._a)

    @classmethod
    def _of(cls, a: np.ndarray) -> ndarray:
        d = object.__new__(cls)
        d._a = a
        d._base = _device_base(a)
        _LIVE[id(a)] = d  # so that a view's ``base`` is this very object
        return d

    @property
    def base(self) -> ndarray | None:
        """The device array that owns this view's memory (None if it owns its own), the
        same object each time, as in CuPy."""
        return self._base

    # -- what NumPy and MPI may not do with it ----------------------------------
    def __array__(self, *args: Any, **kwargs: Any) -> Any:
        raise _refuse("implicit conversion of a device array to NumPy (np.asarray/np.array)",
                      "copy it to the host with xp.asnumpy(a) or a.get(), or stay on the device")

    def __array_function__(self, func: Any, types: Any, args: Any, kwargs: Any) -> Any:
        raise _refuse(f"NumPy's {func.__module__}.{func.__name__} called on a device array",
                      f"use xp.{func.__name__} (minipar.backend.xp)")

    def __array_ufunc__(self, ufunc: Any, method: str, *inputs: Any, **kwargs: Any) -> Any:
        if (method == "__call__" and not kwargs and _from_operator(sys._getframe(1))
                and not any(_host_array(x) for x in inputs)):
            # a NumPy scalar on an operator's left (np.float64(lr) * g): host scalar, as CuPy
            return _wrap(ufunc(*(_unwrap(x, ufunc.__name__) for x in inputs)))
        raise _refuse(f"NumPy's ufunc {ufunc.__name__} called on a device array",
                      f"use xp.{ufunc.__name__} (minipar.backend.xp)")

    @property
    def __cuda_array_interface__(self) -> dict[str, Any]:
        if os.environ.get(CUDA_AWARE_ENV, "") != "1":
            raise _refuse("a device array handed to MPI (or another library) as device "
                          "memory with no CUDA-aware path chosen",
                          f"stage it through the host, or set {CUDA_AWARE_ENV}=1")
        i = self._a.__array_interface__
        return {"shape": i["shape"], "typestr": i["typestr"], "data": i["data"],
                "strides": i.get("strides"), "version": 3}

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__") or name in _NOT_ON_CUPY_ARRAYS:
            # __array_interface__, __array_struct__, __dlpack__, ctypes: host access, refused
            raise AttributeError(f"'ndarray' (the device stand-in, as CuPy's) has no "
                                 f"attribute {name!r}")
        v = getattr(self._a, name)
        return _device_call(v, f"ndarray.{name}") if callable(v) else _wrap(v)

    # -- allowed, counted crossings ---------------------------------------------
    def get(self, stream: Any = None, out: np.ndarray | None = None) -> np.ndarray:
        """A host copy (device→host, counted); into ``out`` when given, as CuPy's."""
        transfers.d2h(self._a.nbytes)
        if out is None:
            return np.array(self._a, copy=True)
        np.copyto(out, self._a)
        return out

    def set(self, host: np.ndarray) -> None:
        """Fill from a host array of the same shape (host→device, counted), as CuPy's."""
        transfers.h2d(host.nbytes)
        np.copyto(self._a, host)

    def item(self) -> Any:
        transfers.d2h(self._a.itemsize)
        return self._a.item()

    def tolist(self) -> Any:
        transfers.d2h(self._a.nbytes)
        return self._a.tolist()

    def __float__(self) -> float:
        transfers.d2h(self._a.itemsize)
        return float(self._a)

    def __int__(self) -> int:
        transfers.d2h(self._a.itemsize)
        return int(self._a)

    def __bool__(self) -> bool:
        transfers.d2h(self._a.itemsize)
        return bool(self._a)

    def __complex__(self) -> complex:
        transfers.d2h(self._a.itemsize)
        return complex(self._a)

    def __repr__(self) -> str:
        return f"device_array({np.array2string(self._a, threshold=8)}, dtype={self._a.dtype})"

    # -- shape, dtype and the rest of an array's face ------------------------------
    shape = property(lambda self: self._a.shape)
    dtype = property(lambda self: self._a.dtype)
    ndim = property(lambda self: self._a.ndim)
    size = property(lambda self: self._a.size)
    nbytes = property(lambda self: self._a.nbytes)
    itemsize = property(lambda self: self._a.itemsize)
    strides = property(lambda self: self._a.strides)
    flags = property(lambda self: Flags(self._a.flags))
    T = property(lambda self: ndarray._of(self._a.T))
    real = property(lambda self: ndarray._of(self._a.real))
    imag = property(lambda self: ndarray._of(self._a.imag))

    @property
    def data(self) -> MemoryPointer:
        """The device address of the first element (``.ptr``), as CuPy's."""
        base = self._a
        while isinstance(base.base, np.ndarray):
            base = base.base
        flat = base.reshape(-1).view(np.uint8) if base.flags.c_contiguous else base
        offset = (int(self._a.__array_interface__["data"][0])
                  - int(base.__array_interface__["data"][0]))
        return MemoryPointer(flat, offset)

    def __len__(self) -> int:
        return len(self._a)

    def __iter__(self) -> Any:
        return (_wrap(row) for row in self._a)

    def __getitem__(self, key: Any) -> Any:
        return _wrap(self._a[_unwrap(key, "indexing")])

    def __setitem__(self, key: Any, value: Any) -> None:
        self._a[_unwrap(key, "indexing")] = _unwrap(value, "item assignment")


def _operator(name: str) -> Any:
    op = getattr(np.ndarray, name)

    def method(self: ndarray, *args: Any) -> Any:
        r = op(self._a, *(_unwrap(a, f"operator {name}") for a in args))
        if r is NotImplemented:
            return r
        if name.startswith("__i"):  # in place: the same device array
            return self
        return _wrap(r)

    method.__name__ = method.__qualname__ = name
    return method


for _name in ("add", "sub", "mul", "truediv", "floordiv", "mod", "pow", "matmul", "and",
              "or", "xor", "lshift", "rshift"):
    for _form in (f"__{_name}__", f"__r{_name}__", f"__i{_name}__"):
        setattr(ndarray, _form, _operator(_form))
for _form in ("__lt__", "__le__", "__eq__", "__ne__", "__gt__", "__ge__", "__neg__",
              "__pos__", "__abs__", "__invert__", "__divmod__", "__rdivmod__"):
    setattr(ndarray, _form, _operator(_form))


# -- the module's functions: CuPy's names ------------------------------------------
def asarray(a: Any, dtype: Any = None, order: Any = None) -> ndarray:
    """``a`` on the device: a device array as it is (or cast), host data copied (counted)."""
    if type(a) is ndarray:
        return a if dtype is None or a.dtype == dtype else ndarray._of(a._a.astype(dtype))
    host = np.asarray(a, dtype=dtype, order=order)
    transfers.h2d(host.nbytes)
    return ndarray._of(np.array(host, copy=True))


def array(a: Any, dtype: Any = None, copy: bool = True, order: Any = "K") -> ndarray:
    """A new device array holding ``a`` (host data: counted host→device)."""
    if type(a) is ndarray:
        return ndarray._of(np.array(a._a, dtype=dtype, copy=copy, order=order))
    host = np.array(a, dtype=dtype, order=order)
    transfers.h2d(host.nbytes)
    return ndarray._of(host)


def asnumpy(a: Any, stream: Any = None, out: np.ndarray | None = None) -> np.ndarray:
    """A host copy of a device array (device→host, counted); host data as it is."""
    if type(a) is ndarray:
        return a.get(out=out)
    return np.asarray(a)


def get_array_module(*args: Any) -> Any:
    """This module if any argument is a device array, NumPy otherwise (as CuPy's)."""
    return sys.modules[__name__] if any(type(a) is ndarray for a in args) else np


#: NumPy names that are types, constants or submodules, not array functions: passed as
#: they are (dtypes are host objects in CuPy too)
_PLAIN = (type, np.dtype, float, int, bool)


def __getattr__(name: str) -> Any:
    """Any other NumPy function, made a device function (PEP 562): device arrays in,
    device arrays out, host arrays refused."""
    if name.startswith("__"):
        raise AttributeError(name)
    if name in _NOT_IN_CUPY:
        raise AttributeError(f"CuPy has no xp.{name} (nor has the device stand-in): "
                             "write it with what both NumPy and CuPy offer")
    try:
        v = getattr(np, name)
    except AttributeError:
        raise AttributeError(f"the device stand-in has no {name!r} (NumPy has none)") from None
    if isinstance(v, _PLAIN) or not callable(v):
        return v
    f = ufunc(v) if isinstance(v, np.ufunc) else _device_call(v, name)
    globals()[name] = f  # made once
    return f
