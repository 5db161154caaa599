"""GPT configuration — конфигурация GPT — GPT 配置: sizes, MoE settings, dtype, and their checks.

Every inconsistent setting raises ``ValueError`` when the config is built
(d_model not divisible by n_head, top_k not 1 or 2, …), and every bad
input when it is used (``check_tokens``: ids outside [0, vocab_size),
sequences longer than ``block_size``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np  # dtype names only

from minipar.nn.dtypes import check_model_dtype


@dataclass(frozen=True)
class GPTConfig:
    """Sizes of a GPT.  ``d_ff`` = 0 means 4·d_model.

    MoE: ``n_experts`` > 0 replaces the MLP of every ``moe_every``-th block
    (blocks i with (i + 1) % moe_every == 0, so ``moe_every=2`` gives
    blocks 1, 3, … as in Switch / GShard) by a router and ``n_experts``
    expert MLPs, top-``top_k`` routing (1 or 2), expert capacity factor
    ``capacity_factor`` and auxiliary loss weight ``aux_loss_coef`` (α).
    ``dtype``: storage dtype of parameters and activations.
    """

    vocab_size: int = 16
    block_size: int = 32
    n_layer: int = 2
    n_head: int = 2
    d_model: int = 32
    d_ff: int = 0
    n_experts: int = 0
    top_k: int = 1
    capacity_factor: float = 1.25
    moe_every: int = 1
    aux_loss_coef: float = 0.01
    init_std: float = 0.02
    dtype: str = "float64"

    def __post_init__(self) -> None:
        for name in ("vocab_size", "block_size", "n_layer", "n_head", "d_model"):
            v = getattr(self, name)
            if not isinstance(v, (int, np.integer)) or isinstance(v, bool) or v < 1:
                raise ValueError(f"GPTConfig.{name} must be a positive integer, got {v!r}")
        if self.d_model % self.n_head:
            raise ValueError(
                f"d_model={self.d_model} is not divisible by n_head={self.n_head}: "
                "each head needs d_model / n_head columns"
            )
        if self.d_ff < 0:
            raise ValueError(f"d_ff must be >= 0 (0 means 4*d_model), got {self.d_ff}")
        if self.d_ff == 0:
            object.__setattr__(self, "d_ff", 4 * self.d_model)
        if self.n_experts < 0:
            raise ValueError(f"n_experts must be >= 0, got {self.n_experts}")
        if self.n_experts:
            if self.top_k not in (1, 2):
                raise ValueError(f"top_k must be 1 (Switch) or 2 (GShard), got {self.top_k}")
            if self.top_k > self.n_experts:
                raise ValueError(f"top_k={self.top_k} exceeds n_experts={self.n_experts}")
            if not self.capacity_factor > 0:
                raise ValueError(f"capacity_factor must be > 0, got {self.capacity_factor}")
            if self.moe_every < 1 or self.moe_every > self.n_layer:
                raise ValueError(
                    f"moe_every={self.moe_every} must lie in [1, n_layer={self.n_layer}]"
                )
            if self.aux_loss_coef < 0:
                raise ValueError(f"aux_loss_coef must be >= 0, got {self.aux_loss_coef}")
        check_model_dtype(self.dtype)
        if not self.init_std > 0:
            raise ValueError(f"init_std must be > 0, got {self.init_std}")

    def is_moe_block(self, i: int) -> bool:
        """Whether block ``i`` has a mixture of experts instead of an MLP."""
        return self.n_experts > 0 and (i + 1) % self.moe_every == 0

    def check_tokens(self, tokens: Any, pos_offset: int = 0, what: str = "tokens") -> None:
        """ValueError unless ``tokens`` is an integer (B, T) array of ids in
        [0, vocab_size) with pos_offset + T <= block_size."""
        if getattr(tokens, "ndim", None) != 2:
            raise ValueError(f"{what} must be a 2-D (batch, time) array, got {getattr(tokens, 'shape', type(tokens))}")
        if tokens.dtype.kind not in "iu":
            raise ValueError(f"{what} must be integer ids, got dtype {tokens.dtype}")
        t = tokens.shape[1]
        if pos_offset < 0 or pos_offset + t > self.block_size:
            raise ValueError(
                f"sequence positions {pos_offset}..{pos_offset + t - 1} exceed the position "
                f"table (block_size={self.block_size})"
            )
        if tokens.size and (int(tokens.min()) < 0 or int(tokens.max()) >= self.vocab_size):
            raise ValueError(
                f"{what} ids must lie in [0, vocab_size={self.vocab_size}); got "
                f"min {int(tokens.min())}, max {int(tokens.max())}"
            )
