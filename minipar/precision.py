"""Mixed-precision training — обучение со смешанной точностью — 混合精度训练.

Micikevicius et al. 2017, "Mixed Precision Training", arXiv 1710.03740;
the memory accounting of ZeRO (Rajbhandari et al. 2019, arXiv 1910.02054):
with Adam, a replica holds per parameter

    2 (16-bit params) + 2 (16-bit grads) + 4 + 4 + 4 (fp32 master, m, v) = 16 bytes,

which tests/test_precision.py measures on real arrays (``ModelStates``).

A precision is a *policy*, not a separate code path: the model runs in
whatever dtype its parameters have (``GPTConfig.dtype``), and a policy says
which dtype that is and what the optimizer keeps:

=============  ===========  ===========  ==============  ============
policy         params/acts  grads        master weights  Adam m, v
=============  ===========  ===========  ==============  ============
``float64``    float64      float64      (the params)    float64
``float32``    float32      float32      (the params)    float32
``mixed``      bfloat16     bfloat16     float32         float32
``mixed-fp16`` float16      float16      float32         float32, + dynamic loss scaling
``fp8``        float32      float32      (the params)    float32; the blocks' GEMMs in FP8
=============  ===========  ===========  ==============  ============

Why bfloat16 for ``mixed``: it keeps float32's 8-bit exponent (range
~1e-38 … 3e38) and gives up mantissa (8 bits), so gradients neither
underflow nor overflow and no loss scaling is needed; float16 (5-bit
exponent, smallest normal 6e-5) flushes small gradients to zero unless the
loss is multiplied by a large scale first — ``mixed-fp16`` shows that
machinery (``DynamicLossScaler``: halve the scale and skip the step on
inf/nan, double it after ``growth_interval`` clean steps).  Both are 2
bytes, so the 16-bytes-per-parameter count is the same.  NumPy has no
16-bit BLAS: layers store 16-bit and compute matmuls in float32
(``minipar.nn.dtypes``).  bfloat16 comes from ``ml_dtypes`` (NumPy only).

``fp8`` (DeepSeek-V3, arXiv 2412.19437, §3.3): every linear layer of a transformer
block runs its three GEMMs with FP8 inputs (``minipar.nn.fp8``: E4M3 in 1×128 tiles
and 128×128 blocks, FP32 accumulation promoted every 128; ``--fp8-scaling tensor``
the per-tensor recipe of Micikevicius et al. 2022).  The parameters *are* the FP32
master weights — quantized on the fly for each GEMM, never stored in FP8 — and
AdamW's moments are FP32: DeepSeek-V3 keeps its moments in BF16, FP32 is minipar's
choice (one fewer rounding to explain).  The embedding, the output head, the
LayerNorms, attention's scores and softmax and the MoE router stay in FP32, as the
paper keeps them in higher precision.  So a replica holds 4 + 4 + 4 + 4 = 16 bytes
per parameter (params = master, grads, m, v: tests/test_fp8.py measures it).  Against
the Ultra-Scale Playbook's table of FP8 recipes (bytes per parameter: master weights,
accumulated gradients, model weights, gradients, optimizer states): the BF16 baseline
4 + 4 + 2 + 2 + 4 + 4 = 20 (16 without FP32 gradient accumulation); Transformer Engine
4 + 4 + 4 + 4 = 16 — minipar's row; DeepSeek-V3 4 + 4 + 1 + 2 + 2 + 2 = 15 (FP8
weights, BF16 gradients and moments); FP8-LM O3 9; Nanotron's FP8 10.  minipar holds
no FP8 copy of the weights: what is FP8 here is each GEMM's
*input*, made on the fly: 1 byte per element plus one FP32 scale per 1×128 tile
(activations, gradients) or 128×128 block (weights) — M·K + 4·M·⌈K/128⌉ bytes for an
(M, K) activation; the activations a layer saves for its backward stay FP32 (DeepSeek-V3
caches them in FP8), so the activation bytes are the float32 policy's.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np  # dtype names only

from minipar import checks
from minipar.backend import xp
from minipar.nn.dtypes import as_dtype
from minipar.optim import FlatParams, make


@dataclass(frozen=True)
class Policy:
    """Dtypes of one precision setting (see the module table)."""

    name: str
    param: str             # dtype names, resolved when used (bfloat16 loads ml_dtypes then)
    master: str | None     # None: the optimizer updates the params themselves
    state: str
    loss_scaling: bool = False
    fp8: bool = False      # the blocks' linear layers run FP8 GEMMs (minipar.nn.fp8)

    @property
    def param_dtype(self) -> np.dtype:
        return as_dtype(self.param)

    @property
    def master_dtype(self) -> np.dtype | None:
        return None if self.master is None else as_dtype(self.master)

    @property
    def state_dtype(self) -> np.dtype:
        return as_dtype(self.state)

    @property
    def model_dtype(self) -> str:
        """The ``dtype`` to put in ``GPTConfig`` / ``MLPConfig``."""
        return self.param


POLICIES: dict[str, Policy] = {
    "float64": Policy("float64", "float64", None, "float64"),
    "float32": Policy("float32", "float32", None, "float32"),
    "mixed": Policy("mixed", "bfloat16", "float32", "float32"),
    "mixed-fp16": Policy("mixed-fp16", "float16", "float32", "float32", loss_scaling=True),
    "fp8": Policy("fp8", "float32", None, "float32", fp8=True),
}


def get(name: str) -> Policy:
    """The policy called ``name`` (float64, float32, mixed, mixed-fp16, fp8)."""
    return POLICIES[checks.one_of("precision", name, POLICIES)]


def fp8_recipe(scaling: str, block: int, linear_layers: int) -> dict[str, Any]:
    """What ``--precision fp8`` ran, for the run summaries (``minipar run``, ``train``):
    the JSON fields ``fp8_scaling``, ``fp8_block`` (None per tensor), ``fp8_gemms_per_pass``
    (3 GEMMs — forward, input grad, weight grad — of each of the blocks'
    ``linear_layers``; a count of the model, not of calls) and ``fp8_recipe``, one line."""
    gemms = 3 * linear_layers
    if scaling == "block":
        how = (f"DeepSeek-V3 block scaling, E4M3 everywhere, 1x{block} tiles (activations, "
               f"gradients) / {block}x{block} blocks (weights), FP32 promotion every {block}")
    else:
        how = ("per-tensor current scaling (one scale per tensor, the amax of the tensor at "
               "hand), E4M3 forward, E5M2 gradients")
    line = (f"fp8: {how}; {gemms} GEMMs per forward+backward in FP8 (3 of each of the "
            f"blocks' {linear_layers} linear layers); embedding, head, LayerNorms, softmax, "
            "router in FP32; master weights, gradients and AdamW moments FP32")
    return {"fp8_scaling": scaling, "fp8_block": block if scaling == "block" else None,
            "fp8_gemms_per_pass": gemms, "fp8_recipe": line}


class DynamicLossScaler:
    """Loss scale S: backward of S·loss, grads divided by S before the update.

    On a non-finite gradient the step is skipped and S ← S·backoff; after
    ``growth_interval`` finite steps in a row S ← S·growth.
    """

    def __init__(self, scale: float = 2.0**15, growth: float = 2.0, backoff: float = 0.5,
                 growth_interval: int = 200) -> None:
        if scale <= 0 or growth <= 1 or not 0 < backoff < 1 or growth_interval < 1:
            raise ValueError("loss scaler: need scale > 0, growth > 1, 0 < backoff < 1, interval >= 1")
        self.scale, self.growth, self.backoff = float(scale), float(growth), float(backoff)
        self.growth_interval, self.good_steps, self.skipped = int(growth_interval), 0, 0

    def update(self, found_inf: bool) -> None:
        if found_inf:
            self.scale *= self.backoff
            self.good_steps = 0
            self.skipped += 1
        else:
            self.good_steps += 1
            if self.good_steps % self.growth_interval == 0:
                self.scale *= self.growth


class ModelStates:
    """The model states one rank holds: params, grads and optimizer states.

    ``params`` and ``grads`` are full flat buffers in the policy's param
    dtype (the model reads ``param_views()``); the master weights (mixed
    only) and the optimizer's moments cover the slice ``[lo, hi)`` only —
    the whole buffer serially, a 1/N shard under ZeRO.  ``step()`` updates
    that slice of ``params``; the rest is some other rank's job.

    ``params`` are the initial values at full precision (e.g. float64 from
    ``GPT(GPTConfig()).init(seed)``): the master copy is rounded from them
    and the 16-bit parameters from the master.
    """

    def __init__(self, policy: Policy | str, params: dict[str, Any], optimizer: str = "adamw",
                 lo: int = 0, hi: int | None = None, **opt_kwargs: Any) -> None:
        self.policy = get(policy) if isinstance(policy, str) else policy
        self.layout = FlatParams.like(params)
        hi = self.layout.size if hi is None else hi
        if not 0 <= lo <= hi <= self.layout.size:
            raise ValueError(f"slice [{lo}, {hi}) outside the buffer of {self.layout.size} elements")
        self.lo, self.hi = lo, hi
        pd, md = self.policy.param_dtype, self.policy.master_dtype
        # the master copy is rounded from the given (e.g. float64) values, and the
        # 16-bit params from the master, so params == round16(master) always holds
        full = self.layout.flatten(params, md or pd)
        self.params = full if md is None else full.astype(pd)
        self.master = None if md is None else full[lo:hi].copy()
        self.grads = xp.zeros(self.layout.size, dtype=pd)
        self.optimizer = make(optimizer, hi - lo, dtype=self.policy.state_dtype, **opt_kwargs)
        self.scaler = DynamicLossScaler() if self.policy.loss_scaling else None

    @property
    def loss_scale(self) -> float:
        """Multiply the loss's gradient by this before the backward (1.0 without scaling)."""
        return self.scaler.scale if self.scaler else 1.0

    def param_views(self) -> dict[str, Any]:
        """Named views of the flat parameter buffer, for ``model.loss_and_grads``."""
        return self.layout.unflatten(self.params)

    def set_grads(self, grads: dict[str, Any]) -> None:
        """Copy a dict of gradients into the flat gradient buffer (rounded to its dtype)."""
        for name, view in self.layout.unflatten(self.grads).items():
            view[...] = grads[name]

    def local_found_inf(self) -> bool:
        """Whether this rank's slice of the gradients has an inf or nan."""
        return not bool(xp.isfinite(self.grads[self.lo:self.hi]).all())

    def step(self, found_inf: bool | None = None) -> bool:
        """One optimizer step on ``[lo, hi)``; False if skipped for a non-finite gradient.

        Under loss scaling pass ``found_inf`` agreed by all ranks (or leave
        None to use this rank's own slice)."""
        lo, hi = self.lo, self.hi
        if self.master is None:
            self.optimizer.step(self.params[lo:hi], self.grads[lo:hi])
            return True
        g = self.grads[lo:hi].astype(self.policy.master_dtype)
        if self.scaler is not None:
            inf = self.local_found_inf() if found_inf is None else bool(found_inf)
            used = self.scaler.scale  # the scale these gradients were computed with
            self.scaler.update(inf)
            if inf:
                return False
            g *= 1.0 / used
        self.optimizer.step(self.master, g)
        self.params[lo:hi] = self.master.astype(self.policy.param_dtype)
        return True

    def bytes_by_category(self) -> dict[str, int]:
        """Bytes this rank holds: params, grads, optimizer states (master + moments)."""
        opt = sum(a.nbytes for a in self.optimizer.state_arrays())
        if self.master is not None:
            opt += self.master.nbytes
        return {"params": int(self.params.nbytes), "grads": int(self.grads.nbytes),
                "optimizer states": int(opt)}
