"""GPT configuration — конфигурация GPT — GPT 配置: sizes, MoE settings, dtype, and their checks.

Every inconsistent setting raises ``ValueError`` when the config is built
(d_model not divisible by n_head, top_k not 1 or 2, …), and every bad
input when it is used (``check_tokens``: ids outside [0, vocab_size),
sequences longer than ``block_size``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from minipar import checks
from minipar.nn.dtypes import check_model_dtype


@dataclass(frozen=True)
class GPTConfig:
    """Sizes of a GPT.  ``d_ff`` = 0 means 4·d_model.

    MoE: ``n_experts`` > 0 replaces the MLP of every ``moe_every``-th block
    (blocks i with (i + 1) % moe_every == 0, so ``moe_every=2`` gives
    blocks 1, 3, … as in Switch / GShard) by a router and ``n_experts``
    expert MLPs, top-``top_k`` routing (1 or 2), expert capacity factor
    ``capacity_factor`` and auxiliary loss weight ``aux_loss_coef`` (α).
    ``dtype``: storage dtype of parameters and activations.  ``n_kv_head``: key/value
    heads of grouped-query attention, dividing ``n_head`` (0 means ``n_head``: multi-head
    attention; 1: multi-query).
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
    n_kv_head: int = 0

    def __post_init__(self) -> None:
        for name in ("vocab_size", "block_size", "n_layer", "n_head", "d_model"):
            checks.integer(f"GPTConfig.{name}", getattr(self, name), 1)
        checks.divides("n_head", self.n_head, "d_model", self.d_model,
                       "each head needs d_model / n_head columns")
        checks.integer("n_kv_head", self.n_kv_head, 0, why="0 means n_head")
        if self.n_kv_head == 0:
            object.__setattr__(self, "n_kv_head", self.n_head)
        checks.divides("n_kv_head", self.n_kv_head, "n_head", self.n_head,
                       "each key/value head serves n_head / n_kv_head query heads")
        checks.integer("d_ff", self.d_ff, 0, why="0 means 4*d_model")
        if self.d_ff == 0:
            object.__setattr__(self, "d_ff", 4 * self.d_model)
        checks.integer("n_experts", self.n_experts, 0)
        if self.n_experts:
            checks.integer("top_k", self.top_k, 1, 2, why="1: Switch, 2: GShard")
            if self.top_k > self.n_experts:
                raise ValueError(f"top_k={self.top_k} exceeds n_experts={self.n_experts}")
            checks.real("capacity_factor", self.capacity_factor, greater_than=0)
            checks.integer("moe_every", self.moe_every, 1, self.n_layer,
                           why=f"n_layer = {self.n_layer}")
            checks.real("aux_loss_coef", self.aux_loss_coef, at_least=0)
        check_model_dtype(self.dtype)
        checks.real("init_std", self.init_std, greater_than=0)

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
