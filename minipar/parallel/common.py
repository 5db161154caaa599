"""What every data-parallel strategy shares — общие части параллельных стратегий — 并行策略的公共部分.

Data parallelism (DDP), the parameter server and ZeRO all do the same three
things around their own communication, and do them here, once:

1. **Split the global batch by rows.**  Rank r of N takes rows
   ``[lo_r, hi_r)`` of the global batch of B rows by the ``numpy.array_split``
   rule (the first B mod N ranks get one row more): :func:`local_rows`.
2. **Weight the local loss so that the sum over ranks is the serial mean.**
   The loss is the mean cross-entropy over all B·T tokens.  Rank r computes
   the mean over its own b_r·T tokens, ℓ_r; then

       ℓ = Σ_r (b_r / B) · ℓ_r        and   ∇ℓ = Σ_r (b_r / B) · ∇ℓ_r

   exactly (in real arithmetic), also for uneven slices (B = 10 on 3 ranks:
   4, 3, 3 rows).  So each rank multiplies its loss and its gradients by
   w_r = b_r / B (:func:`loss_weight`) and the strategy *sums* over ranks.
   With even slices w_r = 1/N: "average the gradients".  Only the order of
   the additions differs from the serial run, so float64 results agree to
   ~1e-15 relative, not bit for bit.
3. **Compare with the serial oracle.**  :func:`serial_reference` trains the
   same model on the same global batches with :func:`minipar.train.train`;
   :func:`parity` is the one tolerance every strategy's test uses.

:class:`RunSpec` holds the model, task and optimizer settings of a run
(``minipar run`` options go through :meth:`RunSpec.from_options`).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, fields, replace
from typing import Any

import numpy as np

from minipar import checks, data, spans
from minipar.nn import GPT, GPTConfig
from minipar.parallel.engine import Batch
from minipar.parallel.engine import build as engine_build
from minipar.parallel.parity import PARITY_ATOL, PARITY_RTOL  # noqa: F401 (tests' bounds)
from minipar.precision import POLICIES
from minipar.precision import get as get_policy


def local_rows(batch_size: int, rank: int, world: int) -> tuple[int, int]:
    """Rows ``[lo, hi)`` of a global batch of ``batch_size`` rows that rank ``rank`` of
    ``world`` takes: ``numpy.array_split`` order (:func:`minipar.spans.span`), the first
    ``batch_size % world`` ranks get one row more."""
    check_world(batch_size, world)
    if not 0 <= rank < world:
        raise ValueError(f"rank {rank} is outside 0..{world - 1}")
    return spans.span(batch_size, world, rank)


def loss_weight(batch_size: int, rank: int, world: int) -> float:
    """w_r = b_r / B: multiply rank r's mean loss and gradients by this, then sum over
    ranks, and the result is the mean over the whole global batch (a Python float)."""
    lo, hi = local_rows(batch_size, rank, world)
    return (hi - lo) / batch_size


def check_world(batch_size: int, world: int) -> None:
    """ValueError unless every one of ``world`` ranks gets at least one row."""
    checks.integer("the number of data-parallel ranks", world, 1)
    if batch_size < world:
        raise ValueError(
            f"{world} data-parallel ranks but the global batch has only {batch_size} rows: "
            f"every rank needs at least one row; use --batch >= {world} or fewer ranks")


@dataclass(frozen=True)
class RunSpec:
    """Model, task and optimizer of a parallel run (and of its serial oracle).

    Task: the modular-sum sequences of :mod:`minipar.data` (``batch`` rows of
    ``seq`` tokens, vocabulary ``vocab``, data seed ``data_seed``); model: a
    GPT, dense (``experts = 0``) or with a mixture of ``experts`` experts in
    every block (top-``top_k`` routing, ``capacity_factor``); optimizer: AdamW
    (or SGD) over the flat buffer.  Every field is checked when the spec is
    built, and a bad one is named as the command line spells it
    (``--lr must be > 0, got 0.0``): ``minipar run`` builds the spec in the
    launching process, before MPI starts, so these sentences are what a user sees.
    """

    vocab: int = 10
    seq: int = 8
    d_model: int = 16
    layers: int = 2
    heads: int = 2
    batch: int = 10
    steps: int = 3
    seed: int = 0
    data_seed: int = 0
    lr: float = 1e-2
    weight_decay: float = 0.01
    optimizer: str = "adamw"
    precision: str = "float64"
    experts: int = 0
    top_k: int = 1
    capacity_factor: float = 1.25
    #: the MoE routing groups of a layout (:func:`minipar.parallel.engine.routing_spans`):
    #: ``(dp,)`` for data-parallel ranks, ``(dp, m)`` with micro-batches; () = one group
    routing: tuple[int, ...] = ()

    def __post_init__(self) -> None:
        for name in ("vocab", "seq"):  # the modular-sum task needs two tokens and two values
            checks.integer(_option(name), getattr(self, name), 2)
        for name in ("d_model", "layers", "heads", "batch", "steps", "top_k"):
            checks.integer(_option(name), getattr(self, name), 1)
        for name in ("seed", "data_seed", "experts"):
            checks.integer(_option(name), getattr(self, name), 0)
        checks.divides("--heads", self.heads, "--d-model", self.d_model,
                       "each head takes d_model / heads columns")
        checks.one_of("--precision", self.precision, POLICIES)
        checks.one_of("--optimizer", self.optimizer, ("adamw", "sgd"))
        checks.real("--lr", self.lr, greater_than=0)
        checks.real("--weight-decay", self.weight_decay, at_least=0)
        if self.experts == 0 and self.top_k != 1:
            raise ValueError(f"--top-k {self.top_k} needs a mixture of experts: give --experts too "
                             "(a dense model routes nothing)")
        if self.experts and self.top_k > min(2, self.experts):
            allowed = "1 (Switch) or 2 (GShard)" if self.experts > 1 else "1 (Switch)"
            raise ValueError(f"--top-k must be {allowed} with --experts {self.experts}, "
                             f"got {self.top_k}")
        checks.real("--capacity-factor", self.capacity_factor, greater_than=0)
        if isinstance(self.routing, list):  # a spec that went through JSON (as_dict)
            object.__setattr__(self, "routing", tuple(self.routing))
        if not isinstance(self.routing, tuple) or any(
                not checks.is_integer(g) or g < 1 for g in self.routing):
            raise ValueError(f"routing groups must be a tuple of positive integers, "
                             f"got {self.routing!r}")
        self.config()  # anything GPTConfig still refuses

    @classmethod
    def from_options(cls, options: dict[str, Any]) -> RunSpec:
        """The spec from ``minipar run`` options (keys named like the fields, ``-`` as ``_``)."""
        names = {f.name for f in fields(cls)}
        return cls(**{k: v for k, v in options.items() if k in names and v is not None})

    def config(self, dtype: str | None = None) -> GPTConfig:
        return GPTConfig(vocab_size=self.vocab, block_size=self.seq, n_layer=self.layers,
                         n_head=self.heads, d_model=self.d_model, n_experts=self.experts,
                         top_k=self.top_k, capacity_factor=self.capacity_factor,
                         dtype=dtype or get_policy(self.precision).model_dtype)

    def model(self) -> GPT:
        """The GPT in the precision's parameter dtype."""
        return GPT(self.config())

    def initial_params(self) -> dict[str, Any]:
        """The float64 initial parameters, as ``minipar.train.train`` draws them."""
        return GPT(self.config("float64")).init(self.seed)

    def opt_kwargs(self) -> dict[str, float]:
        kw = {"lr": self.lr}
        if self.optimizer == "adamw" or self.weight_decay:
            kw["weight_decay"] = self.weight_decay
        return kw

    def global_batch(self, step: int) -> tuple[Any, Any]:
        """(tokens, targets) of the whole global batch of ``step``."""
        return data.modular_sum(self.data_seed, step, self.batch, self.seq, self.vocab)

    def batch_at(self, step: int) -> Batch:
        """The global :class:`~minipar.parallel.engine.Batch` of ``step`` (a loop's source)."""
        return Batch(step, *self.global_batch(step))

    def local_batch(self, step: int, rank: int, world: int) -> tuple[Any, Any]:
        """(tokens, targets): rank ``rank``'s rows of the global batch of ``step``."""
        lo, hi = local_rows(self.batch, rank, world)
        return data.modular_sum(self.data_seed, step, self.batch, self.seq, self.vocab, lo, hi)

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)

    def with_(self, **changes: Any) -> RunSpec:
        return replace(self, **changes)


def _option(name: str) -> str:
    return "--" + name.replace("_", "-")


def serial_reference(spec: RunSpec, world: int = 1) -> dict[str, Any]:
    """The serial oracle: the serial engine (:class:`minipar.parallel.engine.SerialEngine`)
    trained on the same global batches.

    ``world``: the data-parallel ranks of the run it is compared with.  A
    dense model's oracle is the full batch.  A mixture of experts routes the
    tokens of one forward call as one group (capacity and aux loss are per
    group, :mod:`minipar.nn.moe`), and a rank's group is its own rows, so its
    oracle accumulates ``world`` micro-batches cut like the ranks' rows
    (routing groups ``(world,)``, or ``spec.routing`` when the spec names them).
    Returns ``{"losses": [float], "params": flat array (param dtype), "states": ModelStates}``.
    """
    check_world(spec.batch, world)
    routing = spec.routing or ((world,) if spec.experts and world > 1 else ())
    eng = engine_build(spec, routing=routing if spec.experts else ())
    losses = [eng.step(spec.batch_at(s)).loss for s in range(spec.steps)]
    return {"losses": losses, "params": eng.states.params, "states": eng.states}


def max_abs_diff(a: Any, b: Any) -> float:
    """max |a - b| in float64 (0.0 for empty arrays)."""
    a64, b64 = np.asarray(a, dtype=np.float64), np.asarray(b, dtype=np.float64)
    return float(np.abs(a64 - b64).max()) if a64.size else 0.0


def parity(losses: Any, serial_losses: Any, params: Any, serial_params: Any,
           initial_params: Any = None) -> bool:
    """True when :func:`minipar.parallel.parity.compare` says "equal" (the one tolerance)."""
    from minipar.parallel.parity import compare

    return compare(losses, serial_losses, params, serial_params, initial_params).status == "equal"


def found_inf(comm: Any, states: Any, algorithm: str = "auto") -> bool | None:
    """Under loss scaling, whether any rank of ``comm`` found an inf or nan in the gradients
    it holds (:meth:`~minipar.precision.ModelStates.local_found_inf`): one all-reduce of a
    0/1 flag (any ``algorithm``), counted as ``"found_inf"``, so that every rank skips the step alike (the
    scaler's rule, :class:`~minipar.precision.DynamicLossScaler`).  None without a scaler:
    nothing to agree on, the step is taken (``ModelStates.step(found_inf=None)``)."""
    if states.scaler is None:
        return None
    from minipar.collectives import allreduce

    with comm.operation("found_inf"):
        flag = allreduce(comm, np.array([float(states.local_found_inf())]), "sum", algorithm)
    return bool(flag[0] > 0)
