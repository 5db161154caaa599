"""Keeping freed host memory for the next step — сохранение освобождённой памяти — 保留已释放的主机内存.

EN freed memory kept for reuse (allocator tuning) · RU повторное использование
освобождённой памяти (настройка аллокатора) · ZH 复用已释放内存（分配器调优）

A training step allocates and frees the same large arrays every step:
activations, gradients, the temporaries of every layer and of the
collectives.  On Linux, NumPy's memory comes from glibc's ``malloc``, which
serves a block of 128 KiB or more with a fresh ``mmap`` and hands it back to
the kernel at ``free``, and gives the free top of its heap back too
(``M_TRIM_THRESHOLD``).  The next step's array is then new memory again, and
the kernel faults in and zeroes each 4 KiB page at its first touch.  The
same GPT as ``minipar bench dp`` (d_model 256, 4 layers, T 64, float32, one
thread, 2026-12-04): **20,462 page faults per step at batch 16 and 25,626 at
batch 32, 34-121 ms of kernel time per step** (11-18 % of the step).  MPI's
own 1 MiB all-reduce between 2 ranks, whose output NumPy allocates afresh per
call, took 833 us that way and 209 us without the faults (the same sitting).

:func:`keep_freed_memory` tells ``malloc`` to keep what is freed: blocks up
to :data:`MMAP_MAX_BYTES` come from the heap (``M_MMAP_THRESHOLD``), and the
heap is not trimmed below :data:`TRIM_BYTES` (``M_TRIM_THRESHOLD``), so from
the second step on every array reuses memory the process already has: 0 page
faults per step.  This is what a GPU framework's caching allocator does for
device memory (PyTorch keeps freed CUDA blocks for the next request).  The
price: a process's resident memory stays at its peak instead of shrinking
between steps.  What minipar *measures* as memory (:mod:`minipar.memory`,
tracemalloc's count of live arrays) does not change.

Only the entry points call it: the ``minipar`` command (:mod:`minipar.cli`)
and every rank (:mod:`minipar.launch.rank`), so ``import minipar`` changes
nothing in the process of a notebook or a test (the ranks they launch do keep
freed memory).  It also sets glibc's own environment
variables for the same settings (``MALLOC_MMAP_THRESHOLD_``,
``MALLOC_TRIM_THRESHOLD_``; unless they are set already), so the processes a
command starts (a benchmark's measuring subprocess, mpiexec's ranks) keep
freed memory from their first allocation.  It does nothing
where ``malloc`` is not glibc's (macOS, musl) and when
``MINIPAR_KEEP_FREED_MEMORY=0`` (or ``false``, ``no``, ``off``; to measure the
difference: run a benchmark with and without it).
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os
import sys

#: blocks up to this many bytes come from the heap, not from a fresh mmap (glibc's
#: largest allowed value on 64-bit: 32 MiB)
MMAP_MAX_BYTES = 32 << 20
#: free memory at the heap's top is given back to the kernel only above this
TRIM_BYTES = 1 << 30
ENV = "MINIPAR_KEEP_FREED_MEMORY"
#: the values of :data:`ENV` that turn it off (anything else, or unset: on)
OFF = ("0", "false", "no", "off")
_M_TRIM_THRESHOLD, _M_MMAP_THRESHOLD = -1, -3  # glibc's malloc.h
_state: list[str] = []


def keep_freed_memory() -> str:
    """Tell glibc's ``malloc`` to keep freed blocks for reuse (module docstring); once per
    process.  Returns what happened, one phrase for ``minipar doctor``: ``"kept for reuse
    (glibc mallopt; MINIPAR_KEEP_FREED_MEMORY=0 turns it off)"``, ``"given back to the
    kernel, glibc's defaults (MINIPAR_KEEP_FREED_MEMORY=0)"`` (the value as given) or
    ``"the system's default (not glibc)"``."""
    if _state:
        return _state[0]
    raw = os.environ.get(ENV, "").strip()
    if raw.lower() in OFF:
        _state.append(f"given back to the kernel, glibc's defaults ({ENV}={raw})")
    elif not sys.platform.startswith("linux"):
        _state.append("the system's default (not glibc)")
    else:
        try:
            libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
            mallopt = libc.mallopt
        except (OSError, AttributeError):  # musl has no mallopt
            mallopt = None
        ok = (mallopt is not None and mallopt(_M_MMAP_THRESHOLD, MMAP_MAX_BYTES) == 1
              and mallopt(_M_TRIM_THRESHOLD, TRIM_BYTES) == 1)
        if ok:  # the processes this one starts: glibc reads these at their start
            os.environ.setdefault("MALLOC_MMAP_THRESHOLD_", str(MMAP_MAX_BYTES))
            os.environ.setdefault("MALLOC_TRIM_THRESHOLD_", str(TRIM_BYTES))
        on = "kept for reuse (glibc mallopt; " + (
            f"{ENV}={raw!r} is not one of {', '.join(OFF)}, so on)" if raw and raw.lower() not in
            ("1", "true", "yes", "on") else f"{ENV}=0 turns it off)")
        _state.append(on if ok else "the system's default (not glibc)")
    return _state[0]


def status() -> str:
    """What :func:`keep_freed_memory` did in this process (``"not asked"`` before it ran)."""
    return _state[0] if _state else "not asked (the system's default)"
