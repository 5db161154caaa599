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

import functools
from collections.abc import Callable
from dataclasses import asdict, dataclass, fields, replace
from typing import Any

import numpy as np

from minipar import checks, spans
from minipar.backend import to_host
from minipar.data import synthetic, text, tokenizer
from minipar.nn import GPT, GPTConfig
from minipar.nn.gpt import param_shapes
from minipar.nn.gpt_config import check_moe
from minipar.parallel.engine import Batch
from minipar.parallel.engine import build as engine_build
from minipar.parallel.parity import PARITY_ATOL, PARITY_RTOL  # noqa: F401 (tests' bounds)
from minipar.nn import fp8
from minipar.nn.fp8 import SCALINGS
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

    Task: the modular-sum sequences of :mod:`minipar.data.synthetic` (``batch`` rows of
    ``seq`` tokens, vocabulary ``vocab``, data seed ``data_seed``), or, with ``text``,
    windows of a UTF-8 text read as bytes (:mod:`minipar.data.text`: vocabulary 256;
    ``text = EMBEDDED`` is the corpus shipped in the package); model: a
    GPT, dense (``experts = 0``) or with a mixture of ``experts`` experts in
    every block (top-``top_k`` routing, ``capacity_factor``, auxiliary loss weight
    ``aux_loss_coef``); optimizer: AdamW (``betas``, ``eps``, ``weight_decay``)
    or SGD over the flat buffer.  Every field is checked when the spec is
    built, and a bad one is named as the command line spells it
    (``--lr must be > 0, got 0.0``): ``minipar run`` builds the spec in the
    launching process, before MPI starts, so these sentences are what a user sees
    (a missing, binary or too-short ``--text`` file included).
    """

    vocab: int = 10
    seq: int = 8
    d_model: int = 16
    layers: int = 2
    heads: int = 2
    #: key/value heads of grouped-query attention (0: as many as ``heads``; 1: multi-query)
    kv_heads: int = 0
    batch: int = 10
    steps: int = 3
    seed: int = 0
    data_seed: int = 0
    lr: float = 1e-2
    weight_decay: float = 0.01
    optimizer: str = "adamw"
    precision: str = "float64"
    #: ``--precision fp8``'s recipe (:mod:`minipar.nn.fp8`): block | tensor, and the tile
    fp8_scaling: str = "block"
    fp8_block: int = 128
    experts: int = 0
    top_k: int = 1
    capacity_factor: float | None = 1.25
    aux_loss_coef: float = 0.01
    #: DeepSeek-V3's experts (:mod:`minipar.nn.moe_routing`): shared experts, the routed
    #: experts' width (0: 4·d), the router's scores, the balancing, node-limited groups
    shared_experts: int = 0
    expert_width: int = 0
    router: str = "softmax"
    load_balance: str = "aux"
    bias_update_rate: float = 1e-3
    seq_aux_loss_coef: float = 0.0
    expert_groups: int = 1
    groups_per_token: int = 1
    betas: tuple[float, float] = (0.9, 0.999)
    eps: float = 1e-8
    #: None: the modular-sum task; :data:`EMBEDDED`: the package's own text; else a UTF-8 file
    text: str | None = None
    #: the MoE routing groups of a layout (:func:`minipar.parallel.engine.routing_spans`):
    #: ``(dp,)`` for data-parallel ranks, ``(dp, m)`` with micro-batches; () = one group
    routing: tuple[int, ...] = ()

    def __post_init__(self) -> None:
        for name in ("vocab", "seq"):  # the modular-sum task needs two tokens and two values
            checks.integer(_option(name), getattr(self, name), 2)
        for name in ("d_model", "layers", "heads", "batch", "steps", "top_k"):
            checks.integer(_option(name), getattr(self, name), 1)
        for name in ("seed", "data_seed", "experts", "kv_heads"):
            checks.integer(_option(name), getattr(self, name), 0)
        checks.divides("--heads", self.heads, "--d-model", self.d_model,
                       "each head takes d_model / heads columns")
        if self.kv_heads and self.heads % self.kv_heads:
            ok = ", ".join(str(k) for k in range(1, self.heads + 1) if self.heads % k == 0)
            raise ValueError(f"--kv-heads {self.kv_heads} does not divide --heads {self.heads}: "
                             f"each key/value head serves heads / kv-heads query heads; use one "
                             f"of {ok}")
        checks.one_of("--precision", self.precision, POLICIES)
        checks.one_of("--fp8-scaling", self.fp8_scaling, SCALINGS)
        checks.integer("--fp8-block", self.fp8_block, 1)
        if get_policy(self.precision).fp8 and self.optimizer != "adamw":
            raise ValueError(f"--precision fp8 trains with --optimizer adamw (its FP32 master "
                             f"weights and moments), not {self.optimizer}")
        checks.one_of("--optimizer", self.optimizer, ("adamw", "sgd"))
        checks.real("--lr", self.lr, greater_than=0)
        checks.real("--weight-decay", self.weight_decay, at_least=0)
        if self.experts == 0 and self.top_k != 1:
            raise ValueError(f"--top-k {self.top_k} needs a mixture of experts: give --experts too "
                             "(a dense model routes nothing)")
        if self.experts:
            check_moe(self.experts, self.top_k, self.router, self.load_balance,
                      self.bias_update_rate, self.expert_groups, self.groups_per_token)
        for name in ("shared_experts", "expert_width"):
            checks.integer(_option(name), getattr(self, name), 0)
        if self.capacity_factor is not None:
            checks.real("--capacity-factor", self.capacity_factor, greater_than=0)
        checks.real("--aux-loss-coef", self.aux_loss_coef, at_least=0)
        checks.real("--seq-aux-loss-coef", self.seq_aux_loss_coef, at_least=0)
        if isinstance(self.betas, list):  # through JSON
            object.__setattr__(self, "betas", tuple(self.betas))
        if (not isinstance(self.betas, tuple) or len(self.betas) != 2
                or not all(checks.is_real(b) and 0 <= b < 1 for b in self.betas)):
            raise ValueError(f"--betas must be two numbers in [0, 1), got {self.betas!r}")
        checks.real("--eps", self.eps, greater_than=0)
        if self.text is not None:
            if self.vocab != tokenizer.VOCAB_SIZE:
                raise ValueError(f"--vocab is {tokenizer.VOCAB_SIZE} with --text (a token is "
                                 f"a byte of UTF-8), got {self.vocab}")
            self.text_data().check_length(self.seq)
        if isinstance(self.routing, list):  # a spec that went through JSON (as_dict)
            object.__setattr__(self, "routing", tuple(self.routing))
        if not isinstance(self.routing, tuple) or any(
                not checks.is_integer(g) or g < 1 for g in self.routing):
            raise ValueError(f"routing groups must be a tuple of positive integers, "
                             f"got {self.routing!r}")
        cfg = self.config()  # anything GPTConfig still refuses
        if get_policy(self.precision).fp8 and self.fp8_scaling == "block":
            longest = max(cfg.block_size, *(n for k, s in param_shapes(cfg).items()
                                            if ".w_" in k for n in s))  # blocks' linears
            checks.integer("--fp8-block", self.fp8_block, 1, max(128, longest),
                           why=f"the default 128 or the longest dimension a GEMM cuts, {longest} "
                           f"here: a longer tile cuts nothing more")

    @classmethod
    def from_options(cls, options: dict[str, Any]) -> RunSpec:
        """The spec from ``minipar run`` options (keys named like the fields, ``-`` as ``_``)."""
        names = {f.name for f in fields(cls)}
        kw = {k: v for k, v in options.items() if k in names and v is not None}
        if kw.get("capacity_factor") == "none":  # dropless
            kw["capacity_factor"] = None
        return cls(**kw)

    def config(self, dtype: str | None = None) -> GPTConfig:
        return GPTConfig(vocab_size=self.vocab, block_size=self.seq, n_layer=self.layers,
                         n_head=self.heads, n_kv_head=self.kv_heads, d_model=self.d_model,
                         n_experts=self.experts,
                         top_k=self.top_k, capacity_factor=self.capacity_factor,
                         aux_loss_coef=self.aux_loss_coef, shared_experts=self.shared_experts,
                         expert_width=self.expert_width, router=self.router,
                         load_balance=self.load_balance,
                         bias_update_rate=self.bias_update_rate,
                         seq_aux_loss_coef=self.seq_aux_loss_coef,
                         expert_groups=self.expert_groups,
                         groups_per_token=self.groups_per_token,
                         dtype=dtype or get_policy(self.precision).model_dtype,
                         fp8=self.fp8_scaling if get_policy(self.precision).fp8 and dtype is None
                         else "", fp8_block=self.fp8_block)

    def model(self) -> GPT:
        """The GPT in the precision's parameter dtype."""
        return GPT(self.config())

    def initial_params(self) -> dict[str, Any]:
        """The float64 initial parameters, as ``minipar.train.train`` draws them."""
        return GPT(self.config("float64")).init(self.seed)

    def opt_kwargs(self) -> dict[str, Any]:
        kw: dict[str, Any] = {"lr": self.lr}
        if self.optimizer == "adamw" or self.weight_decay:
            kw["weight_decay"] = self.weight_decay
        if self.optimizer == "adamw" and (self.betas, self.eps) != ((0.9, 0.999), 1e-8):
            kw.update(betas=self.betas, eps=self.eps)
        return kw

    def text_data(self) -> text.TextData:
        """The text of a ``text`` run (read once per process)."""
        return _text_data(self.text, self.data_seed)

    def describe_data(self) -> dict[str, Any]:
        """What a checkpoint records of the data, so that a resume sees the same batches:
        the task (the text's name, size and SHA-256), the global batch, the sequence
        length, the data seed, the tokenizer."""
        out: dict[str, Any] = {"batch": self.batch, "seq": self.seq, "data_seed": self.data_seed}
        if self.text is None:
            return {"task": "modular_sum", **out}
        return {"task": "text", **out, **self.text_data().as_dict()}

    def global_batch(self, step: int, lo: int = 0, hi: int | None = None) -> tuple[Any, Any]:
        """(tokens, targets): rows ``[lo, hi)`` of the global batch of ``step``."""
        if self.text is not None:
            return self.text_data().batch(step, self.batch, self.seq, lo, hi)
        return synthetic.modular_sum(self.data_seed, step, self.batch, self.seq, self.vocab,
                                     lo, hi)

    def eval_batch_at(self, k: int) -> Batch:
        """Validation batch ``k``: the text's held-out split, or for the modular-sum task
        batches of steps no training run reaches (10⁹ + k)."""
        if self.text is not None:
            tokens, targets = self.text_data().batch(k, self.batch, self.seq, split="validation")
        else:
            tokens, targets = synthetic.modular_sum(self.data_seed, VALIDATION_STEP + k,
                                                    self.batch, self.seq, self.vocab)
        return Batch(k, tokens, targets)

    def batch_at(self, step: int) -> Batch:
        """The global :class:`~minipar.parallel.engine.Batch` of ``step`` (a loop's source)."""
        return Batch(step, *self.global_batch(step))

    def local_batch(self, step: int, rank: int, world: int) -> tuple[Any, Any]:
        """(tokens, targets): rank ``rank``'s rows of the global batch of ``step``."""
        lo, hi = local_rows(self.batch, rank, world)
        return self.global_batch(step, lo, hi)

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)

    def with_(self, **changes: Any) -> RunSpec:
        return replace(self, **changes)


#: ``RunSpec.text`` for the corpus shipped in the package (:mod:`minipar.data.corpus`)
EMBEDDED = "<embedded>"
#: the modular-sum task's validation batches are those of steps 10⁹ + k
VALIDATION_STEP = 10**9


@functools.lru_cache(maxsize=4)
def _text_data(path: str | None, seed: int) -> text.TextData:
    return text.load(None if path == EMBEDDED else path, seed)


#: FP8's amax all-reduces (MAX): tiles or blocks that ranks share, per-tensor over the rows
OP_FP8_AMAX = "fp8_amax"


def fp8_rows(spec: RunSpec, comm: Any) -> Any:
    """The context a data-parallel step runs in: under ``--fp8-scaling tensor`` (a dense
    model) every activation's and gradient's amax all-reduced (MAX, op ``fp8_amax``)
    over ``comm``, the ranks that split the batch's rows or tokens (dp, dp·cp:
    :func:`minipar.nn.fp8.rows`; a tp slice's own reduce is its ``fp8.Split``'s), so they
    scale as the serial run scales the whole batch; otherwise (or alone) no change."""
    if not (get_policy(spec.precision).fp8 and spec.fp8_scaling == "tensor"
            and not spec.experts and comm is not None and comm.Get_size() > 1):
        return fp8.rows(None)

    from minipar.collectives import allreduce  # here: an exercise's grader watches imports

    def reduce_max(a: Any) -> Any:
        with comm.operation(OP_FP8_AMAX):
            return allreduce(comm, a, "max", "ring")
    return fp8.rows(reduce_max)


def _option(name: str) -> str:
    return "--" + name.replace("_", "-")


def serial_reference(spec: RunSpec, world: int = 1,
                     load: Callable[[Any], int] | None = None) -> dict[str, Any]:
    """The serial oracle: the serial engine (:class:`minipar.parallel.engine.SerialEngine`)
    trained on the same global batches.

    ``world``: the data-parallel ranks of the run it is compared with.  A
    dense model's oracle is the full batch.  A mixture of experts routes the
    tokens of one forward call as one group (capacity and aux loss are per
    group, :mod:`minipar.nn.moe`), and a rank's group is its own rows, so its
    oracle accumulates ``world`` micro-batches cut like the ranks' rows
    (routing groups ``(world,)``, or ``spec.routing`` when the spec names them).
    ``load(engine) -> step``: a resumed run's oracle is the serial engine loaded from
    the same checkpoint (e.g. ``minipar.parallel.checkpoint.load``), stepped from its
    step to ``spec.steps``.
    Returns ``{"losses": [float] (from the start), "params": flat array (param dtype),
    "states": ModelStates, "start": step, "initial": flat params at the start (float64)}``.
    """
    check_world(spec.batch, world)
    routing = spec.routing or ((world,) if spec.experts and world > 1 else ())
    eng = engine_build(spec, routing=routing if spec.experts else ())
    start = 0 if load is None else int(load(eng))
    initial = eng.states.params.astype(np.float64)
    losses = [eng.step(spec.batch_at(s)).loss for s in range(start, spec.steps)]
    return {"losses": losses, "params": eng.states.params, "states": eng.states,
            "start": start, "initial": initial}


def max_abs_diff(a: Any, b: Any) -> float:
    """max |a - b| in float64 (0.0 for empty arrays), on the host."""
    a64, b64 = to_host(a).astype(np.float64), to_host(b).astype(np.float64)
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
