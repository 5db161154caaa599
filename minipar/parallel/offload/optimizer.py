"""Optimizer-state offload (ZeRO-Offload) — выгрузка состояний оптимизатора — 优化器状态卸载.

EN ZeRO-Offload (optimizer-state offload) · RU ZeRO-Offload (выгрузка
состояний оптимизатора) · ZH ZeRO-Offload（优化器状态卸载）

Ren, Rajbhandari, Aminabadi, Ruwase, Yang, Zhang, Li & He 2021,
"ZeRO-Offload: Democratizing Billion-Scale Model Training", arXiv 2101.06840.
Of mixed-precision Adam's 16 bytes per parameter, 12 are optimizer states
(fp32 master weights, momentum m, variance v) that only the optimizer step
touches.  ZeRO-Offload keeps them in host memory and runs the step there:
per step and rank, the 16-bit gradient slice goes down to the host, Adam
updates the fp32 master there, and the 16-bit parameters come back up —

    device: 2Ψ params (+ gradients while they stream out),   host: KΨ/N,
    over the link per step: b·Ψ/N down (gradients), b·Ψ/N up (parameters)

(:func:`minipar.plan.zero.zero_offload_bytes`, ``offload_pcie_bytes_per_step``;
divided by N when combined with ZeRO, which shards the states first).
ZeRO-Infinity (Rajbhandari et al. 2021, arXiv 2104.07857) adds NVMe: here
``target="disk"`` keeps the states in ``numpy.memmap`` files in a private
temporary folder and the step reads and writes them there (the operating
system pages them in and out): tracemalloc's count of the engine's memory
drops by the states' bytes.

:class:`OptimizerOffload` does this to a :class:`~minipar.precision.ModelStates`
(the whole model, or ZeRO's shard: ``ZeRO(..., offload_optimizer="host")``).
Its :meth:`~OptimizerOffload.step` is ``ModelStates.step`` with the transfers
written out, the same operations in the same order on the same values, so the
run is bit-identical to no offload (float64 and mixed; tests/test_offload.py).
Under CuPy the step's arithmetic runs on the host with NumPy (the optimizer's
``xp`` is NumPy for the length of the step: :func:`host_math`).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import numpy as np

from minipar import backend, optim
from minipar.parallel.offload.store import Folder, to_file

__all__ = ["OptimizerOffload", "host_math"]


@contextlib.contextmanager
def host_math() -> Iterator[None]:
    """The optimizer's array module is NumPy inside (a no-op under NumPy): the host step."""
    saved = optim.xp
    optim.xp = np
    try:
        yield
    finally:
        optim.xp = saved


class OptimizerOffload:
    """The fp32 master weights and optimizer moments of ``states`` moved to ``target``
    ("host", or "disk": files in a private folder inside ``folder``); :meth:`step`
    updates there."""

    def __init__(self, states: Any, target: str = "host", folder: str | None = None) -> None:
        self.states, self.place = states, target
        self.folder = Folder(folder)
        if states.master is not None:
            states.master = self._away("master", states.master)
        opt = states.optimizer
        for arr in opt.state_arrays():  # m and v (AdamW), buf (SGD), found by identity
            name = next(k for k, v in vars(opt).items() if v is arr)
            setattr(opt, name, self._away(name, arr))

    def _away(self, name: str, a: Any) -> Any:
        """``a`` as a host array (a copy) or a memmap file holding its values."""
        host = backend.host_copy(a)
        return host if self.place == "host" else to_file(self.folder.file(f"{name}.bin"), host)

    def close(self) -> None:
        """Remove the files (disk); the states are gone with them."""
        self.folder.close()

    def step(self, found_inf: bool | None = None) -> bool:
        """``ModelStates.step`` on the host: gradients down, update, parameters up.

        False if skipped (loss scaling found inf/nan: pass ``found_inf`` agreed by
        all ranks, or None for this rank's own slice, as ``ModelStates.step``)."""
        st = self.states
        lo, hi = st.lo, st.hi
        inf = None
        if st.scaler is not None:
            inf = st.local_found_inf() if found_inf is None else bool(found_inf)
        g = backend.host_copy(st.grads[lo:hi])  # device -> host: the gradient slice
        with host_math():
            if st.master is None:  # the optimizer updates the parameters themselves
                up = backend.host_copy(st.params[lo:hi])
                st.optimizer.step(up, g)
            else:
                g = g.astype(st.policy.master_dtype)
                if st.scaler is not None:
                    used = st.scaler.scale
                    st.scaler.update(bool(inf))
                    if inf:
                        return False
                    g *= 1.0 / used
                st.optimizer.step(st.master, g)
                up = st.master.astype(st.policy.param_dtype)
        st.params[lo:hi] = backend.to_device(up)  # host -> device: the updated parameters
        return True
