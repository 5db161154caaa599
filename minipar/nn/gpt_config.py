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
from minipar.nn.fp8 import SCALINGS, Recipe


ROUTERS = ("softmax", "sigmoid")
LOAD_BALANCE = ("aux", "loss-free", "none")


def check_moe(experts: int, top_k: Any, router: Any, load_balance: Any, bias_update_rate: Any,
              groups: Any, per_token: Any, names: dict[str, str] | None = None) -> None:
    """ValueError (one line, the option named as ``names`` spells it, default the command
    line's) unless the routing options fit ``experts`` E: 1 <= top-k <= the experts of M
    groups, sigmoid with top-k >= 2, a bias rate > 0, G dividing E, 1 <= M <= G."""
    n = {"top_k": "--top-k", "router": "--router", "load_balance": "--load-balance",
         "rate": "--bias-update-rate", "groups": "--expert-groups",
         "per_token": "--groups-per-token", "experts": "--experts", **(names or {})}
    checks.one_of(n["router"], router, ROUTERS)
    checks.one_of(n["load_balance"], load_balance, LOAD_BALANCE)
    checks.real(n["rate"], bias_update_rate, greater_than=0)
    checks.integer(n["groups"], groups, 1)
    checks.divides(n["groups"], groups, n["experts"], experts,
                   "each group holds E/G experts (node-limited routing)")
    checks.integer(n["per_token"], per_token, 1, groups, why=f"{n['groups']} {groups}")
    reach = per_token * experts // groups
    checks.integer(n["top_k"], top_k, 1)
    if top_k > reach:
        where = (f"the {reach} experts of {n['per_token']} {per_token} groups"
                 if reach < experts else f"{n['experts']} {experts}")
        raise ValueError(f"{n['top_k']} {top_k} exceeds {where}: a token takes at most "
                         "that many experts")
    if router == "sigmoid" and top_k == 1:
        raise ValueError(f"{n['router']} sigmoid needs {n['top_k']} >= 2: its gate is the "
                         "chosen score over the chosen scores' sum, always 1 for one expert, "
                         "so the loss would give the router no gradient (or use "
                         f"{n['router']} softmax)")


@dataclass(frozen=True)
class GPTConfig:
    """Sizes of a GPT.  ``d_ff`` = 0 means 4·d_model.

    MoE: ``n_experts`` > 0 replaces the MLP of every ``moe_every``-th block
    (blocks i with (i + 1) % moe_every == 0, so ``moe_every=2`` gives
    blocks 1, 3, … as in Switch / GShard) by a router and ``n_experts``
    expert MLPs of width ``expert_width`` (0: d_ff), top-``top_k`` routing, expert
    capacity factor ``capacity_factor`` (None: dropless) and auxiliary loss weight
    ``aux_loss_coef`` (α); DeepSeek-V3's options (:mod:`minipar.nn.moe_routing`):
    ``shared_experts`` S, ``router`` softmax|sigmoid, ``load_balance``
    aux|loss-free|none with ``bias_update_rate`` u, ``seq_aux_loss_coef``, and
    node-limited routing over ``expert_groups`` G, ``groups_per_token`` M.
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
    capacity_factor: float | None = 1.25
    moe_every: int = 1
    aux_loss_coef: float = 0.01
    shared_experts: int = 0
    expert_width: int = 0
    router: str = "softmax"
    load_balance: str = "aux"
    bias_update_rate: float = 1e-3
    seq_aux_loss_coef: float = 0.0
    expert_groups: int = 1
    groups_per_token: int = 1
    init_std: float = 0.02
    dtype: str = "float64"
    n_kv_head: int = 0
    #: FP8 GEMMs in the blocks' linear layers (:mod:`minipar.nn.fp8`): "" none, "block"
    #: (DeepSeek-V3's tiles and blocks of ``fp8_block``) or "tensor" (one scale per tensor)
    fp8: str = ""
    fp8_block: int = 128

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
        checks.integer("expert_width", self.expert_width, 0, why="0 means d_ff")
        if self.expert_width == 0:
            object.__setattr__(self, "expert_width", self.d_ff)
        if self.n_experts:
            check_moe(self.n_experts, self.top_k, self.router, self.load_balance,
                      self.bias_update_rate, self.expert_groups, self.groups_per_token,
                      {k: k for k in ("top_k", "router", "load_balance")}
                      | {"rate": "bias_update_rate", "groups": "expert_groups",
                         "per_token": "groups_per_token", "experts": "n_experts"})
            checks.integer("shared_experts", self.shared_experts, 0)
            checks.real("seq_aux_loss_coef", self.seq_aux_loss_coef, at_least=0)
            if self.capacity_factor is not None:
                checks.real("capacity_factor", self.capacity_factor, greater_than=0)
            checks.integer("moe_every", self.moe_every, 1, self.n_layer,
                           why=f"n_layer = {self.n_layer}")
            checks.real("aux_loss_coef", self.aux_loss_coef, at_least=0)
        check_model_dtype(self.dtype)
        checks.one_of("fp8", self.fp8, ("", *SCALINGS))
        checks.integer("fp8_block", self.fp8_block, 1)
        checks.real("init_std", self.init_std, greater_than=0)

    def fp8_recipe(self) -> Recipe | None:
        """The FP8 recipe of the blocks' GEMMs (None: they run in ``dtype``)."""
        return Recipe(self.fp8, self.fp8_block) if self.fp8 else None

    def moe_options(self) -> dict[str, Any]:
        """The keywords :func:`minipar.nn.moe.moe_forward` (after n_experts, top_k) and
        :func:`minipar.nn.moe_steps.dispatch_forward` take from this config: the Switch
        loss only with ``load_balance`` aux."""
        return {"capacity_factor": self.capacity_factor,
                "aux_loss_coef": self.aux_loss_coef if self.load_balance == "aux" else 0.0,
                "scoring": self.router, "groups": (self.expert_groups, self.groups_per_token),
                "seq_aux_loss_coef": self.seq_aux_loss_coef}

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
